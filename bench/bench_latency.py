"""Latency: from a source commit to visible in the changelog and in the mirror, under a steady
write rate, against the bare mysql-replication decode loop's commit-to-decoded latency on the
same workload.

Writers (``--writers`` processes, ``--tps`` single-row autocommit transactions/s in all: 20%
inserts of new ids, 80% updates that set ``flags`` to a unique sequence number) record the
wall-clock time each COMMIT returned (MariaDB sends the event to the log's readers before the
client reads its OK, so the bare loop's figures can be a fraction of a millisecond below
zero). Two phases of ``--seconds`` each, in one process:

* baseline: a thread reads the binlog with a bare ``BinLogStreamReader`` (rows events of the
  table only, ``freeze_schema``, blocking) and stamps each row when it is decoded;
* dblog: the tailer runs in the background (``BackgroundTailer``, the product's default tail
  settings, one SparkSession; a small batch before created the Delta tables and warmed the
  JVM) while a poller thread watches the changelog's and the mirror's Delta version every
  ``--poll`` seconds with the ``deltalake`` package (no Spark). For each new version it reads
  only the files that version added (ids and ``flags``) and stamps their rows with the
  commit's time: the modification time of the version's ``_delta_log`` entry, i.e. when a
  reader could first see it (the poller's own delay is reported beside it). An update counts
  as visible in the mirror once the mirror shows that key at this update or a later one (the
  MERGE keeps one row per key).

With ``--capture``, a capture of the whole table (``--prefill`` rows; give it enough to last
the phase) starts in the dblog phase once the writers run: the writes' latency then includes
what a capture beside the tail costs them (a batch that holds a chunk's high watermark waits
for the chunk's files). ``--chunk-target-seconds``, ``--chunk-max-rows``,
``--max-rows-per-s`` and ``--pin-ahead-s`` set the capture's and the tailer's settings of the
same names (the product's defaults otherwise): the trade between a capture's speed and the
log's latency beside it.

Writes of the first ``--warmup`` seconds are left out. Prints p50/p95/p99/max seconds of each
path, dblog / baseline for p50 and p99 and the issue's targets (p50 ≤ 2 s, p99 ≤ 5 s to the
changelog; printed, never asserted), and writes ``bench/results/latency.json``.

    .venv/bin/python -m bench.bench_latency [--tps 1000] [--seconds 60] [--smoke]
    .venv/bin/python -m bench.bench_latency --capture --prefill 1000000 --output ...
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

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
    record_batches,
    remove_lake,
    run_id,
    table_facts,
    write_results,
)
from bench.cpu import process_cpu_seconds, python_threads, snapshot, spent_since, threads_since
from bench.workload import (
    INSERT,
    Commits,
    achieved_tps,
    commit_writers,
    drop_zookeeper_root,
    percentiles,
    replica_id,
)
from devtools import services
from devtools.sample import connect, q
from devtools.services import Endpoints

MARKS = "marks"  # the baseline's start and end markers (not a tracked table)
TARGETS = {"changelog_p50_s": 2.0, "changelog_p99_s": 5.0}


def _head(ep: Endpoints) -> tuple[str, int]:
    conn = connect(ep)
    with conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
    conn.close()
    return str(row[0]), int(row[1])


def _mark(ep: Endpoints, db: str, n: int) -> None:
    conn = connect(ep, db)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {q(MARKS)} VALUES (%s)", (n,))  # noqa: S608
    conn.close()


class BareDecoder(threading.Thread):
    """The baseline: a blocking ``BinLogStreamReader`` from ``start``, stamping
    ``time.time()`` as each row of the bench table is decoded (inserts by id, updates by
    ``flags``), until the end marker."""

    def __init__(self, ep: Endpoints, db: str, start: tuple[str, int]) -> None:
        super().__init__(name="bare-decoder", daemon=True)
        self.ep, self.db, self.start_at = ep, db, start
        self.inserts: dict[int, float] = {}
        self.updates: dict[int, float] = {}
        self.rows = 0
        self.started = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

        stream = BinLogStreamReader(
            connection_settings={"host": self.ep.host, "port": self.ep.mariadb_port,
                                 "user": self.ep.user, "password": self.ep.mariadb_password,
                                 "charset": "utf8mb4"},
            server_id=replica_id(8140, 8149),
            log_file=self.start_at[0], log_pos=self.start_at[1], resume_stream=True,
            blocking=True, only_events=[WriteRowsEvent, UpdateRowsEvent],
            only_tables=[TABLE, MARKS], only_schemas=[self.db],
            freeze_schema=True, is_mariadb=False, enable_logging=False,
        )
        try:
            for event in stream:
                rows = event.rows  # decodes every row image
                now = time.time()
                if event.table == MARKS:
                    if any(r["values"]["n"] == 2 for r in rows):
                        return
                    self.started.set()
                    continue
                self.rows += len(rows)
                if isinstance(event, WriteRowsEvent):
                    for r in rows:
                        self.inserts.setdefault(int(r["values"]["id"]), now)
                else:
                    for r in rows:
                        seq = r["after_values"]["flags"]
                        if seq is not None:
                            self.updates.setdefault(int(seq), now)
        except BaseException as exc:  # reported by the caller
            self.error = exc
        finally:
            stream.close()

    def decoded_time(self, kind: int, key: int, seq: int) -> float | None:
        return self.inserts.get(key) if kind == INSERT else self.updates.get(seq)


class DeltaWatch:
    """One Delta table's versions as the poller saw them."""

    def __init__(self, path: str) -> None:
        from deltalake import DeltaTable

        self.path = path
        self.table = DeltaTable(path)
        self.version = self.table.version()
        self.files: set[str] = set()
        self.poll_delays: list[float] = []

    def new_versions(self) -> list[tuple[float, list[str]]]:
        """Each version committed since the last call: its log entry's time and the data
        files it added (never seen before)."""
        self.table.update_incremental()
        latest = self.table.version()
        seen = time.time()
        out = []
        for v in range(self.version + 1, latest + 1):
            entry = Path(self.path) / "_delta_log" / f"{v:020d}.json"
            committed = entry.stat().st_mtime
            added = []
            for line in entry.read_text().splitlines():
                add = json.loads(line).get("add") if line.strip() else None
                if add is not None and add["path"] not in self.files:
                    self.files.add(add["path"])
                    added.append(str(Path(self.path) / unquote(add["path"])))
            self.poll_delays.append(seen - committed)
            out.append((committed, added))
        self.version = latest
        return out


