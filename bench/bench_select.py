"""A chunk's select: with a ``LIMIT`` (how a ``--keys``/``--where`` chunk is read) against
bounded by planned keys (every other chunk), on the same rows.

Spark's JDBC reader wraps a chunk's select in a subquery. MariaDB materializes a subquery
with a ``LIMIT`` in a temporary table (on disk for a large chunk) before it sends the first
row, and merges one without into the outer query, streaming the rows from the primary key's
range scan. Both variants read ``--rows`` rows of the bench table into Spark as a capture
does (a local checkpoint), alternating for ``--rounds`` rounds; prints the median seconds
and MariaDB's CPU seconds of each, and planned / ``LIMIT``.

    .venv/bin/python -m bench.bench_select [--rows 500000] [--rounds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

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
from bench.cpu import mariadb_cpu_seconds
from dblog.core.events import TableId
from dblog.sources.base import ChunkSpec
from devtools import services


def read_held(spark: Any, dialect: Any, spec: ChunkSpec, schema: Any) -> dict[str, Any]:
    """Select one chunk into Spark as a capture holds it; seconds and MariaDB CPU seconds."""
    cpu = mariadb_cpu_seconds()
    began = time.perf_counter()
    rows = dialect.read_chunk(spark, spec, schema).localCheckpoint(eager=True).count()
    seconds = time.perf_counter() - began
    after = mariadb_cpu_seconds()
    return {"rows": rows, "seconds": seconds,
            "mariadb_cpu_s": None if cpu is None or after is None else after - cpu}


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/select[-smoke].json)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.rounds = 2000, 1
    output = args.output or RESULTS_DIR / ("select-smoke.json" if args.smoke else "select.json")

    from dblog.app.runtime import make_dialect
    from dblog.app.spark import build_spark_session

    services.up()
    ep = services.endpoints()
    generated = generate_table(ep, "select", args.rows)
    rid, db, facts = generated.run, generated.db, generated.facts
    spark = build_spark_session()
    name = f"select-{rid}"
    dialect = make_dialect(pipeline_config(ep, name=name, tables=[f"{db}.{TABLE}"],
                                           lake=lake_dir(name), server_id=7951))
    table = TableId(db, TABLE)
    variants = {
        "LIMIT": ChunkSpec(table, args.rows, after_key=(0,)),
        "planned": ChunkSpec(table, None, after_key=(0,), upper_key=(args.rows,)),
    }
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        schema = dialect.table_schema(table)
        read_held(spark, dialect, variants["LIMIT"], schema)  # warm-up: JIT, buffer pool
        for _ in range(args.rounds):
            for variant, spec in variants.items():
                run = read_held(spark, dialect, spec, schema)
                assert run["rows"] == args.rows, run
                runs[variant].append(run)
    finally:
        dialect.close()
        drop_database(ep, db)
        remove_lake(name)
    results = {v: {"rows": args.rows,
                   "seconds": _median([r["seconds"] for r in rs]),
                   "mariadb_cpu_s": _median([r["mariadb_cpu_s"] for r in rs]),
                   "runs": rs}
               for v, rs in runs.items()}
    base, planned = results["LIMIT"], results["planned"]
    ratios = {"seconds": planned["seconds"] / base["seconds"] if base["seconds"] else None,
              "mariadb_cpu_s": (planned["mariadb_cpu_s"] / base["mariadb_cpu_s"]
                                if planned["mariadb_cpu_s"] and base["mariadb_cpu_s"]
                                else None)}
    print()
    print_table(["select", "rows", "median s", "MariaDB CPU s (median)"],
                [[v, r["rows"], r["seconds"], r["mariadb_cpu_s"]] for v, r in results.items()])
    print(f"planned / LIMIT: {ratios['seconds']:.2f}x the time, "
          + (f"{ratios['mariadb_cpu_s']:.2f}x MariaDB's CPU"
             if ratios["mariadb_cpu_s"] is not None else "MariaDB's CPU not readable"))
    path = write_results(output, "select", {"rows": args.rows, "rounds": args.rounds,
                                            "smoke": args.smoke},
                         {**results, "planned_over_limit": ratios},
                         {"table": facts, "mariadb": mariadb_version(ep)})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
