"""The chunk capture loop: register window → low watermark → select → high watermark → write.

A capture covers tables split into key ranges ``(lower, upper]``; each range is walked in
primary-key order, chunk by chunk. A chunk's extent is planned first (its end key, and the
key ranges its select reads in parallel JDBC partitions); the select, between the low and
the high watermark, keeps the rows in Spark (a local checkpoint). At the high watermark the
tailer pins the window (:mod:`pipeline.handoff`); the capture then writes the chunk's rows as
the changelog's own files, once, and the tailer's commit adds them. Up to ``max_in_flight``
chunks wait for that commit while the next ones are selected. Progress lives in ZooKeeper
and is advanced only by the tailer (with its log position), so a restart continues at the
last emitted chunk.

Every capture ends: before a range's first chunk, an open upper bound is fixed to the table's
greatest key, read once the tailer has a committed log position (rows inserted later reach
the lake through the log). The fixed bound is the range's ``upper`` in its
:class:`~pipeline.state.RangeProgress`; a note at ``captures/<id>/bounds/<range>`` records
that it was fixed, and is the only record when no key lay above the range's lower bound
(the range then ends after one chunk). Chunks continue from their last key in the database's
order (the order the rows came back in), with TIMESTAMP keys read as epoch microseconds, so
no local time zone ever touches a key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial, reduce
from typing import Any, cast

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline import handoff
from pipeline.chunking import (
    ChunkOutcome,
    KeyRange,
    chunk_outcome,
    next_chunk_rows,
    plan_chunk_reads,
    planned_outcome,
)
from pipeline.config import CAPTURE_DEFAULTS
from pipeline.errors import ConfigError, DblogError, StateConflict
from pipeline.events import Key, TableId, Window, key_from_json, key_to_json
from pipeline.faults import crash_point
from pipeline.handoff import chunk_path
from pipeline.lake.chunks import PARTITION_SHIFT, read_order_offsets, write_chunk_files
from pipeline.lake.sink import DeltaSink
from pipeline.lake.types import quote_ident
from pipeline.outage import ride_out
from pipeline.parallel import run_at_once
from pipeline.sources.base import ChunkSpec, SourceDialect, TableSchema
from pipeline.state import Lookout, RangeProgress, StateStore, WindowState
from pipeline.throttle import RowRate

log = logging.getLogger(__name__)

LOOK_S = 1.0
"""A capture waiting for its window's pin or outcome reads them when their ZooKeeper watches
fire, and at least this often (a watch lost with an expired session)."""


@dataclass(frozen=True)
class CaptureOptions:
    """How a capture runs; the sizing defaults are the configuration's (``CaptureConfig``)."""

    chunk_size: int = CAPTURE_DEFAULTS.chunk_size
    """Rows of a range's first chunk (``chunk_sizes`` per table)."""
    chunk_max_rows: int = CAPTURE_DEFAULTS.chunk_max_rows
    """Chunks grow (2x-8x, toward the target) up to this while one takes under half
    ``chunk_target_seconds``."""
    chunk_target_seconds: float = CAPTURE_DEFAULTS.chunk_target_seconds
    max_in_flight: int = CAPTURE_DEFAULTS.max_in_flight
    parallel_ranges: int = CAPTURE_DEFAULTS.parallel_ranges
    """Ranges of a capture that run at once (:meth:`Capturer.run`)."""
    read_partitions: int = CAPTURE_DEFAULTS.read_partitions
    """A chunk of ``read_partitions * read_partition_rows`` rows or more is read by this
    many selects at once, each over its own key range (planned first)."""
    read_partition_rows: int = CAPTURE_DEFAULTS.read_partition_rows
    """A chunk is split into read partitions of at least this many rows."""
    max_rows_per_s: float | None = CAPTURE_DEFAULTS.max_rows_per_s
    """Rows a second the capture reads at most, all ranges of the process together (None:
    no limit); chunks then ask for at most ``chunk_target_seconds`` of them."""
    poll_seconds: float = 0.1
    """How often a waiting capture checks for a stop and the tailer's health; it reads the
    window's pin and outcome when their ZooKeeper watches fire (or every ``LOOK_S``)."""
    emission_timeout_s: float = 600.0
    position_timeout_s: float = 120.0
    """How long a range waits for the tailer's first committed position before it starts."""
    chunk_sizes: dict[TableId, int] = field(default_factory=dict)
    outage_patience_s: float = 120.0
    """How long a capture retries while the source or ZooKeeper cannot be reached."""