class LakePoller(threading.Thread):
    """Stamps when each write became visible in the changelog and in the mirror."""

    def __init__(self, changelog: str, mirror: str, existing: int, interval: float) -> None:
        super().__init__(name="lake-poller", daemon=True)
        self.changelog, self.mirror = DeltaWatch(changelog), DeltaWatch(mirror)
        self.existing, self.interval = existing, interval
        self.lock = threading.Lock()
        self.cl_inserts: dict[int, float] = {}
        self.cl_updates: dict[int, float] = {}
        self.mi_inserts: dict[int, float] = {}
        self.mi_keys: dict[int, tuple[list[int], list[float]]] = {}  # key: (seqs, times)
        self.versions = {"changelog": 0, "mirror": 0}
        self.read_seconds = 0.0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.interval):
                self.poll()
            self.poll()
        except BaseException as exc:  # reported by the caller
            self.error = exc

    def poll(self) -> None:
        def ints(column: Any) -> list[Any]:
            return list(pc.cast(column, pa.int64()).to_pylist())

        changelog, mirror = self.changelog.new_versions(), self.mirror.new_versions()
        began = time.perf_counter()
        for committed, files in changelog:
            self.versions["changelog"] += 1
            for path in files:
                t = pq.read_table(path, columns=["op", "after"])
                after = t.column("after")
                rows = zip(t.column("op").to_pylist(), ints(pc.struct_field(after, "id")),
                           ints(pc.struct_field(after, "flags")), strict=True)
                with self.lock:
                    for op, key, seq in rows:
                        if op == "c":
                            self.cl_inserts.setdefault(key, committed)
                        elif op == "u" and seq is not None:
                            self.cl_updates.setdefault(seq, committed)
        for committed, files in mirror:
            self.versions["mirror"] += 1
            for path in files:
                t = pq.read_table(path, columns=["id", "flags"])
                with self.lock:
                    for key, seq in zip(ints(t.column("id")), ints(t.column("flags")),
                                        strict=True):
                        if key > self.existing:
                            self.mi_inserts.setdefault(key, committed)
                        elif seq is not None:
                            seqs, times = self.mi_keys.setdefault(key, ([], []))
                            if not seqs or seq > seqs[-1]:
                                seqs.append(seq)
                                times.append(committed)
        self.read_seconds += time.perf_counter() - began

    def changelog_time(self, kind: int, key: int, seq: int) -> float | None:
        with self.lock:
            return (self.cl_inserts if kind == INSERT else self.cl_updates).get(
                key if kind == INSERT else seq)

    def mirror_time(self, kind: int, key: int, seq: int) -> float | None:
        with self.lock:
            if kind == INSERT:
                return self.mi_inserts.get(key)
            seqs, times = self.mi_keys.get(key, ([], []))
            i = bisect.bisect_left(seqs, seq)
            return times[i] if i < len(seqs) else None


