"""How the tailer runs (:class:`TailOptions`) and what it reports (:class:`BatchReport`,
:class:`TailSummary`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dblog.app.config import TAIL_DEFAULTS
from dblog.core.events import Position, TableId

__all__ = ["BatchReport", "TailOptions", "TailSummary"]


@dataclass(frozen=True)
class TailOptions:
    """How the tailer runs; the defaults of the settings a configuration has are its own
    (``TailConfig``)."""

    batch_max_events: int = TAIL_DEFAULTS.batch_max_events
    batch_max_seconds: float = TAIL_DEFAULTS.batch_max_seconds
    poll_seconds: float = TAIL_DEFAULTS.poll_seconds
    read_transactions: int = 2000
    window_expiry_s: float = TAIL_DEFAULTS.window_expiry_s
    """A registered window whose high watermark is not seen within this many seconds of
    its registration is aborted (0: never)."""
    maintain_every_s: float = TAIL_DEFAULTS.maintain_every_s
    """Between batches, compact the tables' changelog and mirror files this often (0: never;
    ``dblog maintain`` does it while no tailer runs)."""
    mirror_every_s: float = TAIL_DEFAULTS.mirror_every_s
    """The mirror follows the changelog: the batches written since its last MERGE are
    merged in one MERGE once the oldest of them is this old, once they hold
    ``mirror_max_events`` events, when the tailer is idle with no chunk window open, and
    when a run ends (0: after every batch)."""
    mirror_every_s_behind: float = TAIL_DEFAULTS.mirror_every_s_behind
    """...or this often (if longer) while the tailer is behind the log: the last
    transaction it wrote committed over ``BEHIND_LAG_S`` ago (:mod:`dblog.tail.merger`)..."""
    mirror_every_s_capturing: float = TAIL_DEFAULTS.mirror_every_s_capturing
    """...or this often (if longer) while a capture's chunk window is open (held by the
    tailer or registered in ZooKeeper)."""
    mirror_max_events: int = TAIL_DEFAULTS.mirror_max_events
    """...or once the batches the mirrors lack hold this many log events."""
    chunk_files_timeout_s: float = TAIL_DEFAULTS.chunk_files_timeout_s
    """How long the tailer waits, at a chunk's high watermark, for a live capture to write
    the chunk's changelog files before it aborts the window (the capture re-selects it)."""
    pin_ahead_s: float = TAIL_DEFAULTS.pin_ahead_s
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
