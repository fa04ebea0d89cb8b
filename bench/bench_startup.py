"""A fresh dblog process's JVM: with the class-data sharing archive against without it.

Each round starts two fresh Python processes, alternately with and without the archive
(``DBLOG_JVM_ARCHIVE=off``), that each build dblog's Spark session and then write, read
and list the history of a small Delta table, as a ``dblog`` command's first work does.
Prints the median seconds of both steps and with / without.

    .venv/bin/python -m bench.bench_startup [--rounds 5] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, print_table, write_results

_CHILD = """
import json, shutil, sys, time
began = time.perf_counter()
from dblog.app.spark import build_spark_session
spark = build_spark_session()
session = time.perf_counter()
path = sys.argv[1]
if sys.argv[2] == "delta":
    spark.range(100).selectExpr("id", "cast(id as string) v").write.format("delta").save(path)
    spark.read.format("delta").load(path).where("id > 5").count()
    from delta.tables import DeltaTable
    DeltaTable.forPath(spark, path).history(1).collect()
done = time.perf_counter()
from dblog.app.jvm_archive import archive_path
with open(f"/proc/{spark.sparkContext._gateway.proc.pid}/maps") as maps:
    mapped = str(archive_path()) in maps.read()  # the JVM maps the archive it uses
print(json.dumps({"session_s": session - began, "first_delta_s": done - session,
                  "total_s": done - began, "archive_mapped": mapped}))
"""


def start_once(archive: bool, *, delta: bool = True) -> dict[str, Any]:
    """One fresh process: its session, then (``delta``) its first Delta work."""
    env = dict(os.environ, DBLOG_JVM_ARCHIVE="on" if archive else "off")
    with tempfile.TemporaryDirectory(prefix="dblog-bench-startup-") as work:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(Path(work, "t")),
                               "delta" if delta else "session"], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the child failed:\n{(done.stdout + done.stderr)[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["archive_mapped"] != archive:
        raise SystemExit(f"the JVM {'did not map' if archive else 'mapped'} the archive "
                         f"{'with' if archive else 'without'} it: {result}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/startup[-smoke].json)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds = 1
    output = args.output or RESULTS_DIR / ("startup-smoke.json" if args.smoke
                                           else "startup.json")

    from dblog.app.jvm_archive import build_archive

    archive = build_archive()  # what `make setup` leaves; written here if it is missing
    if archive is None:
        raise SystemExit("the JVM archive is turned off (DBLOG_JVM_ARCHIVE): nothing to measure")
    runs: dict[str, list[dict[str, Any]]] = {"without the archive": [], "with the archive": []}
    for _ in range(args.rounds):
        # The smoke starts the sessions only (the Delta work is the same code either way).
        runs["without the archive"].append(start_once(False, delta=not args.smoke))
        runs["with the archive"].append(start_once(True, delta=not args.smoke))
    results: dict[str, Any] = {
        side: {step: round(statistics.median(r[step] for r in rs), 3)
               for step in ("session_s", "first_delta_s", "total_s")} | {"runs": rs}
        for side, rs in runs.items()}
    ratio = results["with the archive"]["total_s"] / results["without the archive"]["total_s"]
    print_table(["JVM", "session s", "first Delta write, read, history s", "total s"],
                [[side, r["session_s"], r["first_delta_s"], r["total_s"]]
                 for side, r in results.items()])
    print(f"with / without the archive: {ratio:.2f}x the time ({args.rounds} rounds, medians)")
    path = write_results(output, "startup", {"rounds": args.rounds, "smoke": args.smoke},
                         {**results, "with_over_without": ratio},
                         {"archive": str(archive),
                          "archive_bytes": archive.stat().st_size})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
