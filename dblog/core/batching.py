"""Where the log is cut into micro-batches, and how a recorded batch is rebuilt on replay.

A batch replayed after a crash is written only for the tables where no earlier attempt at
it landed (``DeltaSink.write_table_batch``), so it must be **exactly** the batch that was
written (the same transactions, nothing more): otherwise a transaction that joined the
replayed batch is skipped with it and lost. Before writing, the tailer records the batch's
end position (the batch intent); on replay this module closes the batch exactly there:

* a transaction that ends past the recorded end is never part of the batch: the batch is
  closed *before* it (:meth:`BatchCutter.before`);
* the recorded end may lie past the last tracked transaction (untracked transactions, DDL,
  rollbacks and rotations move the reader without producing anything): the batch is closed
  as soon as the reader stands at or past it, even when nothing new arrives
  (:meth:`BatchCutter.idle`).

Outside replay a batch is closed after a transaction once it holds ``max_events`` events,
is ``max_seconds`` old or pinned ``pins_per_batch`` chunks, when the tailer has consumed
everything the reader had read so far while the reader follows the head of the log
(:meth:`BatchCutter.drained`: batches then grow with the lag by themselves, as the reader
reads ahead while the previous batch is written), and when the reader is idle and has moved
past the last batch end. A reader behind the head
(its reads come back full) closes batches by size and age only: on two cores, many small
batches cost the JVM time the decoder needs.

A batch holding pinned chunks (their windows' high watermarks were seen; their captures
write their changelog files) waits for those files before it is cut, while the reader reads
on and pins more; :meth:`BatchCutter.due` says when it is cut without them (a replayed
batch's recorded end, a full batch, a batch that pinned ``pins_per_batch`` chunks, a batch
whose log changes have waited ``pin_ahead_s``), and :meth:`BatchCutter.may_close` when such a
batch is closed to wait for them while the reader reads on into the next one.

Pure: positions are compared as :class:`~dblog.core.events.Position`; the source-native
position that goes with each (``native``) is carried through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dblog.core.errors import DblogError

__all__ = ["BatchCutter", "Cut", "Due", "ReplayMismatch"]

from dblog.core.events import Position


class ReplayMismatch(DblogError):
    """The log no longer rebuilds the recorded batch; writing it would lose or duplicate."""


@dataclass(frozen=True, slots=True)
class Cut:
    """Close the pending batch at ``end`` (source-native ``native``)."""

    end: Position
    native: Mapping[str, Any]


class Due(Enum):
    """Whether a possible cut is made now (:meth:`BatchCutter.due`)."""

    NOW = "now"
    """Cut now, whether or not the batch's pinned chunks have their files."""
    IF_FILES_READY = "if files ready"
    """Cut now only if every chunk the batch pinned has its files (else read on)."""
    NOT_YET = "not yet"
    """Read on: the batch is written after a closed one, no sooner than it must."""