@dataclass(frozen=True)
class CaptureRequest:
    """What to capture: tables, optionally only some primary keys or a WHERE filter."""

    tables: tuple[TableId, ...]
    keys: tuple[Key, ...] | None = None
    where: str | None = None

    def __post_init__(self) -> None:
        if not self.tables:
            raise ConfigError("a capture needs at least one table")
        if self.keys is not None and len(self.tables) != 1:
            raise ConfigError("--keys selects rows of exactly one table")
        if self.where is not None and not self.where.strip():
            raise ConfigError("--where must not be empty")


@dataclass
class RangeReport:
    """How one range went (Dagster materialization metadata)."""

    capture_id: str
    range_id: str
    table: TableId
    status: str = "running"
    chunks: int = 0
    rows_selected: int = 0
    rows_emitted: int = 0
    rows_dropped: int = 0
    rows_deleted: int = 0
    """Mirror rows a complete chunk read proved gone from the source (written as deletes)."""
    retries: int = 0
    first_lsn: int | None = None
    last_lsn: int | None = None
    seconds: float = 0.0


def range_id_for(table: TableId, index: int) -> str:
    digest = hashlib.sha1(f"{table.database}\0{table.table}".encode()).hexdigest()[:12]
    return f"{digest}-{index:05d}"


def bounds_path(capture_id: str, range_id: str) -> str:
    """Where a range notes that its upper bound was fixed (and to what)."""
    return f"captures/{capture_id}/bounds/{range_id}"


ORDER_COLUMN = "_dblog_read_order"
"""A chunk's rows are tagged with their read order (monotonic across JDBC partitions read
in key order) to find the last row in the database's order, not Spark's, and to number the
rows without sorting them. A planned select has no ``LIMIT``, and MariaDB drops the
``ORDER BY`` of the subquery it merges: its rows come in the primary key's index order
(for ENUM/SET keys not the string order of the chunk bounds), which only numbers them."""
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def key_columns(schema: TableSchema) -> list[Column]:
    """Spark expressions for a row's key values that Python receives without conversion:
    TIMESTAMP as epoch microseconds (Spark would hand Python the host's local time)."""
    cols = []
    for i, name in enumerate(schema.key):
        col = F.col(_spark_ident(name))
        if schema.column(name).spark_type == "TIMESTAMP":
            col = F.unix_micros(col)
        cols.append(col.alias(f"_k{i}"))
    return cols


def key_from_values(schema: TableSchema, values: Sequence[Any]) -> Key:
    """The key of :func:`key_columns`' values, in the engine's canonical form (TIMESTAMP:
    UTC-aware datetime, as the log decoder gives it)."""
    key = []
    for name, value in zip(schema.key, values, strict=True):
        if value is not None and schema.column(name).spark_type == "TIMESTAMP":
            value = _EPOCH_UTC + dt.timedelta(microseconds=int(value))
        key.append(value)
    return tuple(key)


def first_key(frame: DataFrame, schema: TableSchema) -> Key | None:
    """The key of the frame's first row (``None`` if it has none)."""
    row = frame.select(*key_columns(schema)).first()
    return None if row is None else key_from_values(schema, tuple(row))


def read_summary(tagged: DataFrame, schema: TableSchema, order_column: str, *,
                 with_last: bool = True) -> tuple[int, Key | None, dict[int, int]]:
    """The number of rows, the key of the row with the greatest ``order_column`` (the last
    one read; ``None`` without rows, or when not ``with_last``) and the rows of each read
    partition (the tag's high bits), in one pass.

    Without ``with_last`` the aggregation holds two numbers per partition, which Spark
    aggregates in a hash map; the last row's key is a struct, for which Spark sorts every
    row of the chunk first."""
    found = summary_frame(tagged, schema, order_column, with_last=with_last).collect()
    counts = {int(r["part"]): int(r["rows"]) for r in found}
    if not found or not with_last:
        return sum(counts.values()), None, counts
    last = max(found, key=lambda r: int(r["top"]))["last"]
    return sum(counts.values()), key_from_values(schema, tuple(last)), counts


def summary_frame(tagged: DataFrame, schema: TableSchema, order_column: str, *,
                  with_last: bool) -> DataFrame:
    """:func:`read_summary`'s aggregation: a row per read partition (``part``, ``rows``,
    ``top``, and ``last`` ``with_last``)."""
    order = F.col(_spark_ident(order_column))
    aggregates = [F.count(F.lit(1)).alias("rows"), F.max(order).alias("top")]
    if with_last:
        aggregates.append(F.max_by(F.struct(*key_columns(schema)), order).alias("last"))
    return tagged.groupBy(F.shiftright(order, PARTITION_SHIFT).alias("part")).agg(*aggregates)


def _spark_ident(name: str) -> str:
    return quote_ident(name)


