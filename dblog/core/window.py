"""The pure DBLog watermark window processor (no I/O).

The log tailer feeds every log event, in log order, to
:meth:`WindowProcessor.process`, which returns what to forward downstream:

* a :class:`~dblog.core.events.ChangeEvent` passes through unchanged, in order;
  while a window on its table is *active* (low watermark seen, high not yet)
  its key is recorded as seen by that window;
* the high watermark of an active window yields a :class:`ChunkEmission`: the
  chunk rows whose keys were NOT seen in the window, to be emitted as READ
  events at the high watermark's position (see :func:`materialize`);
* a high watermark whose low watermark this instance never saw (tailer
  restarted in between, or HW logged before LW) yields :class:`WindowAborted`
  -- the capture must retry that chunk with fresh watermarks;
* a watermark matching no registered window yields :class:`UnknownWatermark`
  and changes no state: the tailer should refresh its window registry,
  :meth:`~WindowProcessor.register` the new windows and call ``process`` again
  with the same event; if it is still unknown (a stale or cancelled window) the
  tailer skips it.

Watermark events themselves are never forwarded. Windows are forgotten once
closed (emitted, aborted or discarded); only active windows hold key sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dblog.core.chunking import key_order
from dblog.core.events import (
    ChangeEvent,
    Key,
    Op,
    Position,
    Row,
    TableId,
    WatermarkEvent,
    Window,
)

__all__ = [
    "HW_WITHOUT_LW",
    "ChunkEmission",
    "Output",
    "UnknownWatermark",
    "WindowAborted",
    "WindowProcessor",
    "materialize",
]


@dataclass(frozen=True, slots=True)
class ChunkEmission:
    """Emit ``window``'s chunk minus ``dropped_keys`` as READ events at ``position``.

    ``position`` is the high watermark's; chunk row ``i`` (in key order, the
    dropped keys counted) gets ``Position(position.lsn, position.seq + 1 + i)``:
    a dropped key leaves its number unused, so a chunk's rows are numbered before
    the window's keys are known. This assumes no other log event shares the HW's
    lsn with a higher seq, true when the watermark write is its own
    transaction/rows event.
    """

    window: Window
    position: Position
    dropped_keys: frozenset[Key]
    commit_ts_ms: int | None = None


@dataclass(frozen=True, slots=True)
class WindowAborted:
    """``window`` closed without emission; its chunk must be captured again."""

    window: Window
    reason: str


@dataclass(frozen=True, slots=True)
class UnknownWatermark:
    """``event`` matched no registered window; refresh the registry and retry."""

    event: WatermarkEvent


Output = ChangeEvent | ChunkEmission | WindowAborted | UnknownWatermark
"""Everything :meth:`WindowProcessor.process` can return."""

HW_WITHOUT_LW = "high watermark seen before (or without) its low watermark"


class WindowProcessor:
    """Tracks open watermark windows over an ordered log event stream.

    A window is *open* from :meth:`register` until it is closed by its high
    watermark or :meth:`discard`, and *active* once its low watermark has been
    processed. Not thread-safe.
    """

    def __init__(self) -> None:
        self._windows: dict[str, Window] = {}  # open windows by id
        self._by_value: dict[str, tuple[str, bool]] = {}  # watermark -> (id, is_low)
        self._seen: dict[str, set[Key]] = {}  # active window id -> seen keys
        self._active_by_table: dict[TableId, set[str]] = {}

    @property
    def open_windows(self) -> tuple[Window, ...]:
        """Registered windows not closed yet, in registration order."""
        return tuple(self._windows.values())

    @property
    def active_windows(self) -> tuple[Window, ...]:
        """Open windows whose low watermark has been processed."""
        return tuple(w for w in self._windows.values() if w.window_id in self._seen)

    def is_known(self, value: str) -> bool:
        """Whether ``value`` is the low or high watermark of an open window."""
        return value in self._by_value

    def register(self, window: Window) -> None:
        """Open ``window``. Idempotent for an identical open window.

        Raises ``ValueError`` if its id or watermark values clash with another
        open window. Registering a window again after it closed reopens it, so
        callers should only register windows still in flight.
        """
        existing = self._windows.get(window.window_id)
        if existing is not None:
            if existing != window:
                raise ValueError(f"window {window.window_id!r} already registered as {existing}")
            return
        for value in (window.low, window.high):
            if value in self._by_value:
                other = self._by_value[value][0]
                raise ValueError(f"watermark {value!r} already used by window {other!r}")
        self._windows[window.window_id] = window
        self._by_value[window.low] = (window.window_id, True)
        self._by_value[window.high] = (window.window_id, False)

    def discard(self, window_id: str) -> Window | None:
        """Close a window without emission; returns it, or None if not open."""
        window = self._windows.pop(window_id, None)
        if window is None:
            return None
        del self._by_value[window.low]
        del self._by_value[window.high]
        if self._seen.pop(window_id, None) is not None:
            ids = self._active_by_table[window.table]
            ids.discard(window_id)
            if not ids:
                del self._active_by_table[window.table]
        return window

    def touch(self, table: TableId, keys: Sequence[Key]) -> None:
        """Record ``keys`` of ``table`` as changed in every active window on it, as a
        change event of each would (rows whose change the log does not describe: the
        chunk must not emit them, a heal brings them)."""
        for window_id in self._active_by_table.get(table, ()):
            self._seen[window_id].update(keys)

    def process(self, event: ChangeEvent | WatermarkEvent) -> list[Output]:
        """Consume the next log event; return the outputs, in order."""
        if isinstance(event, ChangeEvent):
            for window_id in self._active_by_table.get(event.table, ()):
                self._seen[window_id].add(event.key)
            return [event]
        found = self._by_value.get(event.value)
        if found is None:
            return [UnknownWatermark(event)]
        window_id, is_low = found
        window = self._windows[window_id]
        if is_low:
            if window_id not in self._seen:  # a repeated LW keeps the keys seen so far
                self._seen[window_id] = set()
                self._active_by_table.setdefault(window.table, set()).add(window_id)
            return []
        seen = self._seen.get(window_id)
        self.discard(window_id)
        if seen is None:
            return [WindowAborted(window, HW_WITHOUT_LW)]
        return [ChunkEmission(window, event.position, frozenset(seen), event.commit_ts_ms)]


def materialize(
    emission: ChunkEmission, chunk_rows: Sequence[tuple[Key, Row]]
) -> list[ChangeEvent]:
    """The READ events of ``emission`` for its selected chunk ``chunk_rows``.

    Rows are sorted by :func:`~dblog.core.chunking.key_order` (a total order where a
    ``None`` component sorts first and is never compared with a value) and
    numbered from ``emission.position.seq + 1``; rows whose key is in
    ``emission.dropped_keys`` are then left out (their numbers stay unused, as
    the capture numbers its rows before the window closes). Keys must be normalized the
    same way by the log decoder and the chunk reader (equal and equal-hashing).
    Reference semantics for the Spark sink; raises ``ValueError`` on a
    duplicate key.
    """
    rows: dict[Key, Row] = {}
    for key, row in chunk_rows:
        if key in rows:
            raise ValueError(
                f"duplicate key in chunk of window {emission.window.window_id}: {key!r}"
            )
        rows[key] = row
    window = emission.window
    base = emission.position
    return [
        ChangeEvent(
            table=window.table,
            op=Op.READ,
            key=key,
            position=Position(base.lsn, base.seq + 1 + i),
            after=rows[key],
            commit_ts_ms=emission.commit_ts_ms,
            window_id=window.window_id,
        )
        for i, key in enumerate(sorted(rows, key=key_order))
        if key not in emission.dropped_keys
    ]
