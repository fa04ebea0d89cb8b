"""What a micro-batch hands the sink for one table (:class:`TableBatch`) and what the sink
reports back of its chunk emissions."""

from __future__ import annotations

from dataclasses import dataclass, field

from dblog.core.chunking import KeyRange
from dblog.core.events import ChangeEvent, Position, TableId
from dblog.core.window import ChunkEmission
from dblog.protocol.chunks import ChunkFiles


@dataclass(frozen=True)
class EmissionResult:
    """How one chunk emission went: chunk rows emitted (``r``) and mirror rows it proved
    gone from the source (``d`` rows, only for an emission with coverage)."""

    window_id: str
    table: TableId
    rows_emitted: int
    rows_deleted: int = 0


@dataclass
class BatchResult:
    """What one micro-batch wrote."""

    batch: int
    events_written: int = 0
    emissions: list[EmissionResult] = field(default_factory=list)


@dataclass
class TableBatch:
    """One table's share of a micro-batch, in log order.

    ``chunks``: window id -> the changelog files its capture wrote for the emission (see
    :mod:`dblog.state.handoff`); every emission has them.

    ``coverage``: window id -> the key range ``(lower, upper]`` its chunk select read
    completely (``None`` = open side). Mirror keys in that range that the chunk lacks
    and the window did not see change no longer exist in the source: they are written as
    ``d`` rows at the high watermark and deleted from the mirror. An emission without
    coverage deletes nothing.

    ``truncates``: positions, in log order, where the source table was truncated or dropped
    (interleaved with ``events`` by position). Each becomes a changelog row ``op = 't'``
    meaning *every row of the table before this position is gone*; the mirror keeps only the
    changes after the last one.
    """

    table: TableId
    events: list[ChangeEvent] = field(default_factory=list)
    emissions: list[ChunkEmission] = field(default_factory=list)
    chunks: dict[str, ChunkFiles] = field(default_factory=dict)
    coverage: dict[str, KeyRange] = field(default_factory=dict)
    truncates: list[Position] = field(default_factory=list)
