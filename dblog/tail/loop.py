"""The run loop: read committed transactions, assemble them into the batch being built, cut
it where :class:`~dblog.core.batching.BatchCutter` says, write and commit it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, TypeGuard

from dblog.core.batching import BatchCutter, Cut, Due
from dblog.core.events import Position
from dblog.sources.base import SourceDialect, Transaction, confirm_log
from dblog.state import PositionState, Versioned
from dblog.tail.assemble import Assembler
from dblog.tail.batch import Pending, StopRequested
from dblog.tail.commit import Committer
from dblog.tail.emissions import Emissions
from dblog.tail.heal import Healer
from dblog.tail.mirrors import MirrorSchedule
from dblog.tail.options import TailOptions, TailSummary
from dblog.tail.prefetch import PrefetchingReader
from dblog.tail.windows import WindowBook

__all__ = ["PINNED_POLL_S", "QUIET_S", "RunLoop"]

log = logging.getLogger("dblog.tail")  # one logger for the tailer, as operators know it

QUIET_S = 5.0
"""``--until-caught-up`` also ends after the reader found nothing new this long."""
PINNED_POLL_S = 0.02
"""How long the log reader waits for more while the batch waits for pinned chunks' files:
how soon the batch is written once they are published (no ZooKeeper read in between)."""


class RunLoop:
    """One leading run from its start position: the batch being built (:attr:`pending`),
    the batches cut but not written (:attr:`closed`) and the committed position."""

    def __init__(self, *, dialect: SourceDialect, options: TailOptions,
                 reader: PrefetchingReader, cutter: BatchCutter, windows: WindowBook,
                 assembler: Assembler, emissions: Emissions, committer: Committer,
                 mirrors: MirrorSchedule, healer: Healer | None, stop: threading.Event,
                 committed: Versioned[PositionState], pending: Pending,
                 start: Mapping[str, Any], until_caught_up: bool, head_at_start: Position,
                 max_batches: int | None) -> None:
        """``pending``: the first batch to build, from ``committed``; ``start``: where the
        log is read from (transactions up to ``committed`` are re-read in warm-up);
        ``head_at_start``: the position ``until_caught_up`` reads through."""
        self.dialect = dialect
        self.options = options
        self.reader = reader
        self.cutter = cutter
        self.windows = windows
        self.assembler = assembler
        self.emissions = emissions
        self.committer = committer
        self.mirrors = mirrors
        self.healer = healer
        self.stop = stop
        self.committed = committed
        self.until_caught_up = until_caught_up
        self.head_at_start = head_at_start
        self.max_batches = max_batches
        self.summary = TailSummary()
        # Transactions up to the committed position were written already: they are re-read
        # (warm-up) only so that open windows see their keys again.
        self.warm_until = dialect.to_position(committed.value.source_position)
        self.pending = pending
        self.closed = emissions.closed
        """Batches cut but not written: they wait for their pinned chunks' files while the
        log is read on into the next batch (at most one; written in order)."""
        self.last_resume: Mapping[str, Any] = start
        self.quiet_since: tuple[Any, float] | None = None

    def run(self) -> TailSummary:
        """Tail until stopped, caught up (``until_caught_up``) or ``max_batches`` written."""
        try:
            while not self.stop.is_set():
                if self._step():
                    break
        except StopRequested:
            # Asked to stop while waiting for chunk files: the batch is left unwritten (and
            # unrecorded); the next run reads it again from the committed position.
            pass
        return self.mirrors.finish(self.summary, self.committed.value)

    def _step(self) -> bool:
        """One read and what follows it; True when the run ends."""
        txs = self.reader.read(
            max_transactions=self.options.read_transactions,
            # while captures write pinned chunks, look at their files often
            max_wait_s=(min(self.options.poll_seconds, PINNED_POLL_S)
                        if self.pending.pinned or self.closed
                        else self.options.poll_seconds),
        )
        if self._write_closed(wait=False):
            return True
        for tx in txs:
            if self._take(tx):
                return True
        if txs:
            # Everything read so far is in the batch: write it now rather than wait for
            # more (the reader reads on meanwhile), unless the reader is behind the head:
            # then the batch closes by size or age.
            cut = self.cutter.drained(self.reader.behind) if self.reader.drained else None
            return self._due(cut) and self._cut_at(cut)
        if self.reader.timed_out:
            # The reader still reads: a batch waiting for its pinned chunks' files looks
            # for them meanwhile (a quiet log would hold it for a whole read); a replayed
            # batch waits for its recorded end.
            cut = self.cutter.waiting(len(self.pending.pinned))
            return self._due(cut) and self._cut_at(cut)
        return self._idle()

    def _take(self, tx: Transaction) -> bool:
        """Assemble ``tx`` into the batch, cutting it before or after where due; True when
        enough batches were written."""
        resume = self.dialect.to_position(tx.resume)
        if resume <= self.warm_until:
            self.assembler.consume(tx, self.pending, self.last_resume, warm=True)
            self.last_resume = tx.resume
            return False
        cut = self.cutter.before(resume)
        if cut is not None and self._cut_at(cut):
            return True
        events_before = self.pending.events
        self.assembler.consume(tx, self.pending, self.last_resume, warm=False)
        self.last_resume = tx.resume
        cut = self.cutter.consumed(resume, tx.resume, self.pending.events - events_before,
                                   time.monotonic(), pinned=len(self.pending.pinned))
        return self._due(cut) and self._cut_at(cut)

    def _idle(self) -> bool:
        """The reader found nothing new: cut where it stands, end a run caught up, and
        look at the windows and the mirrors; True when the run ends."""
        here = self.reader.resume
        cut = (self.cutter.idle(self.dialect.to_position(here), here) if here
               else self.cutter.pending)
        if cut is not None and not self._due(cut):
            return False  # the batch waits for its pinned chunks' files
        if cut is not None:
            if self._cut_at(cut):
                return True
        elif (self.until_caught_up and not self.cutter.replaying and self._caught_up(here)
              and self._healed()):
            self._write_closed(wait=True)
            return True
        if not self.cutter.replaying:
            docs = self.windows.refresh()
            self.windows.expire_if_due(docs)
            if cut is None and (not self.mirrors.capturing()
                                or self.mirrors.due(backlogged=False)):
                self.mirrors.request_merge(self.committed.value)
        return False

    def _due(self, cut: Cut | None) -> TypeGuard[Cut]:
        """Whether to make ``cut`` now (:meth:`BatchCutter.due`; a batch that may wait for
        its pinned chunks' files is cut once they are there)."""
        if cut is None:
            return False
        verdict = self.cutter.due(closed=bool(self.closed), pinned=len(self.pending.pinned),
                                  first_change_at=self.pending.first_change_at,
                                  now=time.monotonic())
        return verdict is Due.NOW or (verdict is Due.IF_FILES_READY
                                      and self.emissions.pinned_files_ready(self.pending))

    def _cut_at(self, cut: Cut) -> bool:
        """Cut the pending batch at ``cut``: write it now, or, while its pinned chunks'
        files are missing, close it and read on into the next batch (whose high
        watermarks are pinned meanwhile, so their captures write at once). True when
        enough batches were written."""
        self.pending.end, self.pending.end_position = dict(cut.native), cut.end
        if self._write_closed(wait=True):
            return True
        to_close = (self.cutter.may_close(len(self.pending.pinned))
                    and not self.emissions.pinned_files_ready(self.pending))
        batch, self.pending = self.pending, Pending(start=dict(cut.native))
        if to_close:
            log.info("batch closed at %s waits for %d pinned chunks' files; the log is "
                     "read on into the next", cut.end, len(batch.pinned))
            self.cutter.cut(cut, time.monotonic())
            self.closed.append(batch)
            return False
        enough = self._write(batch)
        self.cutter.cut(cut, time.monotonic())
        self.pending.opened = time.monotonic()
        return enough

    def _write_closed(self, *, wait: bool) -> bool:
        """Write the closed batch once its pinned chunks have their files (``wait``: wait
        for them now, reading nothing meanwhile); True when enough batches were written."""
        if not self.closed or not (wait or self.emissions.pinned_files_ready(self.closed[0])):
            return False
        return self._write(self.closed.pop(0))

    def _write(self, batch: Pending) -> bool:
        """Write and commit a cut batch (the batch being built after it: :attr:`pending`);
        True when enough batches were written."""
        events = batch.events
        self.committed = self.committer.flush(batch, self.committed.value.batch + 1,
                                              self.committed, self.summary,
                                              later=self.pending)
        if batch.window_updates:  # it opened, emitted or aborted chunk windows
            self.mirrors.windows_settled()
        tables = set(batch.tables)  # with the pinned chunks' tables, settled in the flush
        confirm_log(self.reader, self.windows.log_needed_from(self.committed.value))
        self.mirrors.after_batch(tables, events, self.committed.value)
        self.windows.replay_outcomes = None
        self.windows.expire_if_due()
        self.mirrors.maybe_maintain()
        return self.max_batches is not None and self.summary.batches >= self.max_batches

    def _caught_up(self, here: Mapping[str, Any] | None) -> bool:
        """The reader found nothing new and stands at or past the head the run started
        at, or has not moved for QUIET_S (events it never reports, such as a new binlog
        file's headers, can lie between its position and that head)."""
        if here is None or self.dialect.to_position(here) >= self.head_at_start:
            return True
        now = time.monotonic()
        if self.quiet_since is None or self.quiet_since[0] != here:
            self.quiet_since = (dict(here), now)
        return now - self.quiet_since[1] >= QUIET_S

    def _healed(self) -> bool:
        """Whether no heal runs or waits (``--until-caught-up`` ends only then)."""
        return self.healer is None or self.healer.idle()
