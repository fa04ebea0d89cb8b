"""Reading a table's current state (merge-on-read) against reading its mirror alone.

A table of ``--rows`` rows is captured and merged into its mirror; then ``--changes``
single-row transactions (half inserts, half updates of existing rows) and about a
thousandth of the rows deleted are tailed into the changelog without a merge. In Spark,
both reads compute the same aggregate over every row (the row count and a sum of a hash of
every column): the mirror at its latest version (the baseline; it lacks the changes) and
``current_state()`` (the mirror plus the changelog rows above its mark); with delta-rs, the
mirror read into a pyarrow table against ``read_current_state()``. The four alternate for
``--rounds`` rounds in one warm process; prints the median seconds of each and current /
mirror for both readers (the bench exits if a current state differs from the source's row
count).

    .venv/bin/python -m bench.bench_current [--rows 1000000] [--changes 20000]
        [--rounds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench.bench_tail import generate, procedures
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
    server_id,
    write_results,
)
from devtools import services
from devtools.sample import connect, q


def aggregate(frame: Any) -> tuple[int, int]:
    """Row count and the sum of a 64-bit hash of every column: one pass over every row."""
    from pyspark.sql import functions as F

    row = frame.agg(F.count(F.lit(1)).alias("n"),
                    F.sum(F.xxhash64(*[F.col(f"`{c}`") for c in frame.columns])
                          .cast("decimal(38,0)")).alias("s")).first()
    return int(row["n"]), int(row["s"] or 0)


def timed(read: Any) -> dict[str, Any]:
    began = time.perf_counter()
    rows, digest = aggregate(read())
    return {"seconds": round(time.perf_counter() - began, 3), "rows": rows, "digest": digest}


def timed_arrow(read: Any) -> dict[str, Any]:
    """A delta-rs read into a pyarrow table (every row and column materialized)."""
    began = time.perf_counter()
    rows = read()
    return {"seconds": round(time.perf_counter() - began, 3), "rows": rows.num_rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=20_000,
                        help="single-row transactions tailed after the merge")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/current[-smoke].json)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.changes, args.rounds = 3000, 200, 1
    output = args.output or RESULTS_DIR / ("current-smoke.json" if args.smoke
                                           else "current.json")

    from deltalake import DeltaTable

    from dblog.app.runtime import open_runtime
    from dblog.app.spark import build_spark_session
    from dblog.capture import plan_request
    from dblog.core.events import TableId
    from dblog.lake.current import current_state, mirror_mark
    from dblog.lake.current_arrow import read_current_state
    from dblog.tail.background import BackgroundTailer

    services.up()
    ep = services.endpoints()
    generated = generate_table(ep, "current", args.rows)
    db = generated.db
    name = f"current-{generated.run}"
    table = TableId(db, TABLE)
    spark = build_spark_session()
    config = pipeline_config(ep, name=name, tables=[f"{db}.{TABLE}"],
                             lake=lake_dir(name) / "lake", server_id=server_id(7970, 7984))
    runs: dict[str, list[dict[str, Any]]] = {
        v: [] for v in ("mirror", "current state", "mirror, delta-rs",
                        "current state, delta-rs")}
    try:
        conn = connect(ep, db)
        with conn.cursor() as cur:
            for ddl in procedures(db):
                cur.execute(ddl)
        conn.close()
        with open_runtime(config, spark=spark) as rt:
            try:
                capturer = rt.capturer()
                capture_id = capturer.plan(plan_request([str(table)], None, None))
                with BackgroundTailer(rt.tailer()) as bg:
                    capturer.health_check = bg.check
                    capturer.run(capture_id)
                    rt.wait_caught_up(bg.check, timeout=1800)  # the mirror merged
                print(f"  captured and merged {args.rows:,} rows; {args.changes:,} changes "
                      "and the deletes follow", flush=True)
                gen = generate(ep, db, "single", args.changes, args.rows + 1, args.rows)
                conn = connect(ep, db)
                with conn.cursor() as cur:
                    cur.execute(f"DELETE FROM {q(TABLE)} WHERE id % 1000 = 7")  # noqa: S608
                    deleted = cur.rowcount
                    cur.execute(f"SELECT COUNT(*) FROM {q(TABLE)}")  # noqa: S608
                    source_rows = int(cur.fetchone()[0])
                conn.close()
                rt.tailer().run(until_caught_up=True, merge_at_end=False)
                layout, key = rt.sink.layout, rt.dialect.table_schema(table).key
                mirror_path, changelog_path = layout.mirror(table), layout.changelog(table)
                mark = mirror_mark(spark, mirror_path)
                unmerged = (spark.read.format("delta").load(changelog_path)
                            .where(f"_dblog_lsn > {mark}").count())
                reads = {
                    "mirror": lambda: timed(
                        lambda: spark.read.format("delta").load(mirror_path)),
                    "current state": lambda: timed(
                        lambda: current_state(spark, layout, table, key)),
                    "mirror, delta-rs": lambda: timed_arrow(
                        lambda: DeltaTable(mirror_path).to_pyarrow_table()),
                    "current state, delta-rs": lambda: timed_arrow(
                        lambda: read_current_state(mirror_path, changelog_path)),
                }
                for read in reads.values():
                    read()  # warm-up: the plans' code compiled once
                for _ in range(args.rounds):
                    for variant, read in reads.items():
                        runs[variant].append(read())
                for variant in ("current state", "current state, delta-rs"):
                    if runs[variant][-1]["rows"] != source_rows:
                        raise SystemExit(f"{variant}: {runs[variant][-1]['rows']} rows, the "
                                         f"source {source_rows}")
            finally:
                rt.state.delete("", recursive=True)
    finally:
        drop_database(ep, db)
        remove_lake(name)
    results = {v: {"rows": rs[-1]["rows"],
                   "seconds": round(statistics.median(r["seconds"] for r in rs), 3),
                   "runs": rs}
               for v, rs in runs.items()}
    ratio = results["current state"]["seconds"] / results["mirror"]["seconds"]
    arrow_ratio = (results["current state, delta-rs"]["seconds"]
                   / results["mirror, delta-rs"]["seconds"])
    print()
    print_table(["read", "rows", "median s"],
                [[v, r["rows"], r["seconds"]] for v, r in results.items()])
    print(f"current state / mirror: {ratio:.2f}x the time in Spark, {arrow_ratio:.2f}x with "
          f"delta-rs ({unmerged:,} changelog rows above the mirror's mark; "
          f"{source_rows:,} rows now, as in the source)")
    path = write_results(output, "current", {"rows": args.rows, "changes": args.changes,
                                             "deleted": deleted, "rounds": args.rounds,
                                             "smoke": args.smoke},
                         {**results, "current_over_mirror": ratio,
                          "current_over_mirror_delta_rs": arrow_ratio,
                          "unmerged_changelog_rows": unmerged, "generated": gen},
                         {"table": generated.facts, "mariadb": mariadb_version(ep)})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
