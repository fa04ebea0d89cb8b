"""Repair comparison speed: per-range count + checksum (computed on the database and on the
mirror; no rows move) against comparing by moving the rows, and against a blind re-dump.

Creates the bench table of ``--rows`` rows and a mirror of it in the lake (the canonical chunk
read, as a capture writes it), then, on one SparkSession:

* dump: a plain Spark JDBC read of the table written to Delta (what a blind overwrite costs);
* transfer compare: ``dblog verify``'s comparison (the whole table read over JDBC and compared
  with the mirror in Spark, row for row);
* checksum compare: what a repair does before it captures anything, for ranges of
  ``--range-rows``: the database's per-range count and checksum in one snapshot and the
  mirror's in one Spark job, at the same time (each side is also timed alone).

Prints seconds and rows/s of each and the ratios; writes ``bench/results/repair.json``.

    .venv/bin/python -m bench.bench_repair [--rows 1000000] [--range-rows 100000] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.bench_capture import baseline, warm_up
from bench.common import (
    RESULTS_DIR,
    TABLE,
    drop_database,
    generate_table,
    lake_dir,
    mariadb_version,
    pipeline_config,
    print_table,
    remove_lake,
    write_results,
)
from pipeline import services
from pipeline.events import TableId


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--range-rows", type=int, default=100_000)
    parser.add_argument("--baseline-partitions", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database and lakes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.range_rows = 5000, 1000
    output = args.output or RESULTS_DIR / ("repair-smoke.json" if args.smoke else "repair.json")

    from pyspark.sql import functions as F

    from pipeline.compare import compare_ranges, mirror_checksums
    from pipeline.ranges import key_ranges, plan_more
    from pipeline.runtime import open_runtime
    from pipeline.sources.base import ChunkSpec
    from pipeline.spark import build_spark_session
    from pipeline.verify import FULL_TABLE, verify_table

    services.up()
    ep = services.endpoints()
    generated = generate_table(ep, "repair", args.rows)
    rid, db, facts = generated.run, generated.db, generated.facts
    table = TableId(db, TABLE)
    spark = build_spark_session()
    name = f"repair-{rid}"
    config = pipeline_config(ep, name=name, tables=[str(table)], lake=lake_dir(name),
                             server_id=7960)
    results: dict[str, Any] = {}
    try:
        with open_runtime(config, spark=spark) as rt:
            schema = rt.dialect.table_schema(table)
            rt.sink.ensure_schema(schema)
            mirror = rt.dialect.read_chunk(spark, ChunkSpec(table, FULL_TABLE), schema).select(
                "*", F.lit(1).cast("long").alias("_dblog_lsn"),
                F.lit(0).cast("long").alias("_dblog_seq"))
            mirror.write.format("delta").mode("append").save(rt.layout.mirror(table))
            warm_up(spark, rt.dialect, db, lake_dir(f"warm-{rid}") / "t")
            names = plan_more([], lambda after, offset: rt.dialect.key_after(
                table, after, offset), args.range_rows, most=100_000)
            ranges = list(key_ranges(names, names).values())

            def timed(label: str, work: Any) -> Any:
                load = round(os.getloadavg()[0], 2)
                print(f"  {label} (load average {load}) ...", flush=True)
                began = time.perf_counter()
                value = work()
                seconds = time.perf_counter() - began
                results[label] = {"seconds": round(seconds, 2),
                                  "rows_per_s": facts["rows"] / seconds,
                                  "loadavg_1m_before": load}
                print(f"    {results[label]}", flush=True)
                return value

            timed("dump", lambda: baseline(spark, rt.dialect, db, args.rows,
                                           args.baseline_partitions,
                                           lake_dir(f"dump-{rid}") / "t"))
            report = timed("transfer compare",
                           lambda: verify_table(rt.dialect, rt.sink, table))
            assert report.ok, report.summary()
            _, source = timed("checksum compare: database",
                              lambda: rt.dialect.range_checksums(table, ranges))
            mirrored = timed("checksum compare: mirror",
                             lambda: mirror_checksums(rt, schema, ranges))
            assert source == mirrored, "the checksums of an identical mirror differ"
            named = dict(zip(names, ranges, strict=True))
            compared = timed("checksum compare", lambda: compare_ranges(
                rt, table, named, wait_for_tailer=False))
            assert all(c.equal for c in compared)
            results["checksum compare"]["ranges"] = len(ranges)
    finally:
        if not args.keep:
            drop_database(ep, db)
            for lake in (name, f"warm-{rid}", f"dump-{rid}"):
                remove_lake(lake)
    checksum_s = results["checksum compare"]["seconds"]
    print()
    print_table(["way", "seconds", "rows/s", "seconds / checksum compare's"],
                [[label, r["seconds"], r["rows_per_s"], r["seconds"] / checksum_s]
                 for label, r in results.items()])
    write_results(output, "repair", {
        "rows": args.rows, "range_rows": args.range_rows, "ranges": len(ranges),
        "baseline_partitions": args.baseline_partitions, "smoke": args.smoke,
        "spark_master": spark.conf.get("spark.master")},
        results, extra={"table": facts, "mariadb": mariadb_version(ep)})
    print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
