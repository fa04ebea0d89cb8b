"""Capture of many small tables: one ``dblog capture`` of them all against plain dumps of
each, one after another.

Creates ``--tables`` databases of one bench table each (``--rows`` rows, the capture bench's
ten columns), then, in one process and on one SparkSession warmed up by a small read:

* baseline: each table dumped by ``spark.read.jdbc`` into its own Delta table, one after
  another (as a script dumping a database's tables would);
* dblog: one capture of all the tables run to the end as ``dblog capture`` runs it (an
  in-process background tailer, the product's default settings), once for each
  ``capture.parallel_ranges`` in ``--parallel``, each from a fresh ZooKeeper root and lake;
  timed to its end (every row in the changelog) and until the tailer merged every mirror.

``--rounds`` repeats the whole set (the settings in reverse order every other round), so
each figure has neighbours taken beside it. The first round's first capture pays most of
the JVM's compilation (it follows only a small warm-up): compare later rounds. Prints
seconds and rows/s of each, dblog / baseline, and writes ``bench/results/capture-tables.json``.

    .venv/bin/python -m bench.bench_capture_tables [--tables 10] [--rows 5000]
        [--parallel 1,2] [--rounds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_capture import baseline, warm_up
from bench.common import (
    RESULTS_DIR,
    TABLE,
    create_database,
    drop_database,
    fill,
    lake_dir,
    mariadb_version,
    pipeline_config,
    print_table,
    remove_lake,
    run_id,
    server_id,
    write_results,
)
from bench.cpu import cpu_seconds
from devtools import services


def dumps(spark: Any, dialect: Any, dbs: list[str], rows: int, name: str) -> dict[str, Any]:
    """Every table dumped into Delta, one after another."""
    began = time.perf_counter()
    written = sum(baseline(spark, dialect, db, rows, 1, lake_dir(f"{name}-{i}") / "t")["rows"]
                  for i, db in enumerate(dbs))
    seconds = time.perf_counter() - began
    return {"rows": written, "seconds": round(seconds, 2), "rows_per_s": written / seconds}


def capture_all(ep: Any, spark: Any, dbs: list[str], parallel: int, name: str,
                timeout_s: float) -> dict[str, Any]:
    """One capture of every table to the end, the way ``dblog capture`` runs it."""
    from dblog.app.runtime import open_runtime
    from dblog.capture import plan_request
    from dblog.tail.background import BackgroundTailer

    tables = [f"{db}.{TABLE}" for db in dbs]
    config = pipeline_config(ep, name=name, tables=tables, lake=lake_dir(name) / "lake",
                             server_id=server_id(7950, 7969),
                             settings={"capture": {"parallel_ranges": parallel}})
    stop = threading.Event()
    timer = threading.Timer(timeout_s, stop.set)
    with open_runtime(config, spark=spark) as rt:
        try:
            began = time.perf_counter()
            capturer = rt.capturer()
            capture_id = capturer.plan(plan_request(tables, None, None))
            timer.start()
            with BackgroundTailer(rt.tailer()) as bg:
                capturer.health_check = bg.check
                reports = capturer.run(capture_id, stop=stop)
                seconds = time.perf_counter() - began
                # In the changelog now; in the mirrors once the tailer merged them.
                rt.wait_caught_up(bg.check, timeout=timeout_s)
                mirror_seconds = time.perf_counter() - began
        finally:
            timer.cancel()
            rt.state.delete("", recursive=True)
    rows = sum(r.rows_emitted + r.rows_dropped for r in reports)
    return {"parallel_ranges": parallel, "rows": rows, "seconds": round(seconds, 2),
            "rows_per_s": rows / seconds, "mirror_seconds": round(mirror_seconds, 2),
            "chunks": sum(r.chunks for r in reports),
            "complete": all(r.status == "done" for r in reports)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--rows", type=int, default=5000, help="rows of each table")
    parser.add_argument("--parallel", default="1,2",
                        help="the capture.parallel_ranges settings to run (comma-separated)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--capture-timeout", type=float, default=900.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/capture-tables[-smoke].json)")
    parser.add_argument("--keep", action="store_true", help="keep the databases and lakes")
    args = parser.parse_args(argv)
    settings = [int(p) for p in args.parallel.split(",")]
    if args.smoke:
        args.tables, args.rows, args.rounds = 2, 200, 1
        args.capture_timeout = min(args.capture_timeout, 180.0)
    output = args.output or RESULTS_DIR / (
        "capture-tables-smoke.json" if args.smoke else "capture-tables.json")

    from dblog.app.runtime import make_dialect
    from dblog.app.spark import build_spark_session

    services.up()
    ep = services.endpoints()
    rid = run_id()
    dbs = [f"bench_tables_{rid}_{i}" for i in range(args.tables)]
    print(f"capture-tables bench {rid}: {args.tables} tables of {args.rows:,} rows", flush=True)
    for db in dbs:
        create_database(ep, db)
        fill(ep, db, args.rows)
    spark = build_spark_session()
    results: list[dict[str, Any]] = []
    names: list[str] = [f"probe-{rid}", f"warm-{rid}"]
    try:
        probe = pipeline_config(ep, name=f"probe-{rid}", tables=[f"{dbs[0]}.{TABLE}"],
                                lake=lake_dir(f"probe-{rid}"), server_id=7950)
        dialect = make_dialect(probe)
        try:
            warm_up(spark, dialect, dbs[0], lake_dir(f"warm-{rid}") / "t")
            for round_no in range(args.rounds):
                row: dict[str, Any] = {"round": round_no}
                name = f"dumps-{rid}-{round_no}"
                names += [f"{name}-{i}" for i in range(args.tables)]
                with cpu_seconds() as cpu:
                    row["baseline"] = dumps(spark, dialect, dbs, args.rows, name)
                row["baseline"]["cpu_seconds"] = cpu
                print(f"  round {round_no}: dumps {row['baseline']}", flush=True)
                # Alternate the settings' order, so none always runs in the JVM the
                # other just warmed.
                for parallel in settings if round_no % 2 == 0 else settings[::-1]:
                    name = f"capture-{rid}-{round_no}-p{parallel}"
                    names.append(name)
                    with cpu_seconds() as cpu:
                        found = capture_all(ep, spark, dbs, parallel, name, args.capture_timeout)
                    found["cpu_seconds"] = cpu
                    found["ratio"] = found["rows_per_s"] / row["baseline"]["rows_per_s"]
                    row[f"dblog_p{parallel}"] = found
                    print(f"  round {round_no}: capture, parallel_ranges {parallel}: {found}",
                          flush=True)
                results.append(row)
        finally:
            dialect.close()
    finally:
        if not args.keep:
            for db in dbs:
                drop_database(ep, db)
            for name in names:
                remove_lake(name)
    print()
    print_table(
        ["round", "side", "parallel ranges", "seconds", "+ mirrors s", "rows/s", "/ dumps",
         "chunks", "complete", "CPU s"],
        [[r["round"], "dumps", "", r["baseline"]["seconds"], "", r["baseline"]["rows_per_s"],
          1.0, "", True, r["baseline"]["cpu_seconds"].get("total")] for r in results]
        + [[r["round"], "dblog capture", p, r[f"dblog_p{p}"]["seconds"],
            r[f"dblog_p{p}"]["mirror_seconds"], r[f"dblog_p{p}"]["rows_per_s"],
            r[f"dblog_p{p}"]["ratio"],
            r[f"dblog_p{p}"]["chunks"], r[f"dblog_p{p}"]["complete"],
            r[f"dblog_p{p}"]["cpu_seconds"].get("total")]
           for r in results for p in settings],
    )
    parameters = {"tables": args.tables, "rows": args.rows, "parallel_ranges": settings,
                  "rounds": args.rounds, "capture_timeout_s": args.capture_timeout,
                  "smoke": args.smoke, "spark_master": spark.conf.get("spark.master")}
    path = write_results(output, "capture-tables", parameters, results,
                         {"mariadb": mariadb_version(ep)})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
