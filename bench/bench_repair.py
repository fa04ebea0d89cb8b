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

``--heal``: the rolling verification's time to detect and heal. The table is captured by
``dblog capture``, then ``dblog repair --continuous`` runs at its default pace
(``repair.max_rows_per_s``, ``repair.range_rows``) while a few rows are changed behind the
pipeline's back (``sql_log_bin = 0``), twice: in the range the walk has just compared (the
worst case: found a whole pass later) and in the range half a pass ahead. Prints the seconds
from the change to the walk's "differs" line (detected) and to its "repaired" row (captured,
and merged into the mirror: healed), and each against the pass time N / rate; writes
``bench/results/repair-heal.json``.

    .venv/bin/python -m bench.bench_repair [--rows 1000000] [--range-rows 100000] [--smoke]
    .venv/bin/python -m bench.bench_repair --heal [--rows 1000000] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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
from dblog.core.events import TableId
from devtools import services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--range-rows", type=int, default=100_000)
    parser.add_argument("--baseline-partitions", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database and lakes")
    parser.add_argument("--heal", action="store_true",
                        help="time to detect and heal a divergence under dblog repair "
                             "--continuous (see the module's docstring)")
    args = parser.parse_args(argv)
    if args.heal:
        return heal_main(args)
    if args.smoke:
        args.rows, args.range_rows = 5000, 1000
    output = args.output or RESULTS_DIR / ("repair-smoke.json" if args.smoke else "repair.json")

    from pyspark.sql import functions as F

    from dblog.app.compare import compare_ranges, mirror_checksums
    from dblog.app.runtime import open_runtime
    from dblog.app.spark import build_spark_session
    from dblog.app.verify import FULL_TABLE, verify_table
    from dblog.core.ranges import key_ranges, plan_more
    from dblog.sources.base import ChunkSpec

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


# ---- --heal: the rolling verification's time to detect and heal ---------------------------


class Walk:
    """``dblog repair --continuous`` in a process of its own; its lines, as they come, with
    the time each arrived."""

    def __init__(self, config_path: Path) -> None:
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dblog.app.cli", "-c", str(config_path), "repair",
             "--continuous"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, wanted: Callable[[str], bool], timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                at, line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError("dblog repair --continuous ended:\n"
                                       + "\n".join(self.seen[-30:])) from None
                continue
            self.seen.append(line)
            if wanted(line):
                return at, line
        raise RuntimeError(f"not seen within {timeout:.0f}s:\n" + "\n".join(self.seen[-30:]))

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(300)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def _row(line: str, table: str) -> tuple[str, str] | None:
    """(range name, result) of a per-range row of ``table``."""
    parts = line.split()
    return (parts[1], parts[4]) if len(parts) == 6 and parts[0] == table else None


def heal_main(args: argparse.Namespace) -> int:
    import yaml

    from dblog.app.config import RepairConfig, parse_config
    from dblog.core.ranges import parse_range_name
    from devtools.sample import config_dict, connect, q

    if args.smoke:
        args.rows = 5000
    output = args.output or RESULTS_DIR / ("repair-heal-smoke.json" if args.smoke
                                           else "repair-heal.json")
    ep = services.endpoints()
    os.environ.setdefault("DBLOG_MARIADB_PASSWORD", ep.mariadb_password)
    generated = generate_table(ep, "heal", args.rows)
    rid, db = generated.run, generated.db
    table = f"{db}.{TABLE}"
    name = f"heal-{rid}"
    data = config_dict(source=name, ep=ep, tables=[table], lake=lake_dir(name),
                       server_id=7961, batch_seconds=2.0, poll_seconds=0.5)
    del data["capture"]["chunk_size"], data["capture"]["chunk_max_rows"]  # the product's
    data["zookeeper"]["root"] = f"dblog-bench-{name}"
    if args.smoke:  # a pass of 5 s
        data["repair"] = {"max_rows_per_s": 1000, "range_rows": 1000}
    repair = parse_config(data).repair
    default = RepairConfig()
    config_path = lake_dir(f"{name}-config") / "dblog.yaml"
    config_path.write_text(yaml.safe_dump(data))
    pass_s = args.rows / repair.max_rows_per_s
    results: list[dict[str, Any]] = []
    walk: Walk | None = None
    try:
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "dblog.app.cli", "-c", str(config_path),
                        "capture"], check=True, stdout=subprocess.DEVNULL)
        capture_s = time.monotonic() - began
        print(f"  captured {args.rows:,} rows in {capture_s:.1f}s; dblog repair --continuous "
              f"at {repair.max_rows_per_s:g} rows/s, ranges of {repair.range_rows:,} rows "
              f"(a pass: {pass_s:.0f}s)", flush=True)
        walk = Walk(config_path)
        _, first_pass = walk.wait_for(lambda line: line.startswith(f"pass 1 of {table}"),
                                      pass_s * 3 + 300)
        print(f"  {first_pass}", flush=True)
        ranges = max(1, -(-args.rows // repair.range_rows))
        for place in ("behind", "half a pass ahead"):
            # The range the walk compared last, as its next row arrives.
            _, line = walk.wait_for(lambda line: _row(line, table) is not None,
                                    pass_s + 300)
            last = parse_range_name(_row(line, table)[0])  # type: ignore[index]
            index = last.index if place == "behind" else (last.index + ranges // 2) % ranges
            lower = index * repair.range_rows  # ids 1..N: range i holds (i * rows, ...]
            ids = (lower + 1 + repair.range_rows // 3, lower + 5 + repair.range_rows // 3)
            load = round(os.getloadavg()[0], 2)
            conn = connect(ep, db)
            with conn.cursor() as cur:
                cur.execute("SET sql_log_bin = 0")
                cur.execute(f"UPDATE {q(TABLE)} SET note = 'diverged' "  # noqa: S608
                            "WHERE id BETWEEN %s AND %s", ids)
            conn.close()
            injected = time.monotonic()
            wanted = f"{index:06d}:"
            detected, _ = walk.wait_for(
                lambda line, w=wanted: f" {w}" in line and ": differs" in line,
                pass_s * 2 + 300)
            healed, row = walk.wait_for(
                lambda line, w=wanted: (_row(line, table) or ("", ""))[0].startswith(w),
                pass_s + 600)
            outcome = _row(row, table)[1]  # type: ignore[index]
            figures = {"place": place, "range_index": index, "rows_changed": ids[1] - ids[0] + 1,
                       "detect_s": round(detected - injected, 1),
                       "heal_s": round(healed - injected, 1),
                       "capture_and_check_s": round(healed - detected, 1),
                       "detect_over_pass": round((detected - injected) / pass_s, 3),
                       "heal_over_pass": round((healed - injected) / pass_s, 3),
                       "outcome": outcome, "loadavg_1m_before": load}
            results.append(figures)
            print(f"    {figures}", flush=True)
        code = walk.stop()
        walk = None
        if code != 0:
            raise RuntimeError(f"dblog repair --continuous exited {code}")
    finally:
        if walk is not None:
            walk.stop()
        if not args.keep:
            drop_database(ep, db)
            for lake in (name, f"{name}-config"):
                remove_lake(lake)
    print()
    print_table(["divergence", "detect s", "heal s", "detect / pass", "heal / pass",
                 "outcome"],
                [[r["place"], r["detect_s"], r["heal_s"], r["detect_over_pass"],
                  r["heal_over_pass"], r["outcome"]] for r in results])
    print(f"(a pass: N / rate = {args.rows:,} / {repair.max_rows_per_s:g} = {pass_s:.0f}s)")
    write_results(output, "repair-heal", {
        "rows": args.rows, "max_rows_per_s": repair.max_rows_per_s,
        "range_rows": repair.range_rows, "default_pace": repair == default,
        "pass_s": pass_s, "capture_s": round(capture_s, 1), "smoke": args.smoke},
        results, extra={"table": generated.facts, "mariadb": mariadb_version(ep),
                        "first_pass": first_pass})
    print(f"\nwrote {output}")
    return 0 if all(r["outcome"] == "repaired" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
