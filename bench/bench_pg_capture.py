"""PostgreSQL capture speed: ``dblog capture`` of one table against a plain Spark JDBC dump
of it, on an idle source and with writers at ``--writers-tps`` single-row transactions/s
on the same table (as ``bench_capture`` does for MariaDB).

Creates a table of ``--rows`` rows (ten columns of several types, ~150 bytes/row, generated
on the server), then, in one process and one SparkSession, per variant:

* baseline: ``spark.read.jdbc`` of the whole table (4 JDBC partitions by primary key)
  written to a new Delta table;
* dblog: a capture of the table run to the end as ``dblog capture`` runs it (an in-process
  background tailer, the product's default chunk sizing and tail settings; a new source
  name, so a new slot and lake, per variant).

Prints rows/s of each and dblog / baseline, writes ``bench/results/pg-capture.json``.

    .venv/bin/python -m bench.bench_pg_capture [--rows 1000000] [--writers-tps 500] [--smoke]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_pg_tail import config, connect, create
from bench.common import (
    RESULTS_DIR,
    Profile,
    lake_dir,
    paced_writer,
    print_table,
    record_batches,
    remove_lake,
    run_id,
    with_ratios,
    write_results,
)
from devtools import services


def baseline(spark: Any, dialect: Any, schema: str, rows: int, path: Path) -> dict[str, Any]:
    began = time.perf_counter()
    df = (spark.read.format("jdbc").options(**dialect.jdbc_options())
          .option("dbtable", f'"{schema}".items')
          .option("partitionColumn", "id").option("lowerBound", "1")
          .option("upperBound", str(rows + 1)).option("numPartitions", "4")
          .option("fetchsize", "10000").load())
    df.write.format("delta").mode("overwrite").save(str(path))
    seconds = time.perf_counter() - began
    written = spark.read.format("delta").load(str(path)).count()
    return {"rows": written, "seconds": round(seconds, 2), "rows_per_s": written / seconds}


def dblog_capture(rt: Any, table: str, timeout: float) -> dict[str, Any]:
    from dblog.capture import plan_request
    from dblog.capture import writer as capture_module
    from dblog.tail.background import BackgroundTailer

    batches: list[tuple[int, float]] = []
    profile = Profile()
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    began = time.perf_counter()
    capture_id = rt.capturer().plan(plan_request([table], None, None))
    timer.start()
    for method in ("write_table_batch", "merge_mirror"):
        profile.wrap(rt.sink, method, f"sink.{method}")
    profile.wrap(rt.sink.changelog, "_commit_changelog", "sink._commit_changelog")
    profile.wrap(capture_module, "write_chunk_files", "capture.write_chunk_files")
    try:
        with BackgroundTailer(rt.tailer(on_batch=record_batches(batches))) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            profile.wrap(capturer, "_chunk", "capture.chunk (plan, register, LW, select, HW, "
                         "pin, write)")
            profile.wrap(capturer, "_write_held", "capture.wait_pin_and_write")
            reports = capturer.run(capture_id, stop=stop)
            seconds = time.perf_counter() - began
            rt.wait_caught_up(bg.check, timeout=timeout)
            mirror_seconds = time.perf_counter() - began
    finally:
        timer.cancel()
        profile.unwrap()
    rows = sum(r.rows_emitted + r.rows_dropped for r in reports)
    return {"rows": rows, "chunks": sum(r.chunks for r in reports),
            "complete": all(r.status == "done" for r in reports),
            "seconds": round(seconds, 2), "rows_per_s": rows / seconds,
            "mirror_seconds": round(mirror_seconds, 2),
            "mirror_rows_per_s": rows / mirror_seconds, "tailer_batches": len(batches),
            "profile": profile.summary()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--writers-tps", type=float, default=500.0,
                        help="the writers variant's single-row transactions/s (0: skip it)")
    parser.add_argument("--capture-timeout", type=float, default=1800.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.capture_timeout = 2000, 120.0
        args.writers_tps = min(args.writers_tps, 50.0)
    output = args.output or RESULTS_DIR / (
        "pg-capture-smoke.json" if args.smoke else "pg-capture.json")

    from dblog.app.runtime import open_runtime
    from dblog.app.spark import build_spark_session
    from dblog.sources.postgres.connection import default_slot

    services.up()
    ep = services.endpoints()
    rid = run_id()
    schema = f"bench_pgcap_{rid}"
    print(f"pg capture bench {rid}: {args.rows:,} rows in {schema}.items", flush=True)
    began = time.perf_counter()
    create(ep, schema, args.rows)
    generate_s = time.perf_counter() - began
    conn = connect(ep)
    cur = conn.cursor()
    cur.execute(f'ANALYZE "{schema}".items')
    cur.execute(f"SELECT pg_total_relation_size('\"{schema}\".items')")
    table_bytes = int(cur.fetchone()[0])
    spark = build_spark_session()
    results: list[dict[str, Any]] = []
    variants = [("idle", 0.0)] + ([("writers", args.writers_tps)]
                                  if args.writers_tps > 0 else [])
    names = [f"pgcap-{rid}-{variant}" for variant, _ in variants]
    next_id = args.rows + 1
    try:
        warm = lake_dir(f"warm-{rid}") / "t"
        for (variant, tps), name in zip(variants, names, strict=True):
            with open_runtime(config(ep, name, schema), spark=spark) as rt:
                try:
                    if variant == "idle":
                        baseline(spark, rt.dialect, schema, min(args.rows, 2000), warm)
                    row: dict[str, Any] = {"variant": variant}
                    for side in ("baseline", "dblog"):
                        stats: dict[str, float] = {}
                        with paced_writer(ep, schema, tps, args.rows, next_id, stats,
                                          kind="postgres"):
                            if side == "baseline":
                                row[side] = baseline(
                                    spark, rt.dialect, schema, args.rows,
                                    lake_dir(f"baseline-{variant}-{rid}") / "t")
                            else:
                                row[side] = dblog_capture(rt, f"{schema}.items",
                                                          args.capture_timeout)
                        next_id += int(stats.get("transactions", 0)) + 1
                        if stats:
                            row[side]["writers"] = stats
                        print(f"    {variant} {side} {row[side]}", flush=True)
                    results.append(with_ratios(row))
                finally:
                    rt.state.delete("", recursive=True)
    finally:
        for name in names:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s AND NOT active", (default_slot(name),))
            cur.execute(f'DROP PUBLICATION IF EXISTS "{default_slot(name)}"')
        cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()
        for lake in (*names, f"warm-{rid}", *(f"baseline-{v}-{rid}" for v, _ in variants)):
            remove_lake(lake)
    print()
    print_table(
        ["variant", "writers tx/s", "baseline rows/s", "dblog rows/s", "dblog / baseline",
         "dblog s", "+ mirror s", "with mirror / baseline", "chunks", "complete"],
        [[r["variant"], r["dblog"].get("writers", {}).get("achieved_tps", 0.0),
          r["baseline"]["rows_per_s"], r["dblog"]["rows_per_s"], r["ratio"],
          r["dblog"]["seconds"], r["dblog"]["mirror_seconds"], r["ratio_with_mirror"],
          r["dblog"]["chunks"], r["dblog"]["complete"]] for r in results])
    path = write_results(output, "pg-capture",
                         {"rows": args.rows, "writers_tps": args.writers_tps,
                          "smoke": args.smoke},
                         results, {"table": {"rows": args.rows, "bytes": table_bytes,
                                             "generate_seconds": round(generate_s, 1)}})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
