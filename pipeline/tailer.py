"""The log tailer: the one ordered writer of a source's changelog and mirror.

Loop: read committed transactions → window processor → micro-batch → Delta (idempotent per
batch) → one ZooKeeper transaction moving the position and recording every chunk emitted.

Crash safety:
* a batch intent (start/end positions) is written before any Delta write, so a restarted
  tailer rebuilds exactly the same batch, and Delta skips the parts already committed;
* where a window's low watermark was seen is stored with the batch that saw it
  (``lw_resume``); a restart re-reads the log from the earliest such point in *warm-up*
  (keys are recorded, nothing is written) so open windows keep every key they saw;
* a chunk is emitted only if it continues its range's progress exactly (its lower bound is
  the last emitted key); otherwise it is aborted and the capture re-selects it, so no chunk is
  ever emitted twice and progress never skips rows;
* at a chunk's high watermark the tailer pins the window (:mod:`pipeline.handoff`) and reads
  on; the batch is written once the capture wrote the changelog files of every chunk it
  pinned, so the captures write several chunks at once while the tailer reads and pins. A
  capture that died holding the rows gets its window aborted, and with it every chunk of the
  same range pinned after it (a range's chunks are emitted in key order or not at all).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeGuard

from pipeline import handoff
from pipeline.batching import BatchCutter, Cut, Due, ReplayMismatch
from pipeline.chunking import KeyRange
from pipeline.config import TailConfig
from pipeline.errors import DblogError, LeadershipLost, SourceError, StateConflict
from pipeline.events import ChangeEvent, Position, TableId, WatermarkEvent, key_from_json
from pipeline.faults import crash_point
from pipeline.handoff import ChunkFiles, ChunkPin, chunk_path
from pipeline.heal import Healer, request_heal
from pipeline.lake.sink import DeltaSink, TableBatch, WriteAttempt
from pipeline.mirror import MirrorMerger, behind_the_log, mirror_due
from pipeline.prefetch import PrefetchingReader
from pipeline.sources.base import (
    SchemaChange,
    SourceDialect,
    TableSchema,
    Transaction,
    UnloggedChange,
    confirm_log,
)
from pipeline.state import (
    ABSENT,
    BATCH_INTENT,
    BatchIntent,
    CommitResult,
    Lookout,
    PositionState,
    RangeProgress,
    RangeUpdate,
    StateStore,
    StateUnavailable,
    Versioned,
    WindowState,
    WindowUpdate,
)
from pipeline.window import (
    ChunkEmission,
    UnknownWatermark,
    WindowAborted,
    WindowProcessor,
)

log = logging.getLogger(__name__)

EXPIRY_CHECK_S = 30.0
"""How often the tailer looks for expired windows (besides once at each start)."""
QUIET_S = 5.0
"""``--until-caught-up`` also ends after the reader found nothing new this long."""
PINNED_POLL_S = 0.02
"""How long the log reader waits for more while the batch waits for pinned chunks' files:
how soon the batch is written once they are published (no ZooKeeper read in between)."""
FILES_LOOK_S = 1.0
"""A pinned chunk's handoff is read when its ZooKeeper watches fire, and at least this often
(its files' deadline; a watch lost with an expired session)."""
CAPTURE_GAP_S = 5.0
"""For the mirror, a capture goes on for this long after the tailer settled one of its
windows, while ZooKeeper says it runs: its next chunk is being planned, or it waits for
its chunks' emission before it selects more (:meth:`Tailer._capturing`)."""
FILES_WAIT_S = 0.1
"""How long a batch that must be written waits for a watch before it checks for a stop."""


MIRROR_DOC = "mirror"
"""ZooKeeper document: the committed position every mirror has merged through."""
NOTICES = "notices"
"""ZooKeeper folder of per-table notices (a DDL that may have rewritten rows)."""


def notice_path(table: TableId) -> str:
    """Where the notice about ``table`` is kept (a name ZooKeeper accepts for any table)."""
    digest = hashlib.sha1(f"{table.database}\0{table.table}".encode()).hexdigest()[:16]
    return f"{NOTICES}/{digest}"


def new_generation() -> str:
    """A fresh name for a line of batch numbers (see ``PositionState.generation``)."""
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class TailOptions:
    """How the tailer runs; the defaults of the settings a configuration has are its own
    (``TailConfig``)."""

    batch_max_events: int = TailConfig.batch_max_events
    batch_max_seconds: float = TailConfig.batch_max_seconds
    poll_seconds: float = TailConfig.poll_seconds
    read_transactions: int = 2000
    window_expiry_s: float = TailConfig.window_expiry_s
    """A registered window whose high watermark is not seen within this many seconds of
    its registration is aborted (0: never)."""
    maintain_every_s: float = TailConfig.maintain_every_s
    """Between batches, compact the tables' changelog and mirror files this often (0: never;
    ``dblog maintain`` does it while no tailer runs)."""
    mirror_every_s: float = TailConfig.mirror_every_s
    """The mirror follows the changelog: the batches written since its last MERGE are
    merged in one MERGE once the oldest of them is this old, once they hold
    ``mirror_max_events`` events, when the tailer is idle with no chunk window open, and
    when a run ends (0: after every batch)."""
    mirror_every_s_behind: float = TailConfig.mirror_every_s_behind
    """...or this often (if longer) while the tailer is behind the log: the last
    transaction it wrote committed over ``BEHIND_LAG_S`` ago (:mod:`pipeline.mirror`)..."""
    mirror_every_s_capturing: float = TailConfig.mirror_every_s_capturing
    """...or this often (if longer) while a capture's chunk window is open (held by the
    tailer or registered in ZooKeeper)."""
    mirror_max_events: int = TailConfig.mirror_max_events
    """...or once the batches the mirrors lack hold this many log events."""
    chunk_files_timeout_s: float = TailConfig.chunk_files_timeout_s
    """How long the tailer waits, at a chunk's high watermark, for a live capture to write
    the chunk's changelog files before it aborts the window (the capture re-selects it)."""
    pin_ahead_s: float = TailConfig.pin_ahead_s
    """While a batch waits for its pinned chunks' files, the tailer reads on and pins the
    high watermarks it finds (the captures write those chunks meanwhile), until the
    batch's first log change has waited this long: then the batch closes, and is written
    once the chunks pinned so far have their files, while the tailer reads on into the
    next batch and pins the chunks after them for it. The next batch waits the same way,
    and is written after the closed one; if it is due first, the tailer waits for the
    closed one, reading nothing meanwhile. A log change waits for at most about this long
    plus the writes of the chunks pinned in its batch and in the closed one before it,
    however long a capture goes on."""
    pins_per_batch: int = 2
    """A batch that pinned this many chunks pins no more: it is written once their files
    are there (or closes and waits for them while the next batch pins the chunks after
    them), so emissions keep pace with the captures' writes (two at a time). A batch that
    pinned every high watermark it found waited, on an idle source, until the capture
    stopped selecting at its ``max_in_flight`` limit and every chunk pinned so far was
    written: the pipeline paused every ``max_in_flight`` chunks."""


@dataclass
class BatchReport:
    """What one committed micro-batch did (for progress callbacks and Dagster metadata)."""

    batch: int
    position: Position
    events: int
    emitted_windows: list[str] = field(default_factory=list)
    aborted_windows: list[str] = field(default_factory=list)
    rows_emitted: int = 0
    commit_ts_ms: int | None = None
    seconds: float = 0.0
    table_events: dict[TableId, int] = field(default_factory=dict)
    """Log events written per table, for every table the batch touched (chunk emissions
    included: a table with only an emission shows 0)."""
    mirrors: dict[TableId, int] = field(default_factory=dict)
    """Tables whose mirror was merged after this batch, with the changelog rows merged."""
    mirror_only: bool = False
    """A report of mirror merges (``mirrors``), not of a written batch (``batch`` is the
    last committed one)."""


@dataclass
class TailSummary:
    batches: int = 0
    events: int = 0
    rows_emitted: int = 0
    position: Position | None = None


class _StopRequested(Exception):  # noqa: N818 - control flow, not an error
    """The run was asked to stop while its batch waited for pinned chunks' files."""


@dataclass
class _Pinned:
    """A chunk whose window the batch pinned: emitted with the batch once its capture wrote
    its files; else aborted, with every chunk of its range pinned after it."""

    emission: ChunkEmission
    pin: ChunkPin
    range_key: tuple[str, str]
    before: Versioned[RangeProgress]
    """The range's progress before this chunk (its place in the range is restored when the
    chunk is aborted)."""
    advanced: RangeProgress
    """The range's progress with this chunk emitted: the place in the range its batch
    commits (:meth:`Tailer._flush`)."""
    covered: KeyRange | None
    """The key range the chunk's select read completely, if the mirror may hold a row in
    it (:meth:`coverage`)."""
    deadline: float
    """When the tailer gives up waiting for the chunk's files."""
    lookout: Lookout
    """When to read the chunk's handoff again (its files, holder or window changed)."""
    mirror_check: Future[bool] | None = None
    """Whether the mirror holds a row in ``covered``: asked beside the log's reading
    (:meth:`Tailer._pin`)."""
    files: ChunkFiles | None = None

    def coverage(self) -> KeyRange | None:
        """The chunk's coverage for its emission: none where the mirror holds no row in it
        (waits for the check)."""
        if self.covered is None or self.mirror_check is None:
            return self.covered
        return self.covered if self.mirror_check.result() else None

    @property
    def checked(self) -> bool:
        """Whether the mirror check, if any, has its answer."""
        return self.mirror_check is None or self.mirror_check.done()


@dataclass
class _Pending:
    """The micro-batch being built."""

    start: Mapping[str, Any]
    tables: dict[TableId, TableBatch] = field(default_factory=dict)
    schemas: dict[TableId, list[TableSchema]] = field(default_factory=dict)
    window_updates: dict[str, WindowUpdate] = field(default_factory=dict)
    pinned: list[_Pinned] = field(default_factory=list)
    """Chunks pinned for this batch, in the order of their high watermarks."""
    advanced: dict[tuple[str, str], RangeProgress] = field(default_factory=dict)
    """Per capture range, its progress after the last chunk this batch emits (settled)."""
    first_change_at: float | None = None
    """When the batch got its first log change (``None``: it holds none yet)."""
    events: int = 0
    end: Mapping[str, Any] | None = None
    end_position: Position | None = None
    commit_ts_ms: int | None = None
    opened: float = field(default_factory=time.monotonic)
    attempt: str = field(default_factory=lambda: WriteAttempt().id)
    """The write attempt that will commit this batch: chosen first, since a chunk's files
    are written for it (tagged with it) before the batch is recorded."""

    def table(self, table: TableId) -> TableBatch:
        if table not in self.tables:
            self.tables[table] = TableBatch(table)
        return self.tables[table]

    def add_change(self) -> None:
        """Count one log change (a row event or a truncate) of the batch."""
        self.events += 1
        if self.first_change_at is None:
            self.first_change_at = time.monotonic()

    @property
    def empty(self) -> bool:
        return self.end is None


class Tailer:
    """Tails one source into Delta. Call :meth:`run` (blocking); stop it with ``stop``."""

    def __init__(
        self,
        *,
        dialect: SourceDialect,
        state: StateStore,
        sink: DeltaSink,
        tables: Sequence[TableId],
        options: TailOptions | None = None,
        identifier: str = "tailer",
        on_batch: Callable[[BatchReport], None] | None = None,
        healer: Callable[[], Healer] | None = None,
    ) -> None:
        """``healer`` builds the :class:`~pipeline.heal.Healer` a leading run starts: it
        captures what the heal requests name (rows changed without row events). Without
        one, such changes are only noted (``notices/``, ``dblog status``)."""
        self.dialect = dialect
        self.state = state
        self.sink = sink
        self.tables = tuple(tables)
        self._tracked = set(self.tables)
        self.options = options or TailOptions()
        self.identifier = identifier
        self.on_batch = on_batch
        self._new_healer = healer
        self._healer: Healer | None = None
        self._proc = WindowProcessor()
        self._ranges: dict[tuple[str, str], Versioned[RangeProgress]] = {}
        self._window_docs: dict[str, WindowState] = {}
        self._lw_resume: dict[str, Mapping[str, Any]] = {}
        """Per open window seen by this run: where a restart must read from to see its LW."""
        self._closed: list[_Pending] = []
        """Batches cut but not written: they wait for their pinned chunks' files while the
        log is read on into the next batch (at most one; written in order)."""
        self._settled: set[str] = set()
        """Windows this tailer emitted or aborted; a repeated high watermark (a restarted
        capture writes it again) must never reopen them, even before ZooKeeper shows it."""
        self._replay_outcomes: dict[str, str] | None = None
        """While a recorded batch is rebuilt: the window outcomes it must hold."""
        self._last_expiry = 0.0
        self._last_maintenance = time.monotonic()
        self._spark_key_order: dict[TableId, bool] = {}
        self._unmerged: set[TableId] = set()
        """Tables with changelog rows the mirror lacks (maybe: every table at a start)."""
        self._unmerged_since: float | None = None
        self._unmerged_events = 0
        self._mirror_doc_lsn: int | None = None
        """The position the ``mirror`` document in ZooKeeper last recorded."""
        self._window_settled_at: float | None = None
        """When a batch last emitted or aborted a chunk window (see :meth:`_capturing`)."""
        self._capture_running: tuple[float, bool] = (0.0, False)
        """When ZooKeeper was last asked whether a capture runs, and its answer."""
        self._merger: MirrorMerger | None = None
        self._coverage_checks: ThreadPoolExecutor | None = None
        self._merge_at_end = True
        """Whether a run ends by merging every mirror (``run(merge_at_end=...)``)."""
        self._stop = threading.Event()

    # ---- public -----------------------------------------------------------------------

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        until_caught_up: bool = False,
        merge_at_end: bool = True,
        max_batches: int | None = None,
        lock_timeout: float | None = 5.0,
        reset_to_head: bool = False,
        on_standby: Callable[[str | None], None] | None = None,
    ) -> TailSummary:
        """Hold the tailer lock and tail until ``stop`` is set (or caught up / max batches).

        ``lock_timeout=None``: stand by while another tailer holds the lock, and take over
        when it stops or dies (:meth:`StateStore.tailer_lock`); ``on_standby(holder)`` is
        called when it begins to wait.

        ``reset_to_head``: first forget the stored position and start at the head of the log
        (after a purged log; a capture then restores the full state).

        A run that ends leaves every mirror merged, unless ``merge_at_end`` is False: then it
        ends as soon as its last batch is in the changelog (a merge running then is
        finished, none is started), the mirrors keep the mark of their last merge, and
        :func:`pipeline.lake.current.current_state` reads the current state meanwhile.
        """
        stop = stop or threading.Event()
        with self.state.tailer_lock(self.identifier, timeout=lock_timeout, stop=stop,
                                    on_standby=on_standby):
            return self._run_as_leader(stop, until_caught_up, max_batches, reset_to_head,
                                       merge_at_end)

    def run_locked(self, *, stop: threading.Event) -> TailSummary:
        """Tail until ``stop`` while the caller holds ``state.tailer_lock`` (a supervisor
        that restarts tailers with another table set without letting the lock go)."""
        return self._run_as_leader(stop, False, None, False)

    def _run_as_leader(self, stop: threading.Event, until_caught_up: bool,
                       max_batches: int | None, reset_to_head: bool,
                       merge_at_end: bool = True) -> TailSummary:
        """:meth:`_run`; ZooKeeper failing once the session was interrupted means the lock
        may be another tailer's now: that is :class:`LeadershipLost` (a standby takes over,
        and an in-process tailer stands by again), whichever call noticed it first."""
        try:
            self._merge_at_end = merge_at_end
            return self._run(stop, until_caught_up, max_batches, reset_to_head)
        except StateUnavailable as exc:
            if self.state.session_interrupted(wait_s=2.0):
                raise LeadershipLost(
                    f"the ZooKeeper session of the tailer for {self.state.source} was "
                    f"interrupted ({exc}); another tailer may have taken over, so this one "
                    "stops writing") from exc
            raise
        except SourceError as exc:
            # A tailer that lost its lock meanwhile sees its log stream ended by the one that
            # took over (MariaDB ends a replica connection when another with the same
            # server_id connects): that is the fencing at work, not a failure.
            try:
                self.state.check_leader()
            except (LeadershipLost, StateUnavailable):
                raise LeadershipLost(
                    f"the tailer for {self.state.source} lost its lock, and then its log "
                    f"stream ({exc}); another tailer has taken over") from exc
            raise

    # ---- the loop ---------------------------------------------------------------------

    def _initial_position(self, head: Mapping[str, Any] | None = None
                          ) -> Versioned[PositionState]:
        """The committed position; without one, the head of the log (``head``, when read
        already) is committed as the start."""
        found = self.state.get_position()
        if found is not None:
            return found
        head = head if head is not None else self.dialect.head_position()
        start = PositionState(self.dialect.to_position(head), dict(head), batch=0,
                              generation=new_generation())
        self.state.commit_batch(start, None, clear_intent=False)
        found = self.state.get_position()
        assert found is not None
        return found

    def _refresh_windows(self) -> list[Versioned[WindowState]]:
        """Make the processor's windows match ZooKeeper's registered ones; returns the
        window documents read (for :meth:`_expire_windows`)."""
        docs = self.state.list_windows()
        self._settled &= {ws.value.window.window_id for ws in docs}
        registered = self._unsettled(docs)
        open_ids = {w.window_id for w in self._proc.open_windows}
        for wid in open_ids - registered.keys():
            self._proc.discard(wid)
        for wid in set(self._lw_resume) - registered.keys():
            del self._lw_resume[wid]
        for wid, ws in registered.items():
            self._window_docs[wid] = ws
            if ws.extra.get("lw_resume"):
                self._lw_resume[wid] = ws.extra["lw_resume"]
            if wid not in open_ids:
                try:
                    self._proc.register(ws.window)
                except ValueError as exc:  # clashing watermark values: never emit it
                    log.warning("window %s not registered: %s", wid, exc)
        return docs

    def _unsettled(self, docs: list[Versioned[WindowState]]) -> dict[str, WindowState]:
        """The registered windows among ``docs`` this run has not settled, by id."""
        return {ws.value.window.window_id: ws.value for ws in docs
                if ws.value.status == "registered"
                and ws.value.window.window_id not in self._settled}

    def _run(self, stop: threading.Event, until_caught_up: bool, max_batches: int | None,
             reset_to_head: bool) -> TailSummary:
        summary = TailSummary()
        self._stop = stop
        # A run starts from ZooKeeper alone: a tailer object that lost the lock and won it
        # back (standby) must not trust windows or range versions it held before.
        self._proc = WindowProcessor()
        self._ranges.clear()
        self._window_docs.clear()
        self._lw_resume.clear()
        self._settled.clear()
        self._closed.clear()
        self._replay_outcomes = None
        head: Mapping[str, Any] | None = None
        if reset_to_head or self.state.get_position() is None:
            # Starting at the head of the log: checked against the lake before anything
            # is written (ZooKeeper's position included).
            head = self.dialect.head_position()
            self._refuse_a_head_behind_the_lake(head)
        if reset_to_head:
            assert head is not None
            self._reset_to_head(head)
        committed = self._initial_position(head)
        found_doc = self.state.get(MIRROR_DOC)
        # A generation's mirrors merged by none of its runs yet: it began at the head
        # (the run before may have died right after that).
        starts_over = (found_doc is None
                       or found_doc.value.get("generation") != committed.value.generation)
        if starts_over and self._merge_before_the_gap(committed.value):
            found_doc = self.state.get(MIRROR_DOC)
        # A crash may have left any mirror behind its changelog: every table is looked at.
        self._unmerged = set() if starts_over else set(self.tables)
        self._unmerged_since, self._unmerged_events = time.monotonic(), 0
        self._mirror_doc_lsn = int(found_doc.value["lsn"]) if found_doc is not None else None
        replay = self._pending_replay(committed)
        self._expire_windows()
        self._refresh_windows()
        start = dict(committed.value.source_position)
        for ws in self._window_docs.values():
            lw_resume = ws.extra.get("lw_resume")
            if lw_resume and self.dialect.to_position(lw_resume) < self.dialect.to_position(start):
                start = dict(lw_resume)
        # Transactions up to the committed position were written already: they are re-read
        # (warm-up) only so that open windows see their keys again.
        warm_until = self.dialect.to_position(committed.value.source_position)
        cutter = BatchCutter(committed=warm_until, max_events=self.options.batch_max_events,
                             max_seconds=self.options.batch_max_seconds,
                             now=time.monotonic(), replay=replay,
                             pins_per_batch=self.options.pins_per_batch,
                             pin_ahead_s=self.options.pin_ahead_s)
        pending = _Pending(start=dict(committed.value.source_position))
        last_resume: Mapping[str, Any] = start
        quiet_since: tuple[Any, float] | None = None

        def caught_up(here: Mapping[str, Any] | None) -> bool:
            """The reader found nothing new and stands at or past the head the run started
            at, or has not moved for QUIET_S (events it never reports, such as a new binlog
            file's headers, can lie between its position and that head)."""
            nonlocal quiet_since
            if here is None or self.dialect.to_position(here) >= head_at_start:
                return True
            now = time.monotonic()
            if quiet_since is None or quiet_since[0] != here:
                quiet_since = (dict(here), now)
            return now - quiet_since[1] >= QUIET_S
        # Decoding runs ahead in a thread of its own while batches are written, and the
        # mirrors merge in another.
        self._merger = MirrorMerger(self._merge_mirrors)
        self._healer = self._new_healer().start() if self._new_healer is not None else None
        self._coverage_checks = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dblog-coverage-check")
        reader = PrefetchingReader(
            self.dialect.open_log(start, self.tables),
            max_ahead=self.options.batch_max_events,
            read_transactions=self.options.read_transactions,
            poll_s=self.options.poll_seconds,
        )
        # --until-caught-up: everything in the log when the run started (read once the log
        # is open: opening it may log something, such as PostgreSQL's heal of a table whose
        # partitions or storage changed meanwhile), and then the first time the reader
        # finds nothing new.
        head_at_start = (self.dialect.to_position(self.dialect.head_position())
                         if until_caught_up else warm_until)

        def write(batch: _Pending) -> bool:
            """Write and commit a cut batch (the batch being built after it: ``pending``);
            True when enough batches were written."""
            nonlocal committed
            events = batch.events
            committed = self._flush(batch, committed.value.batch + 1, committed, summary,
                                    later=pending)
            if batch.window_updates:  # it opened, emitted or aborted chunk windows
                self._window_settled_at = time.monotonic()
            tables = set(batch.tables)  # with the pinned chunks' tables, settled in the flush
            confirm_log(reader, self._log_needed_from(committed.value))
            self._note_unmerged(tables, events)
            assert self._merger is not None
            self._merger.check()
            if self._mirror_due(backlogged=behind_the_log(committed.value.commit_ts_ms,
                                                          time.time())):
                self._request_merge(committed.value)
            self._replay_outcomes = None
            if time.monotonic() - self._last_expiry >= EXPIRY_CHECK_S:
                self._expire_windows()
            self._maybe_maintain()
            return max_batches is not None and summary.batches >= max_batches

        def write_closed(*, wait: bool) -> bool:
            """Write the closed batch once its pinned chunks have their files (``wait``:
            wait for them now, reading nothing meanwhile); True when enough batches were
            written."""
            if not self._closed or not (wait or self._pinned_files_ready(self._closed[0])):
                return False
            return write(self._closed.pop(0))

        def cut_at(cut: Cut) -> bool:
            """Cut the pending batch at ``cut``: write it now, or, while its pinned chunks'
            files are missing, close it and read on into the next batch (whose high
            watermarks are pinned meanwhile, so their captures write at once). True when
            enough batches were written."""
            nonlocal pending
            pending.end, pending.end_position = dict(cut.native), cut.end
            if write_closed(wait=True):
                return True
            to_close = (cutter.may_close(len(pending.pinned))
                        and not self._pinned_files_ready(pending))
            batch, pending = pending, _Pending(start=dict(cut.native))
            if to_close:
                log.info("batch closed at %s waits for %d pinned chunks' files; the log is "
                         "read on into the next", cut.end, len(batch.pinned))
                cutter.cut(cut, time.monotonic())
                self._closed.append(batch)
                return False
            enough = write(batch)
            cutter.cut(cut, time.monotonic())
            pending.opened = time.monotonic()
            return enough

        def due(cut: Cut | None) -> TypeGuard[Cut]:
            """Whether to make ``cut`` now (:meth:`BatchCutter.due`; a batch that may wait
            for its pinned chunks' files is cut once they are there)."""
            if cut is None:
                return False
            verdict = cutter.due(closed=bool(self._closed), pinned=len(pending.pinned),
                                 first_change_at=pending.first_change_at, now=time.monotonic())
            return verdict is Due.NOW or (verdict is Due.IF_FILES_READY
                                          and self._pinned_files_ready(pending))

        try:
            while not stop.is_set():
                txs = reader.read(
                    max_transactions=self.options.read_transactions,
                    # while captures write pinned chunks, look at their files often
                    max_wait_s=(min(self.options.poll_seconds, PINNED_POLL_S)
                                if pending.pinned or self._closed
                                else self.options.poll_seconds),
                )
                if write_closed(wait=False):
                    return self._finish(summary, committed.value)
                for tx in txs:
                    resume = self.dialect.to_position(tx.resume)
                    if resume <= warm_until:
                        self._consume(tx, pending, last_resume, warm=True)
                        last_resume = tx.resume
                        continue
                    cut = cutter.before(resume)
                    if cut is not None and cut_at(cut):
                        return self._finish(summary, committed.value)
                    events_before = pending.events
                    self._consume(tx, pending, last_resume, warm=False)
                    last_resume = tx.resume
                    cut = cutter.consumed(resume, tx.resume, pending.events - events_before,
                                          time.monotonic(), pinned=len(pending.pinned))
                    if due(cut) and cut_at(cut):
                        return self._finish(summary, committed.value)
                if txs:
                    # Everything read so far is in the batch: write it now rather than
                    # wait for more (the reader reads on meanwhile), unless the reader is
                    # behind the head: then the batch closes by size or age.
                    cut = cutter.drained(reader.behind) if reader.drained else None
                    if due(cut) and cut_at(cut):
                        return self._finish(summary, committed.value)
                    continue
                if reader.timed_out:
                    # The reader still reads: a batch waiting for its pinned chunks' files
                    # looks for them meanwhile (a quiet log would hold it for a whole
                    # read); a replayed batch waits for its recorded end.
                    cut = cutter.waiting(len(pending.pinned))
                    if due(cut) and cut_at(cut):
                        return self._finish(summary, committed.value)
                    continue
                here = reader.resume
                cut = (cutter.idle(self.dialect.to_position(here), here) if here
                       else cutter.pending)
                if cut is not None and not due(cut):
                    continue  # the batch waits for its pinned chunks' files
                if cut is not None:
                    if cut_at(cut):
                        return self._finish(summary, committed.value)
                elif (until_caught_up and not cutter.replaying and caught_up(here)
                      and self._healed()):
                    write_closed(wait=True)
                    return self._finish(summary, committed.value)
                if not cutter.replaying:
                    docs = self._refresh_windows()
                    if time.monotonic() - self._last_expiry >= EXPIRY_CHECK_S:
                        self._expire_windows(docs)
                    if cut is None and (not self._capturing()
                                        or self._mirror_due(backlogged=False)):
                        self._request_merge(committed.value)
            return self._finish(summary, committed.value)
        except _StopRequested:
            # Asked to stop while waiting for chunk files: the batch is left unwritten (and
            # unrecorded); the next run reads it again from the committed position.
            return self._finish(summary, committed.value)
        finally:
            reader.close()
            if self._healer is not None:
                self._healer.close()
            self._merger.close()
            self._coverage_checks.shutdown(wait=True, cancel_futures=True)

    def _healed(self) -> bool:
        """Whether no heal runs or waits (``--until-caught-up`` ends only then)."""
        return self._healer is None or self._healer.idle()

    def _log_needed_from(self, committed: PositionState) -> Mapping[str, Any]:
        """The earliest log position a restart may read from: the committed position, or
        an open window's low watermark before it (warm-up re-reads from there)."""
        keep = committed.source_position
        for lw_resume in self._lw_resume.values():
            if self.dialect.to_position(lw_resume) < self.dialect.to_position(keep):
                keep = lw_resume
        return keep

    # ---- the mirror follows the changelog ----------------------------------------------

    def _finish(self, summary: TailSummary, committed: PositionState) -> TailSummary:
        """A run that ends cleanly leaves every mirror merged (unless asked not to: then a
        merge running now finishes as the merger closes, and none starts)."""
        assert self._merger is not None
        if not self._merge_at_end:
            self._merger.check()
            return summary
        self._request_merge(committed)
        self._merger.wait()
        return summary

    def _note_unmerged(self, tables: set[TableId], events: int) -> None:
        if tables and not self._unmerged:
            self._unmerged_since = time.monotonic()
        self._unmerged |= tables
        self._unmerged_events += events

    def _mirror_due(self, *, backlogged: bool) -> bool:
        """Whether the batches the mirrors lack are old or many enough to merge now
        (``backlogged``: the tailer is behind the log, :func:`behind_the_log`; the period
        is longer while a chunk window is open too)."""
        since = self._unmerged_since
        unmerged_for_s = (None if not self._unmerged or since is None
                          else time.monotonic() - since)

        def due(capturing: bool) -> bool:
            return mirror_due(
                unmerged_for_s=unmerged_for_s,
                unmerged_events=self._unmerged_events, backlogged=backlogged,
                capturing=capturing,
                every_s=self.options.mirror_every_s,
                every_s_behind=self.options.mirror_every_s_behind,
                every_s_capturing=self.options.mirror_every_s_capturing,
                max_events=self.options.mirror_max_events)

        if self._capturing():
            return due(True)
        # The processor reads registered windows when idle or at a low watermark, so right
        # after a chunk's emission it may hold none while the capture's next one is open:
        # ZooKeeper is asked, only when that would decide.
        return due(False) and (due(True) or not self._unsettled(self.state.list_windows()))

    def _capturing(self) -> bool:
        """Whether a capture is selecting chunks, for the mirror's period: a window is open
        in the log, or the tailer settled one within ``CAPTURE_GAP_S`` and a capture still
        runs (asked of ZooKeeper only then, at most once a second). Between two chunks, or
        while a capture waits for its chunks' emission, the tailer sees no window open; a
        MERGE started then (seconds of both cores) ran beside the capture's next chunks."""
        if self._proc.open_windows:
            return True
        settled = self._window_settled_at
        now = time.monotonic()
        if settled is None or now - settled >= CAPTURE_GAP_S:
            return False
        asked_at, running = self._capture_running
        if now - asked_at >= 1.0:
            running = any(found.value.status == "running"
                          for found in self.state.list_captures())
            self._capture_running = (now, running)
        return running

    def _request_merge(self, committed: PositionState) -> None:
        """Hand the tables written since the last request to the mirror merger."""
        assert self._merger is not None
        if not self._unmerged and self._mirror_doc_lsn == committed.position.lsn:
            self._merger.check()
            return
        self._merger.request(committed, frozenset(self._unmerged))
        self._unmerged = set()
        self._unmerged_since, self._unmerged_events = None, 0

    def _merge_mirrors(self, committed: PositionState, tables: frozenset[TableId]) -> None:
        """In the merger's thread: merge each table's changelog rows up to the committed
        position into its mirror (one MERGE per table with anything to merge), then record
        that position in the ``mirror`` document (readers wait for it:
        :meth:`Runtime.wait_for_position`)."""
        began = time.monotonic()
        app_id = committed.txn_app_id(self.state.source)
        merged: dict[TableId, int] = {}
        for table in sorted(tables, key=str):
            self.state.check_leader()
            crash_point("tail.before_mirror")
            rows = self.sink.merge_mirror(
                table, committed.batch,
                {"dblog.batch": committed.batch, "dblog.to_lsn": committed.position.lsn,
                 "table": str(table), "dblog.app": app_id},
                app_id=app_id, through_lsn=committed.position.lsn)
            if rows:
                merged[table] = rows
        self.state.check_leader()
        self.state.put(MIRROR_DOC, {
            "lsn": committed.position.lsn, "source_position": dict(committed.source_position),
            "batch": committed.batch, "generation": committed.generation,
        }, None)
        self._mirror_doc_lsn = committed.position.lsn
        if merged:
            log.info("mirrors merged through batch %d: %s in %.2fs", committed.batch,
                     ", ".join(f"{t} ({n} rows)" for t, n in merged.items()),
                     time.monotonic() - began)
            if self.on_batch is not None:
                self.on_batch(BatchReport(
                    committed.batch, committed.position, 0, commit_ts_ms=committed.commit_ts_ms,
                    seconds=time.monotonic() - began, mirrors=merged, mirror_only=True))

    def _maybe_maintain(self) -> None:
        """Compact small files every ``maintain_every_s``, between batches: the tailer is
        the tables' one writer, so no MERGE ever meets a compaction."""
        every = self.options.maintain_every_s
        if every <= 0 or time.monotonic() - self._last_maintenance < every:
            return
        self.state.check_leader()
        for table in self.tables:
            log.info("maintenance: %s", self.sink.maintain(table).summary())
        self._last_maintenance = time.monotonic()

    def _reset_to_head(self, head: Mapping[str, Any]) -> None:
        """Start over at ``head``, the head of the log (after a purged log; a capture then
        restores the full state): a new generation of batch numbers, no pending batch, no
        open window. Runs under the tailer lock."""
        self.state.clear_batch_intent()
        aborted = self.state.abort_open_windows(None, "the tailer was reset to the head")
        new = PositionState(self.dialect.to_position(head), dict(head), batch=0,
                            generation=new_generation())
        current = self.state.get_position()
        self.state.put_position(new, current.version if current is not None else ABSENT)
        log.warning("position reset to the head %s (generation %s); %d open windows aborted",
                    dict(head), new.generation, len(aborted))

    def _refuse_a_head_behind_the_lake(self, head: Mapping[str, Any]) -> None:
        """Stop with what to do when the lake holds a change positioned after ``head``, the
        head of the log a run would start at: the log was reset (``RESET MASTER``, a source
        rebuilt from a backup) or is another server's, and its positions begin again below
        the lake's. Every change read from it would then lose to the lake's older rows,
        which win by position in the mirror and in every reader of the changelog."""
        at = self.dialect.to_position(head)
        ahead = [str(t) for t in self.tables if self.sink.holds_changes_after(t, at.lsn)]
        if ahead:
            raise DblogError(
                f"the head of the log of {self.state.source} ({dict(head)}) is behind changes "
                f"the lake already holds for {', '.join(ahead)}: the log was reset or belongs "
                "to another server, and the lake orders changes by log position, so no change "
                "read from this log could replace them. Give the source a new lake (a new "
                "`lake` path, or a new source name for a new ZooKeeper state too), then run "
                "`dblog tail --from-head` and `dblog capture`")

    def _merge_before_the_gap(self, committed: PositionState) -> bool:
        """A generation of batches starts at the head of the log (``--from-head``, or no
        stored position) and never reads what the log held between the lake's last batch
        and the head: its first run merges every changelog row written before it into the
        mirrors first, and records that in the ``mirror`` document (a run that dies before
        that leaves it to the next). Whether there was a table to merge.

        A capture then restores the full state: a chunk deletes the keys in its range the
        lake holds and the source lacks, found in the mirror (:meth:`DeltaSink.mirror_holds`,
        the coverage deletes). Without a gap that is every such key, since a key added by
        a changelog row the mirror lacks still exists or a later log change says it went.
        Across a gap it is not: a key the changelog added and the gap deleted would stay in
        the lake for good had its row not been merged."""
        tables = frozenset(t for t in self.tables if self.sink.known_columns(t))
        if tables:
            self._merge_mirrors(committed, tables)
        return bool(tables)

    def _pending_replay(self, committed: Versioned[PositionState]) -> Cut | None:
        """The recorded batch to rebuild exactly, if the last run crashed while writing it."""
        intent = self.state.get_batch_intent()
        if intent is None:
            return None
        if intent.value.batch != committed.value.batch + 1:
            # Left over from before a reset (commit_batch clears the intent it commits).
            log.warning("dropping a stale batch intent for batch %d (committed: %d)",
                        intent.value.batch, committed.value.batch)
            self.state.delete(BATCH_INTENT, intent.version)
            return None
        if dict(intent.value.start) != dict(committed.value.source_position):
            raise ReplayMismatch(
                f"batch {intent.value.batch} was recorded to start at {dict(intent.value.start)}"
                f", but the committed position is {dict(committed.value.source_position)}: "
                "the ZooKeeper state was changed by hand; run `dblog tail --from-head` and a "
                "capture"
            )
        self._replay_outcomes = dict(intent.value.windows)
        return Cut(self.dialect.to_position(intent.value.end), dict(intent.value.end))

    def _expire_windows(self, docs: list[Versioned[WindowState]] | None = None) -> None:
        """Abort registered windows older than the expiry: their capture crashed, was
        cancelled or timed out; left open they would pin the restart position forever.
        ``docs``: the window documents if just read (versions guard every update)."""
        self._last_expiry = time.monotonic()
        expiry = self.options.window_expiry_s
        if expiry <= 0:
            return
        oldest = int((time.time() - expiry) * 1000)
        protected = set(self._settled) | set(self._replay_outcomes or ())
        for found in self.state.list_windows() if docs is None else docs:
            ws = found.value
            wid = ws.window.window_id
            if ws.status != "registered" or ws.created_at_ms > oldest or wid in protected:
                continue
            try:
                self.state.set_window_status(
                    wid, "aborted", f"expired: no high watermark within {expiry:g}s",
                    found.version,
                )
            except StateConflict:
                continue  # settled or noted meanwhile: looked at again next time
            log.warning("window %s of %s expired after %gs", wid, ws.window.table, expiry)
            self._proc.discard(wid)
            self._window_docs.pop(wid, None)
            self._lw_resume.pop(wid, None)

    def _consume(
        self, tx: Transaction, pending: _Pending, resume_before: Mapping[str, Any], warm: bool
    ) -> None:
        """Feed one transaction's items to the window processor (warm-up: keys only)."""
        for item in tx.items:
            if isinstance(item, SchemaChange):
                if item.resets_rows and item.table in self._tracked:
                    self._table_reset(item, pending, warm)
                if item.rewrites_rows and item.table in self._tracked:
                    self._unlogged(UnloggedChange(
                        item.table, item.position,
                        f"{item.statement[:200]!r} may have changed rows without row events"),
                        pending, warm)
                continue
            if isinstance(item, UnloggedChange):
                if item.table in self._tracked:
                    self._unlogged(item, pending, warm)
                continue
            if isinstance(item, ChangeEvent) and item.table not in self._tracked:
                continue
            was_active = {w.window_id for w in self._proc.active_windows}
            outputs = self._proc.process(item)
            if any(isinstance(o, UnknownWatermark) for o in outputs):
                self._refresh_windows()
                outputs = self._proc.process(item)
            if warm:
                continue
            if isinstance(item, WatermarkEvent):
                for w in self._proc.active_windows:
                    if w.window_id not in was_active:
                        pending.window_updates[w.window_id] = WindowUpdate(
                            w.window_id, "registered",
                            extra={"lw_resume": dict(resume_before), "lw_lsn": item.position.lsn},
                        )
            for out in outputs:
                if isinstance(out, ChangeEvent):
                    pending.table(out.table).events.append(out)
                    pending.add_change()
                elif isinstance(out, ChunkEmission):
                    self._accept_emission(out, pending)
                elif isinstance(out, WindowAborted):
                    self._abort(out.window.window_id, out.reason, pending)
        if not warm:
            for table, schema in tx.schemas.items():
                if table in self._tracked:
                    seen = pending.schemas.setdefault(table, [])
                    if not seen or seen[-1] != schema:  # in order, each change once
                        seen.append(schema)
            pending.end = tx.resume
            pending.end_position = tx.position
            pending.commit_ts_ms = tx.commit_ts_ms

    def _table_reset(self, change: SchemaChange, pending: _Pending, warm: bool) -> None:
        """TRUNCATE / DROP of a tracked table: every row before it is gone. A chunk of that
        table selected inside an open window may hold rows from before it: abort those."""
        for w in self._proc.active_windows:
            if w.table == change.table:
                self._proc.discard(w.window_id)
                if not warm:
                    self._abort(w.window_id, "the table was truncated or dropped inside the "
                                "window", pending)
        if not warm:
            log.warning("%s: %s at %s; the lake table is emptied at that position",
                        change.table, change.statement[:80], change.position)
            pending.table(change.table).truncates.append(change.position)
            pending.add_change()

    def _unlogged(self, change: UnloggedChange, pending: _Pending, warm: bool) -> None:
        """Rows of a tracked table changed without the row events that say how. An open
        window on the table must not emit them: their keys count as changed in it, or, when
        the log does not name them, the window is aborted (its capture selects the chunk
        again). Outside warm-up, the change is noted where operators look, and a heal is
        asked for (:mod:`pipeline.heal`), unless healing is off."""
        if change.keys is None:
            for w in self._proc.active_windows:
                if w.table == change.table:
                    self._proc.discard(w.window_id)
                    if not warm:
                        self._abort(w.window_id, "rows of the table changed inside the "
                                    "window without row events", pending)
        else:
            self._proc.touch(change.table, change.keys)
        if warm:
            return
        healing = self._new_healer is not None
        what = ("the whole table" if change.keys is None
                else f"{len(change.keys)} key{'s' if len(change.keys) != 1 else ''}")
        log.warning("%s at %s: %s; %s", change.table, change.position, change.reason,
                    f"healing it: a capture of {what}" if healing
                    else f"capture it to repair the lake (`dblog capture {change.table}`)")
        self.state.put(notice_path(change.table), {
            "table": [change.table.database, change.table.table],
            "statement": change.reason[:2000], "lsn": change.position.lsn,
            "noted_at_ms": int(time.time() * 1000), "healing": healing,
        }, None)
        if healing:
            request_heal(self.state, change.table, change.reason, change.keys)

    # ---- chunk emissions and range progress ---------------------------------------------

    def _range(self, capture_id: str, range_id: str) -> Versioned[RangeProgress] | None:
        key = (capture_id, range_id)
        if key not in self._ranges:
            found = self.state.get_range(capture_id, range_id)
            if found is None:
                return None
            self._ranges[key] = found
        return self._ranges[key]

    def _abort(self, wid: str, reason: str, pending: _Pending) -> None:
        if wid in self._settled:
            return  # already emitted or aborted: a later verdict must not contradict it
        self._settled.add(wid)
        pending.window_updates[wid] = WindowUpdate(wid, "aborted", detail=reason)

    def _accept_emission(self, em: ChunkEmission, pending: _Pending) -> None:
        """Pin the chunk for this batch if it continues its range exactly (its files are
        awaited before the batch is written: :meth:`_settle_pinned`); else abort it."""
        wid = em.window.window_id
        doc = self._window_docs.get(wid)
        chunk = self.state.get(chunk_path(wid))
        reason = None
        if doc is None or chunk is None:
            reason = "the chunk was never described by its capture"
        else:
            cid, rid = doc.extra.get("capture_id"), doc.extra.get("range_id")
            progress = self._range(str(cid), str(rid)) if cid and rid else None
            if progress is None:
                reason = "its capture range is gone"
            elif progress.value.done or progress.value.last_emitted_key != key_from_json(
                doc.extra.get("after_key")
            ):
                reason = "out of order: the chunk before it was not emitted"
            elif (self._replay_outcomes or {}).get(wid) == "aborted":
                reason = "aborted when this batch was first written"
        if reason is not None:
            self._abort(wid, reason, pending)
            return
        assert doc is not None and chunk is not None
        covered = self._coverage(em.window.table, chunk.value.get("delete_range"))
        pin, mirror_check = self._pin(em, chunk.value, pending, covered)
        self._settled.add(wid)
        # Advance the in-memory progress now so a later chunk of the same range in this
        # batch is judged against it (rolled back if this chunk's files never come);
        # ZooKeeper gets it in the batch's commit.
        range_key = (str(doc.extra["capture_id"]), str(doc.extra["range_id"]))
        current = self._ranges[range_key]
        last = key_from_json(chunk.value.get("last_key"))
        new = replace(
            current.value,
            last_emitted_key=last if last is not None else current.value.last_emitted_key,
            chunks_emitted=current.value.chunks_emitted + 1,
            done=bool(chunk.value.get("final")),
        )
        self._ranges[range_key] = Versioned(new, current.version)
        pending.pinned.append(_Pinned(
            em, pin, range_key, current, new, covered,
            deadline=time.monotonic() + self.options.chunk_files_timeout_s,
            lookout=Lookout(partial(handoff.watch_files, self.state, pin.window_id),
                            FILES_LOOK_S),
            mirror_check=mirror_check))

    def _pin(self, em: ChunkEmission, chunk: Mapping[str, Any], pending: _Pending,
             covered: KeyRange | None) -> tuple[ChunkPin, Future[bool] | None]:
        """Pin the window for this batch: its capture writes the chunk's files for it; the
        pin, and the check whether the mirror holds a row in the chunk's coverage (without
        one the chunk can delete none: :meth:`DeltaSink.mirror_holds`).

        The check is a Spark job, run in a thread of its own while the log is read on and
        the capture writes the chunk's files; the batch is written once it has its answer.
        Any time between the pin and the batch's write is as good as another: the mirror
        then changes only by merges of batches before this one, and a merge that lands
        after the check adds only rows of keys the chunk holds, was told of (dropped,
        changed before its high watermark) or saw deleted, so a check that found no row
        leaves no row for the chunk to delete.

        The lake first gets every column of the chunk, so that the capture can write its
        rows in the lake's schema. Files written for an earlier attempt (this tailer's
        predecessor died before its commit) do as well: the commit writes their rows again
        with this attempt's tags."""
        table = em.window.table
        columns = handoff.columns_from_json(table, chunk.get("key") or (), chunk.get("columns"))
        if columns is not None:
            self.sink.ensure_schema(columns)
        elif not self.sink.known_columns(table):
            self.sink.ensure_schema(self.dialect.table_schema(table))
        pin = ChunkPin(em.window.window_id, self._batch_no() + len(self._closed),
                       pending.attempt,
                       em.position.lsn, em.position.seq, em.commit_ts_ms,
                       tuple(em.dropped_keys))
        self.state.check_leader()
        handoff.write_pin(self.state, pin)
        crash_point("tail.after_pin")
        if covered is None:
            return pin, None
        assert self._coverage_checks is not None
        return pin, self._coverage_checks.submit(self.sink.mirror_holds, table, covered)

    def _pinned_files_ready(self, pending: _Pending) -> bool:
        """Whether every chunk the batch pinned has its files, or never will (then it is
        aborted when the batch is written), and its mirror check's answer: the batch can be
        written without waiting. Reads ZooKeeper only for a chunk whose handoff changed
        since the last read, or once every ``FILES_LOOK_S`` (it is asked per transaction)."""
        if not pending.pinned:
            return True
        if not all(pinned.checked for pinned in pending.pinned):
            return False
        for pinned in pending.pinned:
            if pinned.files is None:
                found = self._files_if_changed(pinned)
                if found is None:
                    return False
                if isinstance(found, ChunkFiles):
                    pinned.files = found
        return True

    def _settle_pinned(self, pending: _Pending, later: _Pending | None = None) -> None:
        """Wait for the files of every chunk the batch pinned, in order, and add the chunks
        to the batch; a chunk whose files never come is aborted, and so is every later
        chunk of its range, here and in the batch being built after it (``later``): the
        range's place goes back to before it."""
        failed: set[tuple[str, str]] = set()
        for pinned in pending.pinned:
            wid = pinned.pin.window_id
            found: ChunkFiles | str
            if pinned.range_key in failed:
                found = "out of order: the chunk before it was not emitted"
            else:
                found = pinned.files or self._await_files(pinned)
                if isinstance(found, str) and (self._replay_outcomes or {}).get(wid) == "emitted":
                    raise DblogError(
                        f"batch {pinned.pin.batch} was written with window {wid} emitted, "
                        f"but its chunk cannot be had again ({found}); run `dblog tail "
                        "--from-head` and a capture of the table to start over")
            if isinstance(found, str):
                if pinned.range_key not in failed:
                    failed.add(pinned.range_key)
                    self._rewind_range(pinned)
                if pinned.mirror_check is not None:
                    pinned.mirror_check.cancel()
                pending.window_updates[wid] = WindowUpdate(wid, "aborted", detail=found)
                continue
            table = pinned.emission.window.table
            batch = pending.table(table)
            batch.emissions.append(pinned.emission)
            batch.chunks[wid] = found
            covered = pinned.coverage()
            if covered is not None:
                batch.coverage[wid] = covered
            pending.advanced[pinned.range_key] = pinned.advanced
            pending.window_updates[wid] = WindowUpdate(
                wid, "emitted", extra={"rows_selected": found.selected,
                                       "position": pinned.emission.position.lsn})
        pending.pinned.clear()
        if later is not None and failed:
            for pinned in [p for p in later.pinned if p.range_key in failed]:
                later.pinned.remove(pinned)
                if pinned.mirror_check is not None:
                    pinned.mirror_check.cancel()
                later.window_updates[pinned.pin.window_id] = WindowUpdate(
                    pinned.pin.window_id, "aborted",
                    detail="out of order: the chunk before it was not emitted")

    def _rewind_range(self, pinned: _Pinned) -> None:
        """The range's place goes back to before the aborted chunk ``pinned``; its row
        counts and version stay (batches written since the pin added to them)."""
        current = self._ranges[pinned.range_key]
        self._ranges[pinned.range_key] = Versioned(
            _placed(current.value, pinned.before.value), current.version)

    def _await_files(self, pinned: _Pinned) -> ChunkFiles | str:
        """The capture's files for a pinned chunk (see :meth:`_files_now`), waited for."""
        while True:
            found = self._files_if_changed(pinned)
            if found is not None:
                return found
            if self._stop.is_set():
                raise _StopRequested()
            pinned.lookout.wait(FILES_WAIT_S)

    def _files_if_changed(self, pinned: _Pinned) -> ChunkFiles | str | None:
        """:meth:`_files_now` if the chunk's handoff changed since the last read (its
        ZooKeeper watches fired) or ``FILES_LOOK_S`` passed; None otherwise."""
        if not pinned.lookout.due():
            return None
        self.state.check_leader()
        return self._files_now(pinned)

    def _files_now(self, pinned: _Pinned) -> ChunkFiles | str | None:
        """The capture's files for the pin (or an earlier pin's, once no capture holds the
        rows any more); why the window must be aborted; or None: not yet written."""
        pin = pinned.pin
        wid = pin.window_id
        files = handoff.read_files(self.state, wid)
        if files is not None and files.for_pin(pin):
            return files
        if not handoff.is_held(self.state, wid):
            # Published just before the holder went away?
            files = handoff.read_files(self.state, wid)
            if files is not None:
                return files
            return ("the capture holding the chunk's rows ended before writing them; "
                    "it selects the chunk again when resumed")
        window = self.state.get_window(wid)
        if window is None or window.value.status == "aborted":
            return "its capture aborted it"
        if time.monotonic() >= pinned.deadline:
            return (f"its capture did not write the chunk within "
                    f"{self.options.chunk_files_timeout_s:g}s")
        return None

    def _batch_no(self) -> int:
        """The number of the next batch to commit (the committed one's next); the batch
        being built comes after the closed ones (:attr:`_closed`)."""
        found = self.state.get_position()
        assert found is not None
        return found.value.batch + 1

    def _coverage(self, table: TableId, delete_range: Any) -> KeyRange | None:
        """The key range whose mirror rows the chunk proves gone when it did not return them
        (None: a filtered chunk, or a key order Spark cannot reproduce for range tests)."""
        if not isinstance(delete_range, Mapping):
            return None
        if table not in self._spark_key_order:
            self._spark_key_order[table] = self.dialect.spark_orders_keys_like_source(table)
        if not self._spark_key_order[table]:
            return None
        return KeyRange(key_from_json(delete_range.get("after")),
                        key_from_json(delete_range.get("through")))

    # ---- commit -------------------------------------------------------------------------

    def _record_intent(self, pending: _Pending, batch_no: int,
                       committed: Versioned[PositionState]) -> WriteAttempt:
        """Write ahead what batch ``batch_no`` holds and who writes it; a replay must match
        the record, and writes as a new attempt after the recorded ones."""
        assert pending.end is not None
        outcomes = {w: u.status for w, u in pending.window_updates.items()
                    if u.status != "registered"}
        attempt = WriteAttempt(pending.attempt)
        found = self.state.get_batch_intent()
        if found is None:
            intent = BatchIntent(batch_no, dict(pending.start), dict(pending.end),
                                 windows=outcomes, attempts=(attempt.id,))
            self.state.create_batch_intent(intent, committed.version)
            return attempt
        recorded = found.value
        if recorded.batch != batch_no:
            raise StateConflict(f"a batch intent for batch {recorded.batch} appeared while "
                                f"batch {batch_no} was built: another tailer is writing")
        differences = []
        if dict(recorded.end) != dict(pending.end):
            differences.append(f"end {dict(pending.end)} instead of {dict(recorded.end)}")
        if dict(recorded.windows) != self._with_aborts_settled_since(outcomes, recorded):
            differences.append(f"windows {outcomes} instead of {dict(recorded.windows)}")
        if differences:
            raise ReplayMismatch(
                f"replayed batch {batch_no} differs from the batch written before the crash "
                f"({'; '.join(differences)}); nothing was written. Run `dblog tail "
                "--from-head` and a capture to start over"
            )
        self.state.add_batch_attempt(found, attempt.id)
        return WriteAttempt(attempt.id, earlier=recorded.attempts,
                            legacy_replay=not recorded.attempts)

    def _with_aborts_settled_since(self, outcomes: Mapping[str, str],
                                   recorded: BatchIntent) -> dict[str, str]:
        """``outcomes`` with the windows the recorded batch aborted that are no longer
        registered: their capture, resumed before this replay, settled them the same way
        (aborted, then forgotten: ``Capturer._recover``), so this replay never saw them.
        An aborted window adds nothing to a batch, so the replay writes the same data."""
        settled = dict(outcomes)
        for wid, status in recorded.windows.items():
            if status != "aborted" or wid in settled:
                continue
            found = self.state.get_window(wid)
            if found is None or found.value.status == "aborted":
                settled[wid] = "aborted"
        return settled

    def _commit(self, new_state: PositionState, expected: int, ranges: list[RangeUpdate],
                windows: list[WindowUpdate]) -> CommitResult:
        def still_ours() -> bool:
            current = self.state.get_position()
            return current is not None and current.version == expected

        return _retry_conflicts(
            lambda: self.state.commit_batch(new_state, expected, ranges=ranges, windows=windows),
            still_ours,
        )

    def _flush(
        self,
        pending: _Pending,
        batch_no: int,
        committed: Versioned[PositionState],
        summary: TailSummary,
        later: _Pending | None = None,
    ) -> Versioned[PositionState]:
        """Write and commit ``pending`` as batch ``batch_no`` once its pinned chunks have
        their files; ``later``: the batch being built after it (see :meth:`_settle_pinned`)."""
        assert pending.end is not None and pending.end_position is not None
        began = time.monotonic()
        self._settle_pinned(pending, later)
        self.state.check_leader()
        attempt = self._record_intent(pending, batch_no, committed)
        app_id = committed.value.txn_app_id(self.state.source)
        metadata = {
            "dblog.batch": batch_no,
            "dblog.from_lsn": committed.value.position.lsn,
            "dblog.to_lsn": pending.end_position.lsn,
            "dblog.windows_closed": sorted(
                w for w, u in pending.window_updates.items() if u.status != "registered"
            ),
            "dblog.tailer": self.identifier,  # who wrote it (a standby that took over)
        }
        report = BatchReport(batch_no, pending.end_position, pending.events,
                             commit_ts_ms=pending.commit_ts_ms)
        emitted_rows: dict[str, int] = {}
        deleted_rows: dict[str, int] = {}
        crash_point("tail.before_delta")
        for table, tb in pending.tables.items():
            report.table_events[table] = len(tb.events) + len(tb.truncates)
            for schema in pending.schemas.get(table, []):
                self.sink.ensure_schema(schema)
            if not self.sink.known_columns(table):
                if not (tb.events or tb.emissions):
                    # Only TRUNCATEs / DROPs of a table the lake holds nothing of: nothing
                    # to empty (and a dropped table has no schema left to ask for).
                    log.info("%s: truncated or dropped before the lake held any of it; "
                             "nothing to empty", table)
                    continue
                self.sink.ensure_schema(self.dialect.table_schema(table))
            self.state.check_leader()
            _, results = self.sink.write_table_batch(tb, batch_no, metadata, attempt=attempt,
                                                     app_id=app_id, merge_mirror=False)
            crash_point("tail.after_table_write")
            for r in results:
                emitted_rows[r.window_id] = r.rows_emitted
                deleted_rows[r.window_id] = r.rows_deleted
        ranges: list[RangeUpdate] = []
        touched: set[tuple[str, str]] = set()
        for wid, update in pending.window_updates.items():
            doc = self._window_docs.get(wid)
            if update.status == "emitted" and doc is not None:
                key = (str(doc.extra["capture_id"]), str(doc.extra["range_id"]))
                rows = emitted_rows.get(wid, 0)
                selected = int((update.extra or {}).get("rows_selected", rows))
                cur = self._ranges[key]
                progress = replace(
                    cur.value,
                    rows_emitted=cur.value.rows_emitted + rows,
                    rows_dropped=cur.value.rows_dropped + selected - rows,
                    rows_deleted=cur.value.rows_deleted + deleted_rows.get(wid, 0),
                )
                self._ranges[key] = Versioned(progress, cur.version)
                touched.add(key)
                pending.window_updates[wid] = WindowUpdate(
                    wid, "emitted", extra={**(update.extra or {}), "rows_emitted": rows,
                                           "rows_deleted": deleted_rows.get(wid, 0)}
                )
                report.emitted_windows.append(wid)
                report.rows_emitted += rows
            elif update.status == "aborted":
                report.aborted_windows.append(wid)
        for key in sorted(touched):
            # The range's place as of this batch's last chunk of it: the tailer may have
            # pinned later chunks of the range for the batch after this one already.
            cur = self._ranges[key]
            ranges.append(RangeUpdate(key[0], key[1],
                                      _placed(cur.value, pending.advanced[key]), cur.version))
        crash_point("tail.after_delta")
        self.state.check_leader()
        new_state = PositionState(
            pending.end_position, dict(pending.end), batch_no,
            generation=committed.value.generation,
            commit_ts_ms=pending.commit_ts_ms or committed.value.commit_ts_ms,
        )
        result = self._commit(new_state, committed.version, ranges,
                              list(pending.window_updates.values()))
        for key in touched:
            self._ranges[key] = Versioned(self._ranges[key].value, result.range_versions[key])
        for wid, update in pending.window_updates.items():
            if update.status != "registered":
                self._proc.discard(wid)
                self._window_docs.pop(wid, None)
                self._lw_resume.pop(wid, None)
            elif (update.extra or {}).get("lw_resume"):
                self._lw_resume[wid] = (update.extra or {})["lw_resume"]
        report.seconds = time.monotonic() - began
        log.info("batch %d: %d events, %d emitted / %d aborted windows, %d chunk rows, "
                 "built in %.2fs, written in %.2fs", batch_no, pending.events,
                 len(report.emitted_windows), len(report.aborted_windows), report.rows_emitted,
                 began - pending.opened, report.seconds)
        summary.batches += 1
        summary.events += pending.events
        summary.rows_emitted += report.rows_emitted
        summary.position = pending.end_position
        if self.on_batch is not None:
            self.on_batch(report)
        return Versioned(new_state, result.position_version)


def _placed(progress: RangeProgress, at: RangeProgress) -> RangeProgress:
    """``progress`` (its row counts) at the place in its range ``at`` holds: the last key
    emitted, the chunks emitted and whether the range is done."""
    return replace(progress, last_emitted_key=at.last_emitted_key,
                   chunks_emitted=at.chunks_emitted, done=at.done)


def _retry_conflicts(attempt: Callable[[], CommitResult], still_ours: Callable[[], bool]
                     ) -> CommitResult:
    """Retry a commit that lost a race on a window document (a capture settling one of its
    windows); a moved position means another tailer: that is never retried."""
    for tries in range(10):
        try:
            return attempt()
        except StateConflict:
            if tries == 9 or not still_ours():
                raise
            time.sleep(0.05 * (tries + 1))
    raise AssertionError("unreachable")


__all__ = ["BatchReport", "TailOptions", "TailSummary", "Tailer", "chunk_path"]