def free_checkpoint(rows: DataFrame) -> None:
    """Drop the blocks of ``rows``, a local checkpoint, from Spark's memory and disk now.

    Left alone, they go only once the driver JVM's garbage collector has collected the
    checkpoint's RDD and Spark's cleaner noticed: on a capture of several million rows the
    chunks' blocks filled the storage memory first, and Spark spent its time moving them to
    disk and the JVM its time marking a full heap (a 5M-row capture at 0.32-0.42x the dump
    against 0.55-0.62x for 1M rows)."""
    plan = rows._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)
    else:  # never so today; the cleaner frees it later
        log.warning("a held chunk is not a local checkpoint (%s): its blocks stay until the "
                    "JVM collects it", plan.getClass().getName())


@dataclass
class HeldChunk:
    """A chunk selected and held (a local checkpoint) until its files are written."""

    window_id: str
    schema: TableSchema
    rows: DataFrame
    """The selected rows, tagged with their read order in ``order``."""
    order: str
    counts: dict[int, int]
    """Rows per read partition."""
    ends_range: bool = False
    """The chunk is its range's last (it read on past the range's fixed upper bound)."""


class ChunkWriter:
    """Writes held chunks' files in threads of their own, so that the next chunks are
    selected meanwhile: the database serves a select while Spark encodes earlier chunks'
    files, and the files of chunks the tailer pinned together are written at once (one
    Spark task each). Up to ``depth`` tasks wait or run (so ``depth + 1`` chunks are held
    with the one being selected); a task's failure raises at the next submit or flush, in
    the order the tasks were given."""

    def __init__(self, write: Callable[[HeldChunk], None], depth: int = 2,
                 workers: int = 2) -> None:
        self._write = write
        self._depth = depth
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="dblog-chunk-writer")
        self._queued: list[Future[None]] = []
        self._barrier: Future[None] | None = None

    def submit(self, chunk: HeldChunk) -> None:
        """Write ``chunk``'s files (beside other chunks', after every :meth:`run` task)."""
        barrier = self._barrier

        def write() -> None:
            if barrier is not None:
                barrier.result()
            self._write(chunk)

        self._enqueue(write)

    def run(self, task: Callable[[], None]) -> None:
        """Run ``task`` alone: after every task before it, before every task after it."""
        self.flush()
        self._barrier = self._enqueue(task)

    def _enqueue(self, task: Callable[[], None]) -> Future[None]:
        while len(self._queued) >= self._depth:
            self._queued.pop(0).result()
        future = self._pool.submit(task)
        self._queued.append(future)
        return future

    def flush(self) -> None:
        """Wait for every task (the first failure raises here)."""
        while self._queued:
            self._queued.pop(0).result()

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.flush()
        finally:
            self._pool.shutdown(wait=True)