def latencies(commits: Commits, since: float,
              visible: Mapping[str, Callable[[int, int, int], float | None]]
              ) -> dict[str, tuple[list[float], int]]:
    """Per path: the commit-to-visible seconds of the commits after ``since`` and how many
    of them were never seen."""
    out: dict[str, tuple[list[float], int]] = {}
    for name, lookup in visible.items():
        values: list[float] = []
        unseen = 0
        for kind, key, seq, committed in zip(commits.kind, commits.key, commits.seq,
                                              commits.committed, strict=True):
            if committed < since:
                continue
            t = lookup(kind, key, seq)
            if t is None:
                unseen += 1
            else:
                values.append(t - committed)
        out[name] = (values, unseen)
    return out


def summary(values: list[float], unseen: int) -> dict[str, Any]:
    return {**percentiles(values, digits=6), "unseen": unseen}


def baseline_phase(ep: Endpoints, db: str, args: argparse.Namespace, first_new: int
                   ) -> tuple[dict[str, Any], Commits]:
    """Writers for ``--seconds`` while the bare decoder reads the binlog."""
    decoder = BareDecoder(ep, db, _head(ep))
    decoder.start()
    _mark(ep, db, 1)
    if not decoder.started.wait(60):
        raise RuntimeError(f"the bare decoder did not start: {decoder.error}")
    commits = Commits()
    with commit_writers(ep, db, tps=args.tps, writers=args.writers, existing=args.prefill,
                        first_new=first_new, out=commits):
        began = time.time()  # every writer committed once
        time.sleep(args.seconds)
    _mark(ep, db, 2)
    decoder.join(args.drain_timeout)
    if decoder.error is not None:
        raise RuntimeError(f"the bare decoder failed: {decoder.error}") from decoder.error
    lat = latencies(commits, began + args.warmup, {"decoded": decoder.decoded_time})
    return {"commits": len(commits), "achieved_tps": achieved_tps(commits),
            "rows_decoded": decoder.rows, "decoded": summary(*lat["decoded"])}, commits


class CaptureBeside(threading.Thread):
    """A capture of ``table`` to its end, in a thread of its own (``--capture``)."""

    def __init__(self, rt: Any, table: Any, health_check: Callable[[], None]) -> None:
        from dblog.capture import CaptureRequest

        super().__init__(name="capture-beside", daemon=True)
        self.capturer = rt.capturer()
        self.capturer.health_check = health_check
        self.capture_id = self.capturer.plan(CaptureRequest((table,)))
        self.halt = threading.Event()
        self.statuses: list[str] = []
        self.rows = 0
        self.chunks = 0
        self.error: BaseException | None = None
        self.began = time.monotonic()
        self.seconds: float | None = None
        self.start()

    def run(self) -> None:
        try:
            reports = self.capturer.run(self.capture_id, stop=self.halt)
            self.statuses = [r.status for r in reports]
            self.rows = sum(r.rows_selected for r in reports)
            self.chunks = sum(r.chunks for r in reports)
        except BaseException as exc:  # reported by finish()
            self.error = exc
        self.seconds = time.monotonic() - self.began

    def check(self) -> None:
        """Raise the capture's failure as soon as it happened, not at the phase's end."""
        if self.error is not None:
            raise RuntimeError(f"the capture beside failed: {self.error}") from self.error

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for the capture's end (stop it after ``timeout``); what it did."""
        self.join(timeout)
        if self.is_alive():
            self.halt.set()
            self.join(60)
        self.check()
        return {"statuses": self.statuses, "rows_selected": self.rows, "chunks": self.chunks,
                "seconds": None if self.seconds is None else round(self.seconds, 2)}


