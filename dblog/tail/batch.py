"""The micro-batch being built (:class:`Pending`) and the chunks it pinned
(:class:`Pinned`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from dblog.core.chunking import KeyRange
from dblog.core.events import Position, TableId
from dblog.core.window import ChunkEmission
from dblog.lake.sink import TableBatch, WriteAttempt
from dblog.sources.base import TableSchema
from dblog.state import Lookout, RangeProgress, Versioned, WindowUpdate
from dblog.state.handoff import ChunkFiles, ChunkPin

__all__ = ["Pending", "Pinned", "StopRequested", "placed"]


class StopRequested(Exception):  # noqa: N818 - control flow, not an error
    """The run was asked to stop while its batch waited for pinned chunks' files."""


@dataclass
class Pinned:
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
    commits (:meth:`Committer.flush <dblog.tail.commit.Committer.flush>`)."""
    covered: KeyRange | None
    """The key range the chunk's select read completely, if the mirror may hold a row in
    it (:meth:`coverage`)."""
    deadline: float
    """When the tailer gives up waiting for the chunk's files."""
    lookout: Lookout
    """When to read the chunk's handoff again (its files, holder or window changed)."""
    mirror_check: Future[bool] | None = None
    """Whether the mirror holds a row in ``covered``: asked beside the log's reading
    (:meth:`Emissions._pin <dblog.tail.emissions.Emissions._pin>`)."""
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
class Pending:
    """The micro-batch being built."""

    start: Mapping[str, Any]
    tables: dict[TableId, TableBatch] = field(default_factory=dict)
    schemas: dict[TableId, list[TableSchema]] = field(default_factory=dict)
    window_updates: dict[str, WindowUpdate] = field(default_factory=dict)
    pinned: list[Pinned] = field(default_factory=list)
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


def placed(progress: RangeProgress, at: RangeProgress) -> RangeProgress:
    """``progress`` (its row counts) at the place in its range ``at`` holds: the last key
    emitted, the chunks emitted and whether the range is done."""
    return replace(progress, last_emitted_key=at.last_emitted_key,
                   chunks_emitted=at.chunks_emitted, done=at.done)