class Capturer:
    """Runs captures for one source. Thread-safe per range; ranges may run in parallel."""

    def __init__(
        self,
        *,
        dialect: SourceDialect,
        state: StateStore,
        sink: DeltaSink,
        spark: SparkSession,
        options: CaptureOptions | None = None,
        read_rate: RowRate | None = None,
    ) -> None:
        """``read_rate``: a limit shared with other capturers of the process (default: one
        of its own when ``options.max_rows_per_s`` is set)."""
        self.dialect = dialect
        self.state = state
        self.sink = sink
        self.spark = spark
        self.options = options or CaptureOptions()
        self.read_rate = read_rate or (None if self.options.max_rows_per_s is None
                                       else RowRate(self.options.max_rows_per_s))
        """The read-rate limit this capturer's chunks wait for (None: none)."""
        self.health_check: Callable[[], None] | None = None
        """Called while waiting for emissions; raises if the tailer we rely on died."""

    # ---- planning -------------------------------------------------------------------------

    def plan(
        self,
        request: CaptureRequest,
        *,
        capture_id: str | None = None,
        ranges: dict[TableId, list[KeyRange]] | None = None,
    ) -> str:
        """Register a capture and its key ranges (default: one open range per table)."""
        ride_out(  # refuses unknown tables and tables without a PK; a restart is waited for
            lambda: [self.dialect.table_schema(table) for table in request.tables],
            patience_s=self.options.outage_patience_s,
            what="the capture was not started: run `dblog capture` again once it is back")
        capture_id = capture_id or uuid.uuid4().hex[:16]
        spec: dict[str, Any] = {
            "keys": [key_to_json(k) for k in request.keys] if request.keys is not None else None,
            "where": request.where,
        }
        planned_ranges: dict[str, RangeProgress] = {}
        for table in request.tables:
            planned = (ranges or {}).get(table) or [KeyRange(None, None)]
            for i, kr in enumerate(planned):
                progress = RangeProgress(table, kr.lower, kr.upper, last_emitted_key=kr.lower)
                planned_ranges[range_id_for(table, i)] = progress
        # One ZooKeeper transaction: a capture never exists without its ranges.
        self.state.create_capture(capture_id, request.tables, spec, planned_ranges)
        return capture_id

    # ---- running --------------------------------------------------------------------------

    def run(
        self,
        capture_id: str,
        *,
        stop: threading.Event | None = None,
        on_progress: Callable[[RangeReport], None] | None = None,
    ) -> list[RangeReport]:
        """Run every unfinished range of the capture, ``parallel_ranges`` at a time in
        their order; returns one report each, in their order (a range that a pause, cancel
        or stop kept from starting reports as such). A range that fails stops the others,
        and its error is raised.

        A source or ZooKeeper restart meanwhile is ridden out: the capture goes on from its
        saved progress (ranges already done report as done again)."""
        return ride_out(
            partial(self._run, capture_id, stop=stop, on_progress=on_progress),
            patience_s=self.options.outage_patience_s, stop=stop,
            what=f"capture {capture_id} stopped, its progress saved: run `dblog resume "
                 "TABLE` once the service is back")

    def _run(
        self,
        capture_id: str,
        *,
        stop: threading.Event | None = None,
        on_progress: Callable[[RangeReport], None] | None = None,
    ) -> list[RangeReport]:
        range_ids = sorted(self.state.list_ranges(capture_id))
        if not range_ids:
            raise DblogError(f"capture {capture_id} has no key ranges (its creation was "
                             "interrupted): cancel it and start a new capture")
        ran = run_at_once(
            range_ids,
            lambda range_id, halt: self.run_range(capture_id, range_id, stop=halt,
                                                  on_progress=on_progress),
            workers=self.options.parallel_ranges, stop=stop,
            ends_early=lambda report: report.status in ("paused", "cancelled", "stopped"),
            name=f"capture-{capture_id}")
        by_range = {report.range_id: report for report in ran}
        reports = [by_range.get(range_id) or self._not_started(capture_id, range_id)
                   for range_id in range_ids]
        if all(r.status == "done" for r in reports):
            found = self.state.get_capture(capture_id)
            if found is not None and found.value.status == "running":
                self.state.set_capture_status(capture_id, "done", found.version)
        return reports

    def _not_started(self, capture_id: str, range_id: str) -> RangeReport:
        """The report of a range a pause, cancel or stop kept from starting."""
        progress = self._progress(capture_id, range_id)
        status = self._status(capture_id)
        return RangeReport(capture_id, range_id, progress.table,
                           status="done" if progress.done
                           else status if status in ("paused", "cancelled") else "stopped",
                           rows_emitted=progress.rows_emitted,
                           rows_dropped=progress.rows_dropped,
                           rows_deleted=progress.rows_deleted)

    def _status(self, capture_id: str) -> str:
        found = self.state.get_capture(capture_id)
        if found is None:
            raise DblogError(f"capture {capture_id} does not exist")
        return found.value.status

    def run_range(
        self,
        capture_id: str,
        range_id: str,
        *,
        stop: threading.Event | None = None,
        on_progress: Callable[[RangeReport], None] | None = None,
    ) -> RangeReport:
        """Capture one key range to the end (or until paused, cancelled or stopped)."""
        began = time.monotonic()
        stop = stop or threading.Event()
        found = self.state.get_range(capture_id, range_id)
        if found is None:
            raise DblogError(f"capture {capture_id} has no range {range_id}")
        table = found.value.table
        report = RangeReport(capture_id, range_id, table)
        capture = self.state.get_capture(capture_id)
        assert capture is not None
        keys = capture.value.spec.get("keys")
        where = capture.value.spec.get("where")
        key_list = tuple(cast(Key, key_from_json(k)) for k in keys) if keys is not None else None
        self._recover(capture_id, range_id, stop)
        while True:
            progress = self._progress(capture_id, range_id)
            if progress.done:
                report.status = "done"
                break
            status = self._status(capture_id)
            if status != "running":
                report.status = status
                break
            if stop.is_set():
                report.status = "stopped"
                break
            ends_range = open_end = False
            if key_list is None:
                fixed = self._fix_upper(capture_id, range_id, stop)
                if fixed is None:
                    continue  # stopped while waiting for the tailer
                progress, ends_range, open_end = fixed
            outcome = self._walk(
                capture_id, range_id, progress, key_list, where, stop, report, on_progress,
                ends_range=ends_range, open_end=open_end,
            )
            if outcome == "aborted":
                report.retries += 1
        final = self._progress(capture_id, range_id)
        report.rows_emitted = final.rows_emitted
        report.rows_dropped = final.rows_dropped
        report.rows_deleted = final.rows_deleted
        report.seconds = time.monotonic() - began
        if on_progress is not None:
            on_progress(report)
        return report

    def _fix_upper(
        self, capture_id: str, range_id: str, stop: threading.Event
    ) -> tuple[RangeProgress, bool, bool] | None:
        """Fix an open upper bound to the table's greatest key (once, before the first chunk).

        Returns the progress, whether the range ends with its next chunk (no key lay above
        its lower bound) and whether it was open-ended (then it ends with one chunk past the
        fixed bound, see :meth:`_walk`); ``None`` if stopped while waiting for the tailer.
        The key is read only once the tailer has a committed position: a row inserted later
        lands in the log after it, so the tail brings it.
        """
        while True:
            found = self.state.get_range(capture_id, range_id)
            if found is None:
                raise DblogError(f"range {range_id} of capture {capture_id} disappeared")
            progress = found.value
            if progress.done:
                return progress, False, False
            note = self.state.get(bounds_path(capture_id, range_id))
            if note is not None:
                empty = bool(note.value.get("empty"))
                return progress, empty, not empty
            if progress.upper is not None:
                return progress, False, False
            if not self._wait_for_position(stop):
                return None
            position = self.state.get_position()
            assert position is not None
            schema = self.dialect.table_schema(progress.table)
            top = first_key(
                self.dialect.read_max_key(self.spark, schema, progress.lower), schema
            )
            try:
                if top is not None:
                    self.state.put_range(
                        capture_id, range_id, replace(progress, upper=top), found.version
                    )
                self.state.put(bounds_path(capture_id, range_id), {
                    "upper": key_to_json(top), "empty": top is None,
                    "after_position": position.value.position.to_json(),
                }, None)
            except StateConflict:
                pass  # changed meanwhile (another runner?)
            # Look again: the stored bound (ours, or a concurrent runner's) is the one to use.

    def _wait_for_position(self, stop: threading.Event) -> bool:
        """Wait until the tailer committed a log position; False if stopped meanwhile."""
        deadline = time.monotonic() + self.options.position_timeout_s
        while self.state.get_position() is None:
            if self.health_check is not None:
                self.health_check()
            if stop.is_set():
                return False
            if time.monotonic() >= deadline:
                raise DblogError(
                    f"no tailer committed a log position within "
                    f"{self.options.position_timeout_s:.0f}s: a capture fixes its ranges' "
                    "upper bounds only once the log is tailed; is a tailer running for this "
                    "source? (`dblog tail`)"
                )
            time.sleep(self.options.poll_seconds)
        return True

    def _progress(self, capture_id: str, range_id: str) -> RangeProgress:
        found = self.state.get_range(capture_id, range_id)
        if found is None:
            raise DblogError(f"range {range_id} of capture {capture_id} disappeared")
        return found.value

    def _walk(
        self,
        capture_id: str,
        range_id: str,
        progress: RangeProgress,
        keys: tuple[Key, ...] | None,
        where: str | None,
        stop: threading.Event,
        report: RangeReport,
        on_progress: Callable[[RangeReport], None] | None,
        *,
        ends_range: bool = False,
        open_end: bool = False,
    ) -> str:
        """Select chunks from the last emitted key, pipelined; returns how the walk ended.

        An ``open_end`` range (its upper bound was fixed from "open") ends with a read past
        that bound without an upper limit: it always ends the range, rows inserted up there
        since are current at its high watermark anyway, and when it comes back short it
        proves which mirror keys past the table's old end no longer exist. A planned chunk
        that reaches the bound reads on past it in its own window; a filtered range's chunks
        (not planned) and a range resumed at the bound read past it in one chunk more.
        """
        table = progress.table
        schema = self.dialect.table_schema(table)
        with ChunkWriter(partial(self._write_held, stop=stop)) as writer:
            # The lake's tables made (once) beside the first select, not by the tailer at
            # the first high watermark, where the chunk's files would wait for it.
            writer.run(partial(self.sink.ensure_tables, schema))
            return self._walk_with(writer, capture_id, range_id, progress, schema, keys, where,
                                   stop, report, on_progress, ends_range=ends_range,
                                   open_end=open_end)

    def _walk_with(
        self,
        writer: ChunkWriter,
        capture_id: str,
        range_id: str,
        progress: RangeProgress,
        schema: TableSchema,
        keys: tuple[Key, ...] | None,
        where: str | None,
        stop: threading.Event,
        report: RangeReport,
        on_progress: Callable[[RangeReport], None] | None,
        *,
        ends_range: bool,
        open_end: bool,
    ) -> str:
        """:meth:`_walk`, each selected chunk handed to ``writer`` (it writes the chunk's
        files once the tailer pins it, while the next chunk is selected)."""
        table = progress.table
        first = self.options.chunk_sizes.get(table, self.options.chunk_size)
        limit = first
        after = progress.last_emitted_key
        past_bound = open_end and after is not None and after == progress.upper
        inflight: list[str] = []
        outcome = "done"
        while True:
            if stop.is_set() or self._status(capture_id) != "running":
                outcome = "interrupted"
                break
            while len(inflight) >= self.options.max_in_flight:
                waited = self._wait(inflight[0], report, stop)
                if waited == "interrupted":
                    outcome = "interrupted"
                    break
                inflight.pop(0)
                if waited == "aborted":
                    outcome = "aborted"
                    break
                if on_progress is not None:
                    on_progress(report)
            if outcome in ("aborted", "interrupted"):
                break
            if self.read_rate is not None:
                if not self.read_rate.wait(stop):
                    outcome = "interrupted"
                    break
                limit = min(limit, self.read_rate.chunk_rows(self.options.chunk_target_seconds))
            bounded = open_end and not past_bound
            began = time.monotonic()
            held, rows, last, reached_end = self._chunk(
                capture_id, range_id, table, schema, after,
                None if past_bound else progress.upper, keys, where, limit,
                ends_range=ends_range or past_bound, not_final=bounded,
            )
            wid = held.window_id
            writer.submit(held)
            if self.read_rate is not None:
                self.read_rate.charge(rows)
            report.rows_selected += rows
            limit = next_chunk_rows(
                limit, rows, time.monotonic() - began, first=first,
                most=max(first, self.options.chunk_max_rows),
                target_seconds=self.options.chunk_target_seconds,
            )
            inflight.append(wid)
            report.chunks += 1
            if (reached_end and not bounded) or held.ends_range:
                break
            if reached_end:
                past_bound = True
            after = last
        # On an exception the windows stay open; the next run's _recover settles them.
        # On a stop the windows still in flight stay open; the next run's _recover settles
        # them (the tailer may well emit them meanwhile).
        writer.flush()
        for wid in inflight:
            waited = self._wait(wid, report, stop)
            if waited == "interrupted":
                outcome = "interrupted"
                break
            if waited == "aborted":
                outcome = "aborted"
        self._cleanup(capture_id, range_id)
        return outcome

    def _chunk(
        self,
        capture_id: str,
        range_id: str,
        table: TableId,
        schema: TableSchema,
        after: Key | None,
        upper: Key | None,
        keys: tuple[Key, ...] | None,
        where: str | None,
        limit: int,
        *,
        ends_range: bool = False,
        not_final: bool = False,
    ) -> tuple[HeldChunk, int, Key | None, bool]:
        """One DBLog chunk up to its high watermark: plan, register, LW, select, describe,
        hold, HW (its files are written once the tailer pins it: :meth:`_write_held`).

        Returns the held chunk, its rows, the last key (where the next chunk starts: the
        planned end, the last key read, or ``after`` if none) and whether the chunk reached
        the end of ``(after, upper]``; ``not_final``: even then the range goes on (an
        open-ended range's last chunk reads past ``upper``), unless the chunk's plan reaches
        ``upper``: then it reads on past it itself, to the key space's end, and ends the
        range in the same window (the held chunk's ``ends_range``).
        """
        filtered = keys is not None or (where is not None and bool(where.strip()))
        bounds = None if filtered else self._read_plan(table, after, upper, limit)
        reads_on = (not_final and bounds is not None
                    and (bounds[-1] is None or bounds[-1] == upper))
        if reads_on:
            assert bounds is not None
            bounds = [*bounds[:-1], None]
        read_to = None if reads_on else upper
        wid = uuid.uuid4().hex
        window = Window(wid, table, low=str(uuid.uuid4()), high=str(uuid.uuid4()))
        self.state.register_window(window, {
            "capture_id": capture_id, "range_id": range_id,
            "after_key": key_to_json(after),
        })
        self.dialect.write_watermark(window.low, low=True)  # then the select sees the log
        crash_point("capture.after_lw")
        if bounds is None:
            spec = ChunkSpec(table, limit, after_key=after, upper_key=upper, keys=keys,
                             where=where)
            selected = self.dialect.read_chunk(self.spark, spec, schema)
        else:
            selected = reduce(DataFrame.union, [
                self.dialect.read_chunk(self.spark, ChunkSpec(
                    table, None, after_key=lo, upper_key=read_to if hi is None else hi),
                    schema)
                for lo, hi in zip(bounds, bounds[1:], strict=False)])
        order = ORDER_COLUMN
        while order.lower() in {c.lower() for c in selected.columns}:
            order += "_"  # never a table column's name (Spark names are case-insensitive)
        # Held in Spark (a local checkpoint, on disk if memory runs short); the summary is the
        # first pass over the rows, so it reads them from the database and keeps them.
        tagged = selected.withColumn(order, F.monotonically_increasing_id()).localCheckpoint(
            eager=False)
        # A planned chunk's next one starts at its planned end, or at the range's upper
        # bound: the key read last is needed only without either.
        rows, read_last, counts = read_summary(
            tagged, schema, order,
            with_last=bounds is None or (bounds[-1] is None and upper is None))
        held = HeldChunk(wid, schema, tagged, order, counts, ends_range=reads_on)
        if bounds is None:
            outcome = _outcome(after, upper, rows, limit, read_last, keys, where, ends_range)
            last = read_last if read_last is not None else after
        else:
            end = bounds[-1]
            outcome = planned_outcome(after=after, upper=read_to, end=end,
                                      ends_range=ends_range or reads_on)
            # The chunk read (after, end], or (after, upper] when end is None (past upper
            # too when it reads on; it ends the range then): the next one starts there
            # whatever order the rows came in (a planned select has no LIMIT, and MariaDB
            # drops the ORDER BY of a subquery it merges).
            last = end if end is not None else (
                upper if upper is not None else read_last if read_last is not None else after)
        deletes = outcome.delete_range
        self.state.put(chunk_path(wid), {
            "last_key": key_to_json(last),
            "final": outcome.final and (reads_on or not not_final),
            "capture_id": capture_id, "range_id": range_id,
            "delete_range": None if deletes is None else {
                "after": key_to_json(deletes[0]), "through": key_to_json(deletes[1]),
            },
            "columns": handoff.columns_to_json(schema), "key": list(schema.key),
        }, None)
        handoff.hold(self.state, wid)
        try:
            crash_point("capture.after_select")
            self.dialect.write_watermark(window.high)
            crash_point("capture.after_hw")
        except BaseException:
            handoff.release(self.state, wid)
            raise
        return held, rows, last, outcome.final

    def _read_plan(self, table: TableId, after: Key | None, upper: Key | None,
                   limit: int) -> list[Key | None]:
        """The key bounds ``[after, k1, ..., end]`` of a chunk of ``limit`` rows read by one
        select, or by several at once, ``(after, k1], (k1, k2], ...``; ``end`` None: fewer
        rows were left up to ``upper``, and the last select reads to it.

        Planned before the low watermark, from the primary-key index (each bound reads as
        many index entries as its part has rows). Rows inserted into a part meanwhile are
        read with it: the chunk is ``(after, end]``, whatever it holds at its select. The
        selects have no ``LIMIT``: the source streams their rows instead of materializing
        each select first (see ``build_chunk_sql``)."""
        parts = max(1, min(self.options.read_partitions,
                           limit // self.options.read_partition_rows))
        return plan_chunk_reads(after, upper, limit, parts,
                                partial(self.dialect.key_after, table))

    def _write_held(self, held: HeldChunk, *, stop: threading.Event | None) -> None:
        """Wait for the tailer's pin of a held chunk's window, write the chunk's changelog
        files for it and publish them; again for a newer pin (another tailer took over
        meanwhile). Returns once the files are published for the latest pin, or the window
        is settled, or the capture stopped; then the rows are no longer held (a tailer
        that still waits aborts the window)."""
        wid = held.window_id
        try:
            deadline = time.monotonic() + self.options.emission_timeout_s
            written: tuple[int, str] | None = None
            lookout = Lookout(partial(handoff.watch_pin, self.state, wid), LOOK_S)
            while True:
                if not lookout.due():
                    if stop is not None and stop.is_set():
                        return
                    if self.health_check is not None:
                        self.health_check()
                    lookout.wait(self.options.poll_seconds)
                    continue
                found = self.state.get_window(wid)
                if found is None or found.value.status != "registered":
                    return
                pin = handoff.read_pin(self.state, wid)
                if pin is not None and written != (pin.batch, pin.attempt):
                    files = write_chunk_files(
                        self.spark, self.sink.layout.changelog(held.schema.table),
                        source=self.sink.layout.source, table=held.schema.table,
                        chunk=held.rows, key=held.schema.key, order_column=held.order,
                        offsets=read_order_offsets(held.counts),
                        selected=sum(held.counts.values()), pin=pin)
                    crash_point("capture.before_files")
                    handoff.write_files(self.state, files)
                    written = (pin.batch, pin.attempt)
                    lookout.again()
                    continue  # pinned again meanwhile? (written for the newest pin only)
                if written is not None or (stop is not None and stop.is_set()):
                    return
                if self.health_check is not None:
                    self.health_check()
                if time.monotonic() >= deadline:
                    raise DblogError(
                        f"window {wid} was not pinned within "
                        f"{self.options.emission_timeout_s:.0f}s: is a tailer running for "
                        "this source? (`dblog tail`)")
                lookout.wait(self.options.poll_seconds)
        finally:
            handoff.release(self.state, wid)
            free_checkpoint(held.rows)

    def _wait(self, window_id: str, report: RangeReport,
              stop: threading.Event | None = None) -> str:
        """Wait until the tailer emitted or aborted the window (``"interrupted"``: stopped
        first; the window stays open)."""
        deadline = time.monotonic() + self.options.emission_timeout_s
        lookout = Lookout(partial(self.state.watch_window, window_id), LOOK_S)
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                return "interrupted"
            if not lookout.due():
                if self.health_check is not None:
                    self.health_check()
                lookout.wait(self.options.poll_seconds)
                continue
            found = self.state.get_window(window_id)
            if found is None:
                return "gone"
            status = found.value.status
            if self.health_check is not None:
                self.health_check()
            if status != "registered":
                lsn = found.value.extra.get("position")
                if isinstance(lsn, int):
                    report.first_lsn = lsn if report.first_lsn is None else report.first_lsn
                    report.last_lsn = lsn
                return status
            lookout.wait(self.options.poll_seconds)
        raise DblogError(
            f"window {window_id} was not emitted within {self.options.emission_timeout_s:.0f}s: "
            "is a tailer running for this source? (`dblog tail`)"
        )

    def _recover(self, capture_id: str, range_id: str,
                 stop: threading.Event | None = None) -> None:
        """Settle windows a crashed run left open for this range."""
        for ws in self._range_windows(capture_id, range_id):
            if ws.status != "registered":
                continue
            if handoff.read_files(self.state, ws.window.window_id) is not None:
                # Its files were written (after its high watermark): the tailer commits
                # them, written again for its attempt if need be.
                waited = self._wait(ws.window.window_id,
                                    RangeReport(capture_id, range_id, ws.window.table), stop)
                if waited == "interrupted":
                    return
            else:
                # The selected rows were held by the run that died: select them again.
                self._abandon(ws.window.window_id)
        self._cleanup(capture_id, range_id)

    def _range_windows(self, capture_id: str, range_id: str) -> list[WindowState]:
        """The windows this range registered (any status)."""
        return [
            found.value for found in self.state.list_windows()
            if (found.value.extra.get("capture_id"), found.value.extra.get("range_id"))
            == (capture_id, range_id)
        ]

    def _abandon(self, window_id: str) -> None:
        """Abort a window whose high watermark was never written (the tailer may be noting
        its low watermark at the same moment: re-read and retry)."""
        for _ in range(20):
            found = self.state.get_window(window_id)
            if found is None or found.value.status != "registered":
                return
            try:
                self.state.set_window_status(
                    window_id, "aborted", "capture stopped before its high watermark",
                    found.version,
                )
                return
            except StateConflict:
                time.sleep(0.05)
        raise DblogError(f"could not settle window {window_id}: it keeps changing")

    def _cleanup(self, capture_id: str, range_id: str) -> None:
        """Forget settled windows of this range: chunk descriptions (with their pins and
        files) and window documents. Files a window's pins had written and no commit added
        are left to VACUUM (it removes them once older than the table's retention)."""
        for ws in self._range_windows(capture_id, range_id):
            if ws.status == "registered":
                continue
            wid = ws.window.window_id
            self.state.delete(chunk_path(wid), recursive=True)
            self.state.remove_window(wid)


def _outcome(after: Key | None, upper: Key | None, rows: int, limit: int, last: Key | None,
             keys: tuple[Key, ...] | None, where: str | None, ends_range: bool) -> ChunkOutcome:
    """:func:`pipeline.chunking.chunk_outcome` of one chunk select (``last``: None if empty)."""
    filtered = keys is not None or (where is not None and bool(where.strip()))
    return chunk_outcome(after=after, upper=upper, rows=rows, limit=limit,
                         last=last if rows else None, filtered=filtered, ends_range=ends_range)


def plan_request(tables: Sequence[str], keys: Sequence[str] | None, where: str | None
                 ) -> CaptureRequest:
    """Build a request from CLI-style strings (keys as comma-separated values per key)."""
    parsed = tuple(TableId.parse(t) for t in tables)
    key_tuples = None
    if keys:
        key_tuples = tuple(tuple(_literal(v) for v in k.split(",")) for k in keys)
    return CaptureRequest(parsed, key_tuples, where)


def _literal(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text