def dblog_phase(ep: Endpoints, spark: Any, db: str, name: str, args: argparse.Namespace,
                first_new: int) -> tuple[dict[str, Any], Commits]:
    """Writers for ``--seconds`` while the tailer runs and the poller watches the lake."""
    from dblog.app.runtime import open_runtime
    from dblog.core.events import TableId
    from dblog.tail.background import BackgroundTailer

    config = pipeline_config(ep, name=name, tables=[f"{db}.{TABLE}"],
                             lake=lake_dir(name) / "lake", server_id=replica_id(8100, 8139),
                             max_rows_per_s=args.max_rows_per_s,
                             settings={"capture": {
                                 "chunk_target_seconds": args.chunk_target_seconds,
                                 "chunk_max_rows": args.chunk_max_rows},
                                 "tail": {"pin_ahead_s": args.pin_ahead_s}})
    table = TableId(db, TABLE)
    batches: list[tuple[int, float]] = []
    timeline: list[dict[str, Any]] = []
    """Per written batch: when (since the tailer started), its log events and seconds, the
    chunks it emitted and how far behind the source its last transaction was at its commit."""
    commits = Commits()
    with open_runtime(config, spark=spark) as rt:
        try:
            # Warm-up: the first run stores the head as the position; a few rows then create
            # the Delta tables (and warm the JVM), so the measured phase only tails.
            rt.tailer().run(until_caught_up=True)
            fill(ep, db, 10, first=first_new)
            rt.tailer().run(until_caught_up=True)
            poller = LakePoller(rt.layout.changelog(table), rt.layout.mirror(table),
                                args.prefill, args.poll)
            poller.start()
            record = record_batches(batches)
            t_phase = time.time()

            def on_batch(report: Any) -> None:
                record(report)
                if not report.mirror_only:
                    now = time.time()
                    timeline.append({
                        "at_s": round(now - t_phase, 2), "events": report.events,
                        "seconds": round(report.seconds, 2),
                        "chunks": len(report.emitted_windows),
                        "chunk_rows": report.rows_emitted,
                        "behind_s": (round(now - report.commit_ts_ms / 1000, 2)
                                     if report.commit_ts_ms else None)})

            tailer = rt.tailer(on_batch=on_batch)
            with BackgroundTailer(tailer) as bg:
                with commit_writers(ep, db, tps=args.tps, writers=args.writers,
                                    existing=args.prefill, first_new=first_new + 20,
                                    out=commits) as writers:
                    began = time.time()  # every writer committed once
                    cpu_before, threads_before = snapshot(), python_threads()
                    writers_before = [process_cpu_seconds(p) or 0.0 for p in writers.pids]
                    capture = CaptureBeside(rt, table, bg.check) if args.capture else None
                    deadline = time.monotonic() + args.seconds
                    while time.monotonic() < deadline:
                        bg.check()
                        if capture is not None:
                            capture.check()
                        time.sleep(0.2)
                    cpu: dict[str, Any] = dict(spent_since(cpu_before))
                    cpu["writers"] = round(sum(
                        (process_cpu_seconds(p) or b) - b
                        for p, b in zip(writers.pids, writers_before, strict=True)), 2)
                    # Here the total counts the writers too (bench_capture's has none).
                    cpu["total"] = round(cpu["total"] + cpu["writers"], 2)
                    cpu["python_threads"] = threads_since(threads_before)
                stopped = time.time()
                captured = None if capture is None else capture.finish(args.drain_timeout)
                # Drain: until every write is visible in both tables (or the timeout).
                pending = list(zip(commits.kind, commits.key, commits.seq, strict=True))
                deadline = time.monotonic() + args.drain_timeout
                while pending and poller.error is None and time.monotonic() < deadline:
                    bg.check()
                    time.sleep(0.5)
                    pending = [w for w in pending if poller.changelog_time(*w) is None
                               or poller.mirror_time(*w) is None]
                drained = time.time() - stopped
                poller.stop.set()
                poller.join(30)
            if poller.error is not None:
                raise RuntimeError(f"the lake poller failed: {poller.error}") from poller.error
        finally:
            rt.state.delete("", recursive=True)
    drop_zookeeper_root(ep.zk_hosts, config.zookeeper_root)
    lat = latencies(commits, began + args.warmup, {"changelog": poller.changelog_time,
                                                   "mirror": poller.mirror_time})
    delays = poller.changelog.poll_delays + poller.mirror.poll_delays
    return {
        "commits": len(commits), "achieved_tps": achieved_tps(commits),
        "changelog": summary(*lat["changelog"]), "mirror": summary(*lat["mirror"]),
        "drain_seconds": round(drained, 2),
        "cpu_seconds_while_writing": cpu,
        "delta_versions": dict(poller.versions),
        "poller": {"interval_s": args.poll, "read_seconds": round(poller.read_seconds, 2),
                   "delay_after_commit": percentiles(delays)},
        "tailer_batches": len(batches),
        "tailer_events": sum(e for e, _ in batches),
        "tailer_batch_seconds": percentiles([s for _, s in batches], digits=2),
        "tailer_timeline": timeline,
        "capture": captured,
        "tail": {"batch_max_events": config.tail.batch_max_events,
                 "batch_max_seconds": config.tail.batch_max_seconds,
                 "poll_seconds": config.tail.poll_seconds},
    }, commits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tps", type=float, default=1000.0,
                        help="single-row transactions/s of all writers together")
    parser.add_argument("--writers", type=int, default=2, help="writer processes")
    parser.add_argument("--seconds", type=float, default=60.0, help="writing time per phase")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="leave out the writes of the first seconds of each phase")
    parser.add_argument("--prefill", type=int, default=10_000,
                        help="rows in the table first (the updates' targets)")
    parser.add_argument("--poll", type=float, default=0.1,
                        help="seconds between the lake poller's looks at the Delta versions")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="after the writers stop, wait this long for the rest to appear")
    parser.add_argument("--capture", action="store_true",
                        help="capture the table (--prefill rows) beside the tail in the "
                             "dblog phase")
    parser.add_argument("--chunk-target-seconds", type=float, default=None,
                        help="the capture's capture.chunk_target_seconds (default: the "
                             "product's)")
    parser.add_argument("--chunk-max-rows", type=int, default=None,
                        help="the capture's capture.chunk_max_rows (default: the product's)")
    parser.add_argument("--max-rows-per-s", type=float, default=None,
                        help="the capture's capture.max_rows_per_s (default: no limit)")
    parser.add_argument("--pin-ahead-s", type=float, default=None,
                        help="the tailer's tail.pin_ahead_s (default: the product's)")
    parser.add_argument("--warm-rounds", type=int, default=0,
                        help="run the dblog phase this many times first in the same JVM "
                             "(results dropped): measure a warm JVM")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/latency[-smoke].json)")
    parser.add_argument("--keep", action="store_true", help="keep the database and lake")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tps, args.writers, args.seconds = min(args.tps, 200.0), 1, 3.0
        args.warmup, args.prefill, args.drain_timeout = 1.0, 1000, 60.0
    output = args.output or RESULTS_DIR / ("latency-smoke.json" if args.smoke
                                           else "latency.json")

    from dblog.app.spark import build_spark_session

    t0 = time.monotonic()
    services.up()
    ep = services.endpoints()
    rid = run_id()
    db = f"bench_latency_{rid}"
    name = f"latency-{rid}"
    print(f"latency bench {rid}: {db}.{TABLE}, {args.prefill:,} rows first; "
          f"{args.tps:,.0f} tx/s for {args.seconds:.0f}s per phase", flush=True)
    create_database(ep, db)
    fill(ep, db, args.prefill)
    conn = connect(ep, db)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {q(MARKS)} (n INT NOT NULL) ENGINE=InnoDB")
    conn.close()
    facts = table_facts(ep, db)
    spark = build_spark_session()
    try:
        load = round(os.getloadavg()[0], 2)
        print(f"  [{time.monotonic() - t0:.0f}s] baseline: bare decode (load average {load}) ...",
              flush=True)
        base, written = baseline_phase(ep, db, args, args.prefill + 1)
        base["loadavg_1m_before"] = load
        print(f"    {base}", flush=True)
        first_new = args.prefill + 1 + 10_000_000  # past every id the baseline inserted
        assert not written.key or max(written.key) < first_new
        load = round(os.getloadavg()[0], 2)
        print(f"  [{time.monotonic() - t0:.0f}s] dblog: tailer into Delta (load average {load}) "
              "...", flush=True)
        for i in range(args.warm_rounds):
            # The same phase in this JVM first, its results dropped: the measured one runs
            # with Spark's and Delta's code compiled (a long-running tailer's state).
            try:
                warm, _ = dblog_phase(ep, spark, db, f"{name}-warm{i}", args,
                                      first_new + (i + 1) * 10_000_000)
            finally:
                if not args.keep:
                    remove_lake(f"{name}-warm{i}")
            print(f"    warm round {i + 1}: changelog p50 {warm['changelog'].get('p50')} s, "
                  f"p99 {warm['changelog'].get('p99')} s; C2 "
                  f"{warm['cpu_seconds_while_writing'].get('jvm_jit_c2')} CPU-s", flush=True)
        dblog, _ = dblog_phase(ep, spark, db, name, args,
                               first_new + (args.warm_rounds + 1) * 10_000_000)
        dblog["loadavg_1m_before"] = load
        print(f"    {dblog}", flush=True)
    finally:
        if not args.keep:
            drop_database(ep, db)
            remove_lake(name)
    # No ratio against a baseline at or below zero (the bare loop decoded most writes before
    # their client read the OK): the table shows "-" and the seconds say the rest.
    ratios = {f"{path}_{p}": (dblog[path][p] / base["decoded"][p]
                              if (base["decoded"].get(p) or 0) > 0
                              and dblog[path].get(p) is not None else None)
              for path in ("changelog", "mirror") for p in ("p50", "p99")}
    results = {"baseline": base, "dblog": dblog, "ratio": ratios, "targets": TARGETS,
               "bench_seconds": round(time.monotonic() - t0, 1)}

    def row(label: str, s: dict[str, Any], tps: float, target: str) -> list[Any]:
        return [label, s["count"], s["unseen"], tps,
                *[f"{s[p]:.4f}" if p in s else "-" for p in ("p50", "p95", "p99", "max")],
                target]

    print()
    print_table(
        ["commit to", "rows", "unseen", "tx/s", "p50 s", "p95 s", "p99 s", "max s", "target"],
        [row("decoded (bare loop)", base["decoded"], base["achieved_tps"], "baseline"),
         row("changelog (dblog)", dblog["changelog"], dblog["achieved_tps"],
             "p50 <= 2 s, p99 <= 5 s"),
         row("mirror (dblog)", dblog["mirror"], dblog["achieved_tps"], "-")],
    )
    print()
    print_table(["dblog / baseline", "p50", "p99"],
                [[path, *[f"{ratios[f'{path}_{p}']:,.1f}x" if ratios[f"{path}_{p}"] else "-"
                          for p in ("p50", "p99")]] for path in ("changelog", "mirror")])
    cpu = dblog["cpu_seconds_while_writing"]
    print()
    cores = os.cpu_count() or 1
    print(f"CPU seconds while the writers ran ({args.seconds:.0f} s, {cores} cores: "
          f"{cores * args.seconds:.0f} at most): " + ", ".join(
              f"{k} {v}" for k, v in cpu.items()
              if k in ("total", "writers", "mariadb", "python", "jvm") or k.startswith("jvm_")))
    print("  this process's threads: " + ", ".join(
        f"{k} {v}" for k, v in list(cpu["python_threads"].items())[:8]))
    parameters = {
        "tps": args.tps, "writers": args.writers, "seconds": args.seconds,
        "warmup_s": args.warmup, "prefill": args.prefill, "poll_s": args.poll,
        "drain_timeout_s": args.drain_timeout, "insert_share": 0.2, "smoke": args.smoke,
        "capture": args.capture, "chunk_target_seconds": args.chunk_target_seconds,
        "chunk_max_rows": args.chunk_max_rows, "max_rows_per_s": args.max_rows_per_s,
        "pin_ahead_s": args.pin_ahead_s, "warm_rounds": args.warm_rounds,
        "spark_master": spark.conf.get("spark.master"),
    }
    path = write_results(output, "latency", parameters, results, {
        "table": {**facts, "columns": 10}, "mariadb": mariadb_version(ep),
    })
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
