"""PostgreSQL capture speed: ``dblog capture`` of one table against a plain Spark JDBC dump
of it, on an idle source (the MariaDB bench, ``bench_capture``, also runs with writers).

Creates a table of ``--rows`` rows (ten columns of several types, ~150 bytes/row, generated
on the server), then, in one process and one SparkSession:

* baseline: ``spark.read.jdbc`` of the whole table (4 JDBC partitions by primary key)
  written to a new Delta table;
* dblog: a capture of the table run to the end as ``dblog capture`` runs it (an in-process
  background tailer, the product's default chunk sizing and tail settings).

Prints rows/s of each and dblog / baseline, writes ``bench/results/pg-capture.json``.

    .venv/bin/python -m bench.bench_pg_capture [--rows 1000000] [--smoke]
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
    print_table,
    record_batches,
    remove_lake,
    run_id,
    write_results,
)
from pipeline import services


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
    from pipeline.background import BackgroundTailer
    from pipeline.capture import plan_request

    batches: list[tuple[int, float]] = []
    profile = Profile()
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    began = time.perf_counter()
    capture_id = rt.capturer().plan(plan_request([table], None, None))
    timer.start()
    for method in ("stage_chunk", "write_table_batch", "_append_changelog", "merge_mirror"):
        profile.wrap(rt.sink, method, f"sink.{method}")
    try:
        with BackgroundTailer(rt.tailer(on_batch=record_batches(batches))) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            profile.wrap(capturer, "_chunk", "capture.chunk (register, LW, select, stage, HW)")
            reports = capturer.run(capture_id, stop=stop)
            seconds = time.perf_counter() - began
            rt.wait_caught_up(bg.check, timeout=timeout)
            mirror_seconds = time.perf_counter() - began
    finally:
        timer.cancel()
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
    parser.add_argument("--capture-timeout", type=float, default=1800.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.capture_timeout = 5000, 120.0
    output = args.output or RESULTS_DIR / (
        "pg-capture-smoke.json" if args.smoke else "pg-capture.json")

    from pipeline.runtime import open_runtime
    from pipeline.sources.postgres.connection import default_slot
    from pipeline.spark import build_spark_session

    services.up()
    ep = services.endpoints()
    rid = run_id()
    schema, name = f"bench_pgcap_{rid}", f"pgcap-{rid}"
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
    cfg = config(ep, name, schema)
    results: list[dict[str, Any]] = []
    try:
        with open_runtime(cfg, spark=spark) as rt:
            try:
                warm = lake_dir(f"warm-{rid}") / "t"
                baseline(spark, rt.dialect, schema, min(args.rows, 2000), warm)
                base = baseline(spark, rt.dialect, schema, args.rows,
                                lake_dir(f"baseline-{rid}") / "t")
                print(f"    baseline {base}", flush=True)
                run = dblog_capture(rt, f"{schema}.items", args.capture_timeout)
                print(f"    dblog    {run}", flush=True)
                results.append({"variant": "idle", "baseline": base, "dblog": run,
                                "ratio": run["rows_per_s"] / base["rows_per_s"],
                                "ratio_with_mirror": run["mirror_rows_per_s"]
                                / base["rows_per_s"]})
            finally:
                rt.state.delete("", recursive=True)
    finally:
        cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = %s AND NOT active", (default_slot(name),))
        cur.execute(f'DROP PUBLICATION IF EXISTS "{default_slot(name)}"')
        cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()
        for lake in (name, f"warm-{rid}", f"baseline-{rid}"):
            remove_lake(lake)
    print()
    print_table(
        ["variant", "baseline rows/s", "dblog rows/s", "dblog / baseline", "dblog s",
         "+ mirror s", "with mirror / baseline", "chunks", "complete"],
        [[r["variant"], r["baseline"]["rows_per_s"], r["dblog"]["rows_per_s"], r["ratio"],
          r["dblog"]["seconds"], r["dblog"]["mirror_seconds"], r["ratio_with_mirror"],
          r["dblog"]["chunks"], r["dblog"]["complete"]] for r in results])
    path = write_results(output, "pg-capture", {"rows": args.rows, "smoke": args.smoke},
                         results, {"table": {"rows": args.rows, "bytes": table_bytes,
                                             "generate_seconds": round(generate_s, 1)}})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
