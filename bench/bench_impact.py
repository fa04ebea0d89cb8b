"""Impact: the application's write latency without and with a running ``dblog capture``, with
everything sharing the cores and with the database and the application on one core and the
pipeline on the other.

Creates a table of ``--rows`` rows (the bench table, ~150 bytes/row). An application writer
(its own process: single-row autocommit UPDATEs of random rows and INSERTs of new ids on that
table, ``--tps`` transactions/s, paced) times every statement including its COMMIT, for
``--seconds`` on each of three sides:

* without: nothing of dblog runs (the pipeline's SparkSession sits idle);
* tailer: the tailer alone follows the binlog (in-process, the product's tail settings): what
  following the log costs the source, apart from a capture;
* with: beside that tailer, a capture of the table runs as ``dblog capture`` runs it (the
  product's default chunk settings, one SparkSession), started again whenever it finishes,
  so it runs for the whole measurement; writing starts once its first chunk was emitted
  (JVM warm), or after ``--ramp-timeout``.

The sides are measured in ``--rounds`` rounds, forwards and backwards in turn (without,
tailer, with; with, tailer, without; ...), so that the machine's drift over a run (on a
shared host its speed moves within minutes) weighs on every side alike. Each side's
figures are of all its rounds' commits together; the p99 ratio is also given per round,
with the median of the rounds.

Three placements (two cores assumed), each in a pipeline process of its own (a child of the
bench, which keeps the results, MariaDB's affinity and the clean-up):

* pinned: MariaDB (every thread, ``taskset -a``) and the writer on CPU 0, the pipeline process
  on CPU 1 (pinned before its SparkSession starts, so the JVM inherits it), as on separate
  hosts; MariaDB's affinity is restored afterwards;
* pinned-throttled: the same, the capture held to ``--throttle`` rows/s
  (``capture.max_rows_per_s``);
* unpinned: everything shares both cores.

Prints p50/p95/p99/max ms of each side and the ratios to "without"; the issue's requirement
(pinned p99 ratio ≤ 1.1x) is printed, never asserted. Writes ``bench/results/impact.json``.

    .venv/bin/python -m bench.bench_impact [--rows 200000] [--seconds 20] [--rounds 3]
        [--throttle 3000] [--placements pinned pinned-throttled unpinned] [--smoke]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
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
    record_batches,
    remove_lake,
    write_results,
)
from bench.workload import (
    Commits,
    achieved_tps,
    commit_writers,
    drop_zookeeper_root,
    percentiles,
    replica_id,
)
from dblog.app.paths import dblog_home
from dblog.app.spark import spark_conf
from devtools import services
from devtools.services import Endpoints

TARGET_PINNED_P99_RATIO = 1.1
SIDES = ("without", "tailer", "with")
"""Nothing of dblog running; the tailer alone; a capture beside the tailer."""
SIDE_LABELS = {"without": "none", "tailer": "tailer", "with": "tailer + capture"}


# ---- CPU affinity -------------------------------------------------------------------------


def cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin_all_threads(pid: int, cpus: Iterable[int]) -> None:
    """Set the affinity of every thread of ``pid`` (new threads inherit their creator's)."""
    subprocess.run(["taskset", "-a", "-pc", cpu_list(cpus), str(pid)], check=True,
                   capture_output=True, text=True, timeout=30)


def thread_affinities(pid: int) -> list[str]:
    """The distinct ``Cpus_allowed_list`` of the threads of ``pid``."""
    found: set[str] = set()
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    found.add(line.split(":", 1)[1].strip())
        except OSError:
            continue  # the thread ended
    return sorted(found)


def jvm_pids(root: int) -> list[int]:
    """The ``java`` processes among the descendants of ``root`` (Spark's JVM)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        names[pid] = text[text.index("(") + 1:text.rindex(")")]
        parents[pid] = int(text[text.rindex(")") + 2:].split()[1])
    out = []
    for pid in parents:
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root and pid != root and names[pid] == "java":
            out.append(pid)
    return sorted(out)


def mariadb_pid() -> int:
    """The local MariaDB's pid: its pid file under ``.dblog``, else ``pgrep``."""
    try:
        return int((dblog_home() / "mariadb" / "run.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        out = subprocess.run(["pgrep", "-o", "-x", "mariadbd"], capture_output=True,
                             text=True, timeout=10).stdout.split()
        if not out:
            raise RuntimeError("MariaDB's pid not found") from None
        return int(out[0])


@dataclass(frozen=True)
class Placement:
    name: str
    app_cpus: tuple[int, ...]  # MariaDB and the writer
    pipeline_cpus: tuple[int, ...]  # the pipeline process and its JVM
    pin_mariadb: bool
    max_rows_per_s: float | None = None  # the capture's read-rate limit (None: none)


# ---- the pipeline process of one placement ------------------------------------------------


def write_for(ep: Endpoints, db: str, args: argparse.Namespace, first_new: int,
              cpus: tuple[int, ...], check: Callable[[], None] | None = None
              ) -> tuple[Commits, list[list[str]]]:
    """The application writer for ``--seconds``: its commits and the writer's affinities.
    ``check`` raises a failure of what runs beside it."""
    commits = Commits()
    with commit_writers(ep, db, tps=args.tps, writers=1, existing=args.rows,
                        first_new=first_new, cpus=cpus, out=commits) as group:
        writer_cpus = [thread_affinities(pid) for pid in group.pids]
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            if check is not None:
                check()
            time.sleep(0.2)
    return commits, writer_cpus


def latency_figures(commits: Commits) -> dict[str, Any]:
    """The writer's latency percentiles (ms) and its rate."""
    return {**percentiles(commits.latency, scale=1000, digits=3),
            "achieved_tps": achieved_tps(commits)}


def round_order(index: int) -> tuple[str, ...]:
    """The sides of round ``index``: forwards, then backwards (ABC CBA ...), so that a drift
    of the machine's speed over the run weighs on every side alike."""
    return SIDES if index % 2 == 0 else tuple(reversed(SIDES))


class Pipeline:
    """The pipeline of one placement, in-process: brought to each side in turn (nothing of
    dblog running, the tailer alone, captures of the table one after another beside that
    tailer, read at most ``max_rows_per_s`` rows a second if set).

    Moving from a capture to the tailer alone stops the capture and waits until its run has
    returned (its chunk writes ended); from the tailer to nothing stops the tailer. A tailer
    started again catches up with the log before a side is measured; a capture started again
    plans a new capture of the whole table and has emitted a chunk first (or
    ``--ramp-timeout`` passed)."""

    def __init__(self, ep: Endpoints, spark: Any, db: str, name: str,
                 args: argparse.Namespace, max_rows_per_s: float | None) -> None:
        from dblog.app.runtime import open_runtime

        self.args = args
        self.table = f"{db}.{TABLE}"
        self.config = pipeline_config(ep, name=name, tables=[self.table],
                                      lake=lake_dir(name) / "lake",
                                      server_id=replica_id(8150, 8199),
                                      read_partitions=args.read_partitions,
                                      max_rows_per_s=max_rows_per_s,
                                      settings={"capture": {
                                          "chunk_max_rows": args.chunk_max_rows}})
        self.batches: list[tuple[int, float]] = []
        self.captures: list[tuple[float, bool]] = []  # seconds, finished
        self._failure: list[BaseException] = []
        self._tailer: Any = None
        self._capture: threading.Thread | None = None
        self._stop = threading.Event()
        self._stack = ExitStack()
        self.rt = self._stack.enter_context(open_runtime(self.config, spark=spark))
        self._stack.callback(lambda: self.rt.state.delete("", recursive=True))

    def check(self) -> None:
        """Raise a failure of the tailer or the capture."""
        if self._tailer is not None:
            self._tailer.check()
        if self._failure:
            raise RuntimeError(f"the capture failed: {self._failure[0]}") from self._failure[0]

    def rows_emitted(self) -> int:
        """Rows the captures so far emitted (or dropped in their windows)."""
        return sum(r.value.rows_emitted + r.value.rows_dropped
                   for c in self.rt.state.list_captures()
                   for r in self.rt.state.list_ranges(c.value.capture_id).values())

    def to(self, side: str) -> dict[str, Any]:
        """Bring the pipeline to ``side``; returns how long that took (and for a capture
        whether its first chunk was emitted first)."""
        began = time.monotonic()
        figures: dict[str, Any] = {}
        if side == "without":
            self._stop_capture()
            self._stop_tailer()
        elif side == "tailer":
            self._stop_capture()
            self._start_tailer()
        else:
            self._start_tailer()
            figures["first_chunk_before_writing"] = self._start_capture()
        figures["seconds"] = round(time.monotonic() - began, 2)
        return figures

    def close(self) -> None:
        """Stop what runs and forget the run's ZooKeeper state."""
        try:
            self._stop_capture()
            self._stop_tailer()
        finally:
            self._stack.close()

    def _start_tailer(self) -> None:
        if self._tailer is not None:
            return
        from dblog.tail.background import BackgroundTailer

        # Stopped without the final merge of the mirrors: the next side would wait for it.
        self._tailer = BackgroundTailer(
            self.rt.tailer(on_batch=record_batches(self.batches)), merge_at_end=False).start()
        self.rt.wait_started(self._tailer.check)
        self.rt.wait_caught_up(self.check, timeout=self.args.ramp_timeout, mirrors=False)

    def _stop_tailer(self) -> None:
        tailer, self._tailer = self._tailer, None
        if tailer is not None:
            tailer.stop()

    def _start_capture(self) -> bool:
        from dblog.capture import plan_request

        if self._capture is not None:
            return True
        progressed = threading.Event()
        stop = self._stop = threading.Event()

        def capture_loop() -> None:
            try:
                while not stop.is_set():
                    began = time.monotonic()
                    capturer = self.rt.capturer()
                    capturer.health_check = self.check
                    capture_id = capturer.plan(plan_request([self.table], None, None))
                    done = capturer.run(capture_id, stop=stop,
                                        on_progress=lambda _: progressed.set())
                    self.captures.append((time.monotonic() - began,
                                          all(r.status == "done" for r in done)))
            except BaseException as exc:  # surfaced by check()
                self._failure.append(exc)

        self._capture = threading.Thread(target=capture_loop, name="capture-loop",
                                         daemon=True)
        self._capture.start()
        deadline = time.monotonic() + self.args.ramp_timeout
        while not progressed.wait(0.2) and time.monotonic() < deadline:
            self.check()
        return progressed.is_set()

    def _stop_capture(self) -> None:
        capture, self._capture = self._capture, None
        if capture is None:
            return
        self._stop.set()
        capture.join(self.args.ramp_timeout + 300)
        if capture.is_alive():
            raise RuntimeError("the capture did not stop")
        self.check()


def measure_rounds(ep: Endpoints, spark: Any, db: str, name: str, placement: Placement,
                   args: argparse.Namespace, next_id: int) -> dict[str, Any]:
    """``--rounds`` rounds of the three sides (:func:`round_order`), the writer timed for
    ``--seconds`` in each: every side's figures over all its rounds, each round's, and the
    capture's and the tailer's work while the writer ran beside them."""
    pipeline = Pipeline(ep, spark, db, name, args, placement.max_rows_per_s)
    pooled = {side: Commits() for side in SIDES}
    rounds: list[dict[str, Any]] = []
    writer_cpus: list[list[str]] = []
    try:
        for index in range(args.rounds):
            per_side: dict[str, Any] = {}
            for side in round_order(index):
                load = round(os.getloadavg()[0], 2)
                change = pipeline.to(side)
                check = None if side == "without" else pipeline.check
                emitted = pipeline.rows_emitted() if side == "with" else 0
                events = sum(e for e, _ in pipeline.batches)
                began = time.monotonic()
                commits, writer_cpus = write_for(ep, db, args, next_id, placement.app_cpus,
                                                 check)
                elapsed = time.monotonic() - began
                if check is not None:
                    check()
                next_id = max([next_id, *commits.key]) + 1
                pooled[side].extend(commits)
                figures = {**latency_figures(commits), "loadavg_1m_before": load,
                           "ramp": change,
                           "tailer_events": sum(e for e, _ in pipeline.batches) - events}
                if side == "with":
                    rows = pipeline.rows_emitted() - emitted
                    figures.update(rows_captured=rows, writing_seconds=round(elapsed, 2),
                                   capture_rows_per_s=round(rows / elapsed, 1))
                per_side[side] = figures
                print(f"  [{time.monotonic() - args.t0:.0f}s] {placement.name} round "
                      f"{index + 1}, {side}: {figures}", flush=True)
            rounds.append(per_side)
        captured_in_all = pipeline.rows_emitted()
    finally:
        pipeline.close()
    out: dict[str, Any] = {
        side: {**latency_figures(pooled[side]),  # the rate: of the rounds, not over the gaps
               "achieved_tps": round(statistics.mean(r[side]["achieved_tps"] for r in rounds),
                                     1)}
        for side in SIDES}
    out["with"]["writer_cpus"] = writer_cpus
    rows_captured = sum(r["with"]["rows_captured"] for r in rounds)
    writing_seconds = sum(r["with"]["writing_seconds"] for r in rounds)
    out["with"]["pipeline"] = {
        "ramp_seconds": [r["with"]["ramp"]["seconds"] for r in rounds],
        "first_chunk_before_writing": all(r["with"]["ramp"].get("first_chunk_before_writing")
                                          for r in rounds),
        "captures_finished": sum(f for _, f in pipeline.captures),
        "capture_seconds_each": [round(s, 1) for s, f in pipeline.captures if f],
        "rows_captured": rows_captured,
        "rows_captured_in_all": captured_in_all,  # the ramps' too
        "capture_rows_per_s": round(rows_captured / writing_seconds, 1)
        if writing_seconds else 0.0,
        "tailer_events_while_writing": sum(r[side]["tailer_events"] for r in rounds
                                           for side in ("tailer", "with")),
        "pipeline_cpus": {"process": thread_affinities(os.getpid()),
                          "jvm": [thread_affinities(p) for p in jvm_pids(os.getpid())]},
        "zookeeper": {"root": pipeline.config.zookeeper_root,
                      "source": pipeline.config.source.name},
    }
    out["rounds"] = rounds
    out["last_id"] = next_id - 1
    return out


def placement_main(ep: Endpoints, db: str, name: str, placement: Placement,
                   args: argparse.Namespace, next_id: int, out: Any) -> None:
    """The pipeline process of one placement (:func:`measure_rounds`). Sends its row and
    exits at once (``os._exit``)."""
    os.sched_setaffinity(0, placement.pipeline_cpus)  # before the JVM starts: it inherits it
    from dblog.app.spark import build_spark_session

    status = 1
    try:
        spark = build_spark_session()
        out.send(measure_rounds(ep, spark, db, name, placement, args, next_id))
        status = 0
    except BaseException as exc:
        traceback.print_exc()
        out.send({"error": repr(exc)[:2000]})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


# ---- the bench process --------------------------------------------------------------------


def run_placement(ep: Endpoints, db: str, rid: str, placement: Placement,
                  args: argparse.Namespace, next_id: int) -> tuple[dict[str, Any], int]:
    """One placement in a pipeline process of its own; MariaDB pinned meanwhile if asked.
    Returns the row and the next free id."""
    name = f"impact-{placement.name}-{rid}"
    row: dict[str, Any] = {"placement": placement.name,
                           "max_rows_per_s": placement.max_rows_per_s,
                           "app_cpus": cpu_list(placement.app_cpus),
                           "pipeline_cpus": cpu_list(placement.pipeline_cpus)}
    db_pid = mariadb_pid()
    db_before = os.sched_getaffinity(db_pid)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=placement_main, name=f"pipeline-{placement.name}",
                       args=(ep, db, name, placement, args, next_id, send))
    found: dict[str, Any] = {}
    if placement.pin_mariadb:
        print(f"  pinning MariaDB (pid {db_pid}) to CPU {cpu_list(placement.app_cpus)}; if "
              f"this is killed, restore it with: taskset -a -pc {cpu_list(db_before)} "
              f"{db_pid}", flush=True)
        pin_all_threads(db_pid, placement.app_cpus)
    try:
        row["mariadb_cpus"] = thread_affinities(db_pid)
        proc.start()
        timeout = args.rounds * (3 * args.seconds + 2 * args.ramp_timeout) + 600
        if not receive.poll(timeout):
            raise RuntimeError(f"the {placement.name} pipeline process sent nothing in "
                               f"{timeout:.0f}s")
        found = receive.recv()
        proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(30)
        if placement.pin_mariadb:
            pin_all_threads(db_pid, db_before)
            print(f"  MariaDB's affinity restored: {thread_affinities(db_pid)}", flush=True)
        _clean_up(ep, found.get("with", {}))
    if "error" in found:
        raise RuntimeError(f"the {placement.name} pipeline process failed: {found['error']}")
    row.update(found)
    # The ratio (with / without), of every round's commits together, and of each
    # round's p99 apart (their median: one round's noise does not decide it).
    row["ratio"] = _ratios(row["with"], row["without"])
    row["ratio_tailer"] = _ratios(row["tailer"], row["without"])
    row["ratio_capture_over_tailer"] = _ratios(row["with"], row["tailer"])
    row["p99_ratio_rounds"] = {
        side: [round(r[side]["p99"] / r["without"]["p99"], 3) for r in row["rounds"]]
        for side in ("tailer", "with")}
    row["p99_ratio_median"] = {side: statistics.median(ratios)
                               for side, ratios in row["p99_ratio_rounds"].items()}
    return row, int(row["last_id"]) + 1


def _ratios(side: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    return {p: (side[p] / base[p] if base.get(p) else None) for p in ("p50", "p95", "p99")}


def _clean_up(ep: Endpoints, measured: dict[str, Any]) -> None:
    """The ZooKeeper state a pipeline process left (it exits without stopping)."""
    from dblog.state import StateStore

    zk = measured.get("pipeline", {}).get("zookeeper")
    if zk:
        state = StateStore.connect(ep.zk_hosts, zk["source"], chroot=zk["root"])
        try:
            state.delete("", recursive=True)
        finally:
            state.close()
        drop_zookeeper_root(ep.zk_hosts, zk["root"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the captured table")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="writing time of each side in each round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the three sides, forwards and backwards in turn")
    parser.add_argument("--tps", type=float, default=300.0,
                        help="the application writer's single-row transactions/s")
    parser.add_argument("--placements", nargs="+",
                        choices=("pinned", "pinned-throttled", "unpinned"),
                        default=["pinned", "pinned-throttled", "unpinned"])
    parser.add_argument("--throttle", type=float, default=3000.0,
                        help="pinned-throttled: the capture's capture.max_rows_per_s")
    parser.add_argument("--ramp-timeout", type=float, default=180.0,
                        help="start writing after the capture's first chunk, or this late")
    parser.add_argument("--chunk-max-rows", type=int, default=None,
                        help="the capture's capture.chunk_max_rows (default: the product's)")
    parser.add_argument("--read-partitions", type=int, default=None,
                        help="the capture's parallel reads of a chunk (default: the product's)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/impact[-smoke].json)")
    parser.add_argument("--keep", action="store_true", help="keep the database and lakes")
    args = parser.parse_args(argv)
    if args.smoke:
        # The ramp waits for the capture's first chunk, so that a capture ran beside the
        # writer (its 2,000 rows are one chunk; a cold JVM takes seconds to emit it).
        args.rows, args.seconds, args.ramp_timeout, args.rounds = 2000, 2.0, 120.0, 2
    output = args.output or RESULTS_DIR / ("impact-smoke.json" if args.smoke else "impact.json")
    args.t0 = time.monotonic()

    # SIGTERM unwinds like Ctrl-C, so MariaDB's affinity is always restored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    own = tuple(sorted(os.sched_getaffinity(0)))
    placements: list[Placement] = []
    skipped: list[str] = []
    for name in args.placements:
        if name == "unpinned":
            placements.append(Placement("unpinned", own, own, False))
        elif len(own) >= 2:
            placements.append(Placement(name, own[:1], own[1:2], True,
                                        args.throttle if name == "pinned-throttled" else None))
        else:
            skipped.append(f"{name} (needs two CPUs)")

    services.up()
    ep = services.endpoints()
    generated = generate_table(ep, "impact", args.rows)
    rid, db, facts, fill_seconds = (generated.run, generated.db, generated.facts,
                                    generated.fill_seconds)
    results: list[dict[str, Any]] = []
    next_id = args.rows + 1
    try:
        for placement in placements:
            row, next_id = run_placement(ep, db, rid, placement, args, next_id)
            results.append(row)
    finally:
        if not args.keep:
            drop_database(ep, db)
            for placement in placements:
                remove_lake(f"impact-{placement.name}-{rid}")
    print()
    print_table(
        ["placement", "dblog", "writes", "tx/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
         "p50 ratio", "p99 ratio", "p99 ratio by round (median)", "requirement"],
        [[r["placement"], SIDE_LABELS[side], r[side]["count"], r[side]["achieved_tps"],
          *[f"{r[side][p]:.3f}" for p in ("p50", "p95", "p99", "max")],
          *([f"{ratios[p]:.2f}x" if ratios[p] else "-" for p in ("p50", "p99")]
            if (ratios := r.get({"with": "ratio", "tailer": "ratio_tailer"}.get(side, ""))
                ) else ["", ""]),
          (" ".join(f"{x:.2f}x" for x in r["p99_ratio_rounds"][side])
           + f" ({r['p99_ratio_median'][side]:.2f}x)" if side != "without" else ""),
          (f"p99 ratio <= {TARGET_PINNED_P99_RATIO}x"
           if side == "with" and r["placement"].startswith("pinned") else "")]
         for r in results for side in SIDES],
    )
    parameters = {
        "rows": args.rows, "seconds": args.seconds, "rounds": args.rounds, "tps": args.tps,
        "insert_share": 0.2,
        "read_partitions": args.read_partitions, "throttle_rows_per_s": args.throttle,
        "chunk_max_rows": args.chunk_max_rows,
        "placements": [p.name for p in placements], "skipped": skipped,
        "ramp_timeout_s": args.ramp_timeout, "smoke": args.smoke,
        "spark_master": spark_conf()["spark.master"],
    }
    path = write_results(output, "impact", parameters, results, {
        "table": {**facts, "generate_seconds": round(fill_seconds, 1), "columns": 10},
        "mariadb": mariadb_version(ep),
        "requirement": {"pinned_p99_ratio_max": TARGET_PINNED_P99_RATIO},
        "bench_seconds": round(time.monotonic() - args.t0, 1),
    })
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
