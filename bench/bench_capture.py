"""Capture speed: ``dblog capture`` of one table against a plain Spark JDBC dump of it.

Creates a table of ``--rows`` rows (ten columns of several types, ~150 bytes/row, generated on
the server), then, in one process and on one SparkSession, for each variant (an idle source in
a JVM that has done only a small warm-up, as in a fresh ``dblog capture`` process; the same
again in the JVM warm from it; and writers at ``--writers-tps`` single-row transactions/s on
the same table):

* baseline: ``spark.read.jdbc`` of the whole table (``--baseline-partitions`` JDBC partitions
  by primary key) written to a new Delta table;
* dblog: a capture of the table run to the end as ``dblog capture`` runs it (an in-process
  background tailer, the product's default chunk size and tail settings), from a fresh
  ZooKeeper root and lake: planning, the tailer's start, every chunk window, staging, emission
  and the tailer's Delta commits are inside the timing.

Prints rows/s of each and dblog / baseline, and the CPU seconds each side spent (this process,
the Spark JVM by thread group, MariaDB: ``bench/cpu.py``; dblog's until the capture ended and
until the mirror had it), and writes
``bench/results/capture.json``.

    .venv/bin/python -m bench.bench_capture [--rows 1000000] [--writers-tps 500] [--no-warm]
        [--timeline] [--smoke]

Each capture's result holds its profile (seconds in the capture's and the tailer's steps)
and its timeline (every timed step's start and end by thread; ``--timeline`` prints it):
where the chunks' selects, file writes and the tailer's pins overlapped, or waited.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    TABLE,
    Profile,
    drop_database,
    generate_table,
    lake_dir,
    mariadb_version,
    paced_writer,
    pipeline_config,
    print_table,
    record_batches,
    remove_lake,
    server_id,
    table_facts,
    with_ratios,
    write_results,
    zookeeper_requests,
)
from bench.cpu import (
    cpu_seconds,
    jvm_threads,
    jvm_threads_since,
    python_threads,
    snapshot,
    spent_since,
    threads_since,
)
from devtools import services
from devtools.sample import q


def baseline(spark: Any, dialect: Any, db: str, rows: int, partitions: int, path: Path
             ) -> dict[str, Any]:
    """A plain dump: the whole table over JDBC (partitioned by the key) into a Delta table."""
    began = time.perf_counter()
    df = (spark.read.format("jdbc").options(**dialect.jdbc_options())
          .option("dbtable", f"{q(db)}.{q(TABLE)}")
          .option("partitionColumn", "id").option("lowerBound", "1")
          .option("upperBound", str(rows + 1)).option("numPartitions", str(partitions))
          .option("fetchsize", "10000").load())
    df.write.format("delta").mode("overwrite").save(str(path))
    seconds = time.perf_counter() - began
    written = spark.read.format("delta").load(str(path)).count()
    return {"rows": written, "seconds": round(seconds, 2), "rows_per_s": written / seconds}


def warm_up(spark: Any, dialect: Any, db: str, path: Path) -> None:
    """JIT and class loading for both paths: a small JDBC read written to Delta."""
    df = (spark.read.format("jdbc").options(**dialect.jdbc_options())
          .option("query", f"SELECT * FROM {q(db)}.{q(TABLE)} LIMIT 2000").load())  # noqa: S608
    df.write.format("delta").mode("overwrite").save(str(path))


def dblog_capture(ep: Any, spark: Any, db: str, name: str, args: argparse.Namespace
                  ) -> dict[str, Any]:
    """A capture of the table to the end, the way ``dblog capture`` runs it."""
    from dblog.app.runtime import open_runtime
    from dblog.capture import plan_request
    from dblog.capture import writer as capture_module
    from dblog.tail.background import BackgroundTailer
    from dblog.tail.emissions import Emissions

    table = f"{db}.{TABLE}"
    config = pipeline_config(ep, name=name, tables=[table], lake=lake_dir(name) / "lake",
                             server_id=server_id(7950, 7969), chunk_size=args.chunk_size,
                             max_in_flight=args.max_in_flight,
                             read_partitions=args.read_partitions)
    batches: list[tuple[int, float]] = []
    profile = Profile()
    stop = threading.Event()
    timer = threading.Timer(args.capture_timeout, stop.set)
    with open_runtime(config, spark=spark) as rt:
        try:
            began, cpu_before = time.perf_counter(), snapshot()
            threads_before, jvm_before = python_threads(), jvm_threads()
            zk_before = zookeeper_requests(ep)
            capturer = rt.capturer()
            capture_id = capturer.plan(plan_request([table], None, None))
            timer.start()
            for method in ("write_table_batch", "merge_mirror", "ensure_tables",
                           "ensure_schema", "mirror_holds"):
                profile.wrap(rt.sink, method, f"sink.{method}")
            profile.wrap(rt.sink.changelog, "_commit_changelog", "sink._commit_changelog")
            profile.wrap(rt.sink.coverage, "deletes", "sink._coverage_deletes")
            profile.wrap(rt.dialect, "write_watermark", "dialect.write_watermark")
            profile.wrap(capture_module, "write_chunk_files", "capture.write_chunk_files")
            tailer = rt.tailer(on_batch=record_batches(batches))
            # a run's emissions are made as it starts: their methods are timed on the class
            profile.wrap(Emissions, "_await_files", "tail.await_chunk_files")
            profile.wrap(Emissions, "_pin", "tail.pin (schema, pin, mirror check)")
            profile.wrap(Emissions, "settle_pinned", "tail.settle_pinned (wait for files)")
            with BackgroundTailer(tailer) as bg:
                capturer = rt.capturer()
                capturer.health_check = bg.check
                profile.wrap(capturer, "_chunk", "capture.chunk (plan, register, LW, select, "
                             "HW, pin, write)")
                profile.wrap(capturer, "_read_plan", "capture.read_plan")
                profile.wrap(capturer, "_write_held", "capture.wait_pin_and_write")
                profile.wrap(capturer, "_wait", "capture.wait_for_emission")
                reports = capturer.run(capture_id, stop=stop)
                seconds = time.perf_counter() - began
                capture_cpu = spent_since(cpu_before)
                capture_threads = threads_since(threads_before)
                capture_jvm_threads = jvm_threads_since(jvm_before)
                zk_after = zookeeper_requests(ep)
                # The mirror follows the changelog: the capture is in the changelog now,
                # and in the mirror once the tailer merged it.
                rt.wait_caught_up(bg.check, timeout=args.capture_timeout)
                mirror_seconds = time.perf_counter() - began
        finally:
            timer.cancel()
            rt.state.delete("", recursive=True)
            profile.unwrap()
    emitted = sum(r.rows_emitted for r in reports)
    dropped = sum(r.rows_dropped for r in reports)
    return {
        "rows": emitted + dropped,
        "rows_emitted": emitted,
        "rows_dropped_by_windows": dropped,
        "chunks": sum(r.chunks for r in reports),
        "retries": sum(r.retries for r in reports),
        "status": ",".join(sorted({r.status for r in reports})),
        "complete": all(r.status == "done" for r in reports),
        "seconds": round(seconds, 2),
        "rows_per_s": (emitted + dropped) / seconds,
        "mirror_seconds": round(mirror_seconds, 2),
        "mirror_rows_per_s": (emitted + dropped) / mirror_seconds,
        "tailer_batches": len(batches),
        "tailer_events": sum(e for e, _ in batches),
        "tailer_write_seconds": round(sum(s for _, s in batches), 2),
        "chunk_size": args.chunk_size,
        "max_in_flight": args.max_in_flight,
        "profile": profile.summary(),
        "timeline": profile.timeline(),
        "capture_cpu_seconds": capture_cpu,
        "capture_python_threads": capture_threads,
        "capture_jvm_threads": capture_jvm_threads,
        "capture_zookeeper_requests": (None if zk_before is None or zk_after is None
                                       else zk_after - zk_before),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers-tps", type=float, default=500.0,
                        help="the writers variant's single-row transactions/s (0: skip it)")
    parser.add_argument("--baseline-partitions", type=int, default=4,
                        help="JDBC partitions of the plain dump (by primary key)")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="a fixed chunk size (default: the product's chunk sizing)")
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--read-partitions", type=int, default=None,
                        help="parallel reads of a chunk (default: the product's)")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="skip the idle run repeated in a warm JVM")
    parser.add_argument("--capture-timeout", type=float, default=1800.0,
                        help="stop a capture after this many seconds and report its rate so "
                             "far (marked incomplete)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/capture[-smoke].json)")
    parser.add_argument("--keep", action="store_true", help="keep the database and lakes")
    parser.add_argument("--timeline", action="store_true",
                        help="print each capture's timed steps by thread (always in the results)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.writers_tps = 2000, min(args.writers_tps, 50.0)
        args.capture_timeout = min(args.capture_timeout, 120.0)
    output = args.output or RESULTS_DIR / ("capture-smoke.json" if args.smoke else "capture.json")

    from dblog.app.runtime import make_dialect
    from dblog.app.spark import build_spark_session

    services.up()
    ep = services.endpoints()
    generated = generate_table(ep, "capture", args.rows)
    rid, db, facts, fill_seconds = (generated.run, generated.db, generated.facts,
                                    generated.fill_seconds)
    print(f"  {facts['rows']:,} rows, {facts['avg_row_bytes']} bytes/row, "
          f"generated in {fill_seconds:.1f}s", flush=True)
    spark = build_spark_session()
    results: list[dict[str, Any]] = []
    next_id = args.rows + 1
    try:
        probe = pipeline_config(ep, name=f"probe-{rid}", tables=[f"{db}.{TABLE}"],
                                lake=lake_dir(f"probe-{rid}"), server_id=7950)
        dialect = make_dialect(probe)
        try:
            warm_up(spark, dialect, db, lake_dir(f"warm-{rid}") / "t")
            # "idle" runs in a JVM that has done only the small warm-up, as a capture
            # launched in a fresh process (the CLI, a Dagster run) does; "idle-warm" repeats
            # both sides once the JVM has compiled both paths (a long-running process).
            variants = [("idle", 0.0)] + ([("idle-warm", 0.0)] if args.warm else []) + (
                [("writers", args.writers_tps)] if args.writers_tps > 0 else [])
            for variant, tps in variants:
                row: dict[str, Any] = {"variant": variant, "source_rows": table_facts(ep, db)}
                for side in ("baseline", "dblog"):
                    stats: dict[str, float] = {}
                    load = round(os.getloadavg()[0], 2)
                    print(f"  {variant}: {side} (load average {load}) ...", flush=True)
                    with paced_writer(ep, db, tps, args.rows, next_id, stats), \
                            cpu_seconds() as cpu:
                        if side == "baseline":
                            path = lake_dir(f"baseline-{variant}-{rid}") / "t"
                            row[side] = baseline(spark, dialect, db, args.rows,
                                                 args.baseline_partitions, path)
                        else:
                            row[side] = dblog_capture(ep, spark, db,
                                                      f"capture-{variant}-{rid}", args)
                    row[side]["cpu_seconds"] = cpu
                    next_id += int(stats.get("transactions", 0)) + 1
                    row[side]["loadavg_1m_before"] = load
                    if stats:
                        row[side]["writers"] = stats
                    print(f"    {row[side]}", flush=True)
                results.append(with_ratios(row))
        finally:
            dialect.close()
    finally:
        if not args.keep:
            drop_database(ep, db)
            for name in (f"probe-{rid}", f"warm-{rid}",
                         *(f"{side}-{variant}-{rid}" for side in ("baseline", "capture")
                           for variant in ("idle", "idle-warm", "writers"))):
                remove_lake(name)
    print()
    print_table(
        ["variant", "writers tx/s", "baseline rows/s", "dblog rows/s", "dblog / baseline",
         "dblog s", "+ mirror s", "with mirror / baseline", "chunks", "complete",
         "CPU s: baseline", "dblog", "dblog + mirror", "dblog JIT", "ZK requests"],
        [[r["variant"], r["dblog"].get("writers", {}).get("achieved_tps", 0.0),
          r["baseline"]["rows_per_s"], r["dblog"]["rows_per_s"], r["ratio"],
          r["dblog"]["seconds"], r["dblog"]["mirror_seconds"], r["ratio_with_mirror"],
          r["dblog"]["chunks"], r["dblog"]["complete"],
          r["baseline"]["cpu_seconds"].get("total"),
          r["dblog"]["capture_cpu_seconds"].get("total"), r["dblog"]["cpu_seconds"].get("total"),
          round(r["dblog"]["cpu_seconds"].get("jvm_jit_c1", 0.0)
                + r["dblog"]["cpu_seconds"].get("jvm_jit_c2", 0.0), 2),
          r["dblog"]["capture_zookeeper_requests"]]
         for r in results],
    )
    print("CPU seconds of each side (this process, the Spark JVM's thread groups, MariaDB):")
    for r in results:
        for side in ("baseline", "dblog"):
            print(f"  {r['variant']} {side}: {r[side]['cpu_seconds']}")
        print(f"  {r['variant']} dblog, the capture alone: {r['dblog']['capture_cpu_seconds']}")
        print(f"  {r['variant']} dblog, the capture's Python threads: "
              f"{r['dblog'].get('capture_python_threads')}")
        print(f"  {r['variant']} dblog, the capture's JVM threads: "
              f"{r['dblog'].get('capture_jvm_threads')}")
    if args.timeline:
        for r in results:
            print(f"timeline of the {r['variant']} capture (s since it began):")
            for step in r["dblog"]["timeline"]:
                print(f"  {step['start_s']:8.3f} {step['end_s']:8.3f} "
                      f"{step['end_s'] - step['start_s']:7.3f}  {step['thread'][:20]:20}  "
                      f"{step['step']}")
    parameters = {
        "rows": args.rows, "writers_tps": args.writers_tps,
        "baseline_partitions": args.baseline_partitions, "chunk_size": args.chunk_size,
        "max_in_flight": args.max_in_flight, "read_partitions": args.read_partitions,
        "warm": args.warm,
        "capture_timeout_s": args.capture_timeout,
        "smoke": args.smoke, "spark_master": spark.conf.get("spark.master"),
    }
    path = write_results(output, "capture", parameters, results, {
        "table": {**facts, "generate_seconds": round(fill_seconds, 1), "columns": 10},
        "mariadb": mariadb_version(ep),
    })
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
