"""The mirror follows the changelog: when the batches the mirrors lack are merged into them
(in a thread of their own, :class:`~dblog.tail.merger.MirrorMerger`), and the compaction of
the tables' files between batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from dblog.core.events import TableId
from dblog.core.faults import crash_point
from dblog.lake.sink import DeltaSink
from dblog.protocol.paths import MIRROR_DOC
from dblog.state import PositionState, StateStore, Versioned
from dblog.tail.merger import MirrorMerger, behind_the_log, mirror_due
from dblog.tail.options import BatchReport, TailOptions, TailSummary
from dblog.tail.windows import WindowBook

__all__ = ["CAPTURE_GAP_S", "MIRROR_DOC", "MirrorSchedule"]

log = logging.getLogger("dblog.tail")  # one logger for the tailer, as operators know it

CAPTURE_GAP_S = 5.0
"""For the mirror, a capture goes on for this long after the tailer settled one of its
windows, while ZooKeeper says it runs: its next chunk is being planned, or it waits for
its chunks' emission before it selects more (:meth:`MirrorSchedule.capturing`)."""


class MirrorSchedule:
    """When the mirrors merge, and the merges themselves; when the files are compacted. It
    lives as long as its tailer (when a capture last ran, and the last compaction, count
    across runs); :meth:`begin` starts each run."""

    def __init__(self, *, state: StateStore, sink: DeltaSink, tables: Sequence[TableId]
                 ) -> None:
        self.state = state
        self.sink = sink
        self.tables = tuple(tables)
        self.options = TailOptions()
        self.windows: WindowBook | None = None
        self.on_batch: Callable[[BatchReport], None] | None = None
        self.merger: MirrorMerger | None = None
        self.merge_at_end = True
        """Whether a run ends by merging every mirror (``run(merge_at_end=...)``)."""
        self.unmerged: set[TableId] = set()
        """Tables with changelog rows the mirror lacks (maybe: every table at a start)."""
        self.unmerged_since: float | None = None
        self.unmerged_events = 0
        self.mirror_doc_lsn: int | None = None
        """The position the ``mirror`` document in ZooKeeper last recorded."""
        self.window_settled_at: float | None = None
        """When a batch last emitted or aborted a chunk window (see :meth:`capturing`)."""
        self.capture_running: tuple[float, bool] = (0.0, False)
        """When ZooKeeper was last asked whether a capture runs, and its answer."""
        self.last_maintenance = time.monotonic()

    def begin(self, committed: Versioned[PositionState], options: TailOptions,
              windows: WindowBook, on_batch: Callable[[BatchReport], None] | None) -> None:
        """Start a run at ``committed``: what the mirrors lack, from the ``mirror``
        document (merging first what a new generation's gap would hide)."""
        self.options, self.windows, self.on_batch = options, windows, on_batch
        found_doc = self.state.get(MIRROR_DOC)
        # A generation's mirrors merged by none of its runs yet: it began at the head
        # (the run before may have died right after that).
        starts_over = (found_doc is None
                       or found_doc.value.get("generation") != committed.value.generation)
        if starts_over and self.merge_before_the_gap(committed.value):
            found_doc = self.state.get(MIRROR_DOC)
        # A crash may have left any mirror behind its changelog: every table is looked at.
        self.unmerged = set() if starts_over else set(self.tables)
        self.unmerged_since, self.unmerged_events = time.monotonic(), 0
        self.mirror_doc_lsn = int(found_doc.value["lsn"]) if found_doc is not None else None

    def open_merger(self) -> MirrorMerger:
        """The run's merger (its thread); :meth:`MirrorMerger.close` it when the run ends."""
        self.merger = MirrorMerger(self.merge_mirrors)
        return self.merger

    def finish(self, summary: TailSummary, committed: PositionState) -> TailSummary:
        """A run that ends cleanly leaves every mirror merged (unless asked not to: then a
        merge running now finishes as the merger closes, and none starts)."""
        assert self.merger is not None
        if not self.merge_at_end:
            self.merger.check()
            return summary
        self.request_merge(committed)
        self.merger.wait()
        return summary

    def windows_settled(self) -> None:
        """A batch just committed opened, emitted or aborted chunk windows."""
        self.window_settled_at = time.monotonic()

    def after_batch(self, tables: set[TableId], events: int, committed: PositionState
                    ) -> None:
        """A batch of ``events`` log events in ``tables`` was committed: merge if due."""
        self.note_unmerged(tables, events)
        assert self.merger is not None
        self.merger.check()
        if self.due(backlogged=behind_the_log(committed.commit_ts_ms, time.time())):
            self.request_merge(committed)

    def note_unmerged(self, tables: set[TableId], events: int) -> None:
        if tables and not self.unmerged:
            self.unmerged_since = time.monotonic()
        self.unmerged |= tables
        self.unmerged_events += events

    def due(self, *, backlogged: bool) -> bool:
        """Whether the batches the mirrors lack are old or many enough to merge now
        (``backlogged``: the tailer is behind the log, :func:`behind_the_log`; the period
        is longer while a chunk window is open too)."""
        since = self.unmerged_since
        unmerged_for_s = (None if not self.unmerged or since is None
                          else time.monotonic() - since)

        def due(capturing: bool) -> bool:
            return mirror_due(
                unmerged_for_s=unmerged_for_s,
                unmerged_events=self.unmerged_events, backlogged=backlogged,
                capturing=capturing,
                every_s=self.options.mirror_every_s,
                every_s_behind=self.options.mirror_every_s_behind,
                every_s_capturing=self.options.mirror_every_s_capturing,
                max_events=self.options.mirror_max_events)

        if self.capturing():
            return due(True)
        # The processor reads registered windows when idle or at a low watermark, so right
        # after a chunk's emission it may hold none while the capture's next one is open:
        # ZooKeeper is asked, only when that would decide.
        assert self.windows is not None
        return due(False) and (due(True) or not self.windows.unsettled(
            self.state.list_windows()))

    def capturing(self) -> bool:
        """Whether a capture is selecting chunks, for the mirror's period: a window is open
        in the log, or the tailer settled one within ``CAPTURE_GAP_S`` and a capture still
        runs (asked of ZooKeeper only then, at most once a second). Between two chunks, or
        while a capture waits for its chunks' emission, the tailer sees no window open; a
        MERGE started then (seconds of both cores) ran beside the capture's next chunks."""
        assert self.windows is not None
        if self.windows.proc.open_windows:
            return True
        settled = self.window_settled_at
        now = time.monotonic()
        if settled is None or now - settled >= CAPTURE_GAP_S:
            return False
        asked_at, running = self.capture_running
        if now - asked_at >= 1.0:
            running = any(found.value.status == "running"
                          for found in self.state.list_captures())
            self.capture_running = (now, running)
        return running

    def request_merge(self, committed: PositionState) -> None:
        """Hand the tables written since the last request to the mirror merger."""
        assert self.merger is not None
        if not self.unmerged and self.mirror_doc_lsn == committed.position.lsn:
            self.merger.check()
            return
        self.merger.request(committed, frozenset(self.unmerged))
        self.unmerged = set()
        self.unmerged_since, self.unmerged_events = None, 0

    def merge_mirrors(self, committed: PositionState, tables: frozenset[TableId]) -> None:
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
        self.mirror_doc_lsn = committed.position.lsn
        if merged:
            log.info("mirrors merged through batch %d: %s in %.2fs", committed.batch,
                     ", ".join(f"{t} ({n} rows)" for t, n in merged.items()),
                     time.monotonic() - began)
            if self.on_batch is not None:
                self.on_batch(BatchReport(
                    committed.batch, committed.position, 0, commit_ts_ms=committed.commit_ts_ms,
                    seconds=time.monotonic() - began, mirrors=merged, mirror_only=True))

    def maybe_maintain(self) -> None:
        """Compact small files every ``maintain_every_s``, between batches: the tailer is
        the tables' one writer, so no MERGE ever meets a compaction."""
        every = self.options.maintain_every_s
        if every <= 0 or time.monotonic() - self.last_maintenance < every:
            return
        self.state.check_leader()
        for table in self.tables:
            log.info("maintenance: %s", self.sink.maintain(table).summary())
        self.last_maintenance = time.monotonic()

    def merge_before_the_gap(self, committed: PositionState) -> bool:
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
            self.merge_mirrors(committed, tables)
        return bool(tables)
