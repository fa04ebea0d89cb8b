"""The tailer: holds the source's tailer lock, and starts each leading run from ZooKeeper
(the committed position, a recorded batch to replay, the open windows) before its loop
(:class:`~dblog.tail.loop.RunLoop`) reads the log."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dblog.core.batching import BatchCutter
from dblog.core.errors import DblogError, LeadershipLost, SourceError
from dblog.core.events import TableId
from dblog.lake.sink import DeltaSink
from dblog.sources.base import SourceDialect
from dblog.state import ABSENT, PositionState, StateStore, StateUnavailable, Versioned
from dblog.tail.assemble import Assembler
from dblog.tail.batch import Pending
from dblog.tail.commit import Committer, pending_replay
from dblog.tail.emissions import Emissions
from dblog.tail.heal import Healer
from dblog.tail.loop import RunLoop
from dblog.tail.mirrors import MirrorSchedule
from dblog.tail.options import BatchReport, TailOptions, TailSummary
from dblog.tail.prefetch import PrefetchingReader
from dblog.tail.windows import WindowBook

__all__ = ["Tailer", "new_generation"]

log = logging.getLogger("dblog.tail")  # one logger for the tailer, as operators know it


def new_generation() -> str:
    """A fresh name for a line of batch numbers (see ``PositionState.generation``)."""
    return uuid.uuid4().hex[:12]


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
        """``healer`` builds the :class:`~dblog.tail.heal.Healer` a leading run starts: it
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
        self._spark_key_order: dict[TableId, bool] = {}
        """Per table, whether Spark orders its keys like the source (asked once)."""
        self._mirrors = MirrorSchedule(state=state, sink=sink, tables=self.tables)
        """The mirror-merge schedule and compaction: they outlive a run."""

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
        :func:`dblog.lake.current.current_state` reads the current state meanwhile.
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
            self._mirrors.merge_at_end = merge_at_end
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

    # ---- a run's start ------------------------------------------------------------------

    def _run(self, stop: threading.Event, until_caught_up: bool, max_batches: int | None,
             reset_to_head: bool) -> TailSummary:
        committed = self._start_position(reset_to_head)
        # A run starts from ZooKeeper alone: a tailer object that lost the lock and won it
        # back (standby) must not trust windows or range versions it held before; each
        # run has its own window book, emissions and closed batches.
        windows = WindowBook(self.state, self.dialect, self.options.window_expiry_s)
        self._mirrors.begin(committed, self.options, windows, self.on_batch)
        replay = pending_replay(self.state, self.dialect, committed)
        if replay is not None:
            windows.replay_outcomes = replay[1]
        windows.expire()
        windows.refresh()
        start = windows.read_from(committed.value.source_position)
        at = self.dialect.to_position(committed.value.source_position)
        cutter = BatchCutter(committed=at, max_events=self.options.batch_max_events,
                             max_seconds=self.options.batch_max_seconds,
                             now=time.monotonic(), replay=replay[0] if replay else None,
                             pins_per_batch=self.options.pins_per_batch,
                             pin_ahead_s=self.options.pin_ahead_s)
        pending = Pending(start=dict(committed.value.source_position))
        # Decoding runs ahead in a thread of its own while batches are written, and the
        # mirrors merge in another.
        merger = self._mirrors.open_merger()
        healer = self._new_healer().start() if self._new_healer is not None else None
        coverage_checks = ThreadPoolExecutor(
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
                         if until_caught_up else at)
        try:
            emissions = Emissions(
                state=self.state, sink=self.sink, dialect=self.dialect, windows=windows,
                files_timeout_s=self.options.chunk_files_timeout_s, closed=[],
                coverage_checks=coverage_checks, key_order=self._spark_key_order, stop=stop)
            return RunLoop(
                dialect=self.dialect, options=self.options, reader=reader, cutter=cutter,
                windows=windows, emissions=emissions, mirrors=self._mirrors, healer=healer,
                assembler=Assembler(state=self.state, tracked=self._tracked,
                                    windows=windows, emissions=emissions,
                                    healing=self._new_healer is not None),
                committer=Committer(state=self.state, sink=self.sink, dialect=self.dialect,
                                    windows=windows, emissions=emissions,
                                    identifier=self.identifier, on_batch=self.on_batch),
                stop=stop, committed=committed, pending=pending, start=start,
                until_caught_up=until_caught_up, head_at_start=head_at_start,
                max_batches=max_batches,
            ).run()
        finally:
            reader.close()
            if healer is not None:
                healer.close()
            merger.close()
            coverage_checks.shutdown(wait=True, cancel_futures=True)

    def _start_position(self, reset_to_head: bool) -> Versioned[PositionState]:
        """The committed position a run starts at: the head of the log when there is none
        or ``reset_to_head`` (checked against the lake first)."""
        head: Mapping[str, Any] | None = None
        if reset_to_head or self.state.get_position() is None:
            # Starting at the head of the log: checked against the lake before anything
            # is written (ZooKeeper's position included).
            head = self.dialect.head_position()
            self._refuse_a_head_behind_the_lake(head)
        if reset_to_head:
            assert head is not None
            self._reset_to_head(head)
        return self._initial_position(head)

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