class BatchCutter:
    """Decides batch boundaries for the tailer (see module docstring). Not thread-safe."""

    def __init__(
        self,
        *,
        committed: Position,
        max_events: int,
        max_seconds: float,
        now: float,
        replay: Cut | None = None,
        pins_per_batch: int | None = None,
        pin_ahead_s: float | None = None,
    ) -> None:
        """``pins_per_batch``: a batch that pinned this many chunks pins no more and is cut
        (None: no limit); ``pin_ahead_s``: a batch whose first log change waited this long
        is cut without its pinned chunks' files (None: never)."""
        if replay is not None and replay.end < committed:
            raise ReplayMismatch(
                f"the recorded batch ends at {replay.end}, before the committed position "
                f"{committed}"
            )
        self.max_events = max_events
        self.max_seconds = max_seconds
        self.pins_per_batch = pins_per_batch
        self.pin_ahead_s = pin_ahead_s
        self._committed = committed
        self._replay = replay
        self._events = 0
        self._pending: Cut | None = None
        self._opened = now

    @property
    def replaying(self) -> bool:
        """Whether the pending batch is a recorded one being rebuilt."""
        return self._replay is not None

    @property
    def pending(self) -> Cut | None:
        """Where the pending batch ends so far (``None``: nothing consumed yet)."""
        return self._pending

    @property
    def full(self) -> bool:
        """Whether the pending batch holds ``max_events`` events (it must close now)."""
        return self._events >= self.max_events

    def before(self, resume: Position) -> Cut | None:
        """Called before consuming a transaction ending at ``resume``: the cut to make first
        when that transaction lies past the recorded end of a replayed batch."""
        if self._replay is not None and resume > self._replay.end:
            return self._replay
        return None

    def pins_full(self, pinned: int) -> bool:
        """Whether a batch that pinned ``pinned`` chunks pins no more: it reached
        ``pins_per_batch`` (a replayed batch pins what its recorded end holds)."""
        return (self._replay is None and self.pins_per_batch is not None
                and pinned >= self.pins_per_batch)

    def changes_waited(self, first_change_at: float | None, now: float) -> bool:
        """Whether the batch's first log change (at ``first_change_at``; None: it holds
        none) has waited ``pin_ahead_s``."""
        return (first_change_at is not None and self.pin_ahead_s is not None
                and now - first_change_at >= self.pin_ahead_s)

    def due(self, *, closed: bool, pinned: int, first_change_at: float | None, now: float
            ) -> Due:
        """Whether to make a possible cut of the pending batch now. A batch holding
        ``pinned`` chunks waits for their files: the reader reads on meanwhile, and the
        high watermarks it finds are pinned too, so the captures write several chunks at
        once. A replayed batch's recorded end, a full batch, a batch that pinned
        ``pins_per_batch`` chunks and a batch whose log changes have waited
        ``pin_ahead_s`` are cut without them (:meth:`may_close`: such a batch is closed
        and the reader reads on into the next). While a batch is ``closed``, the next is
        cut only when full or its log changes have waited ``pin_ahead_s``: it is written
        after the closed one, no sooner than it must."""
        waited = self.changes_waited(first_change_at, now)
        if closed:
            return Due.NOW if self.full or waited else Due.NOT_YET
        if (self._replay is not None or self.full or waited or self.pins_full(pinned)
                or not pinned):
            return Due.NOW
        return Due.IF_FILES_READY

    def may_close(self, pinned: int) -> bool:
        """Whether a batch cut with ``pinned`` chunks whose files are missing is closed to
        wait for them while the reader reads on into the next batch (a replayed batch is
        written at once: its files are waited for then)."""
        return pinned > 0 and self._replay is None

    def waiting(self, pinned: int) -> Cut | None:
        """The reader is still reading (its read timed out): the cut to consider for a
        batch waiting for its ``pinned`` chunks' files, which looks for them meanwhile (a
        quiet log would hold it for a whole read); none for a replayed batch, which waits
        for its recorded end, or a batch without pins."""
        if self._replay is not None or not pinned:
            return None
        return self._pending

    def consumed(self, resume: Position, native: Mapping[str, Any], events: int, now: float,
                 pinned: int = 0) -> Cut | None:
        """Record a consumed transaction; the cut to make after it, if the batch is done:
        it holds ``max_events`` events, is ``max_seconds`` old, or pinned ``pinned``
        chunks, ``pins_per_batch`` (then the reader reads on into the next batch, which
        pins on)."""
        if resume <= self._committed:
            raise ValueError(f"transaction at {resume} is not after the batch start")
        if self._replay is not None and resume > self._replay.end:
            raise ReplayMismatch(
                f"a transaction ending at {resume} would join the recorded batch ending at "
                f"{self._replay.end}"
            )
        self._pending = Cut(resume, native)
        self._events += events
        if self._replay is not None:
            return self._replay if resume == self._replay.end else None
        if (self._events >= self.max_events or now - self._opened >= self.max_seconds
                or self.pins_full(pinned)):
            return self._pending
        return None

    def drained(self, behind: bool = False) -> Cut | None:
        """The tailer consumed every transaction the reader had read: the cut to make now
        (none while a recorded batch is rebuilt: only its recorded end closes it). None
        too when the reader is ``behind`` the head (its last read came back full): more is
        on its way, and the batch closes by size or age (:meth:`consumed`), so a tailer
        that is behind writes few large batches instead of many small ones."""
        if self._replay is not None or behind:
            return None
        return self._pending

    def idle(self, reader_at: Position, native: Mapping[str, Any]) -> Cut | None:
        """The reader returned nothing and stands at ``reader_at`` (past any transactions
        it skipped): the cut to make now, if any."""
        if self._replay is not None:
            return self._replay if reader_at >= self._replay.end else None
        if self._pending is None or reader_at > self._pending.end:
            if reader_at > self._committed:
                self._pending = Cut(reader_at, native)
        return self._pending

    def cut(self, made: Cut, now: float) -> None:
        """The batch ending at ``made`` was written and committed: start the next one."""
        self._committed = made.end
        self._replay = None
        self._pending = None
        self._events = 0
        self._opened = now
