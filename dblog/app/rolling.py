"""The rolling verification's pure parts (no I/O): the walk over a table's key ranges, one
at a time; the place a continuous walk keeps in ZooKeeper; and its pace.

* A walk is either the ranges given (the ``full_state`` partitions', or the whole table as
  one range) or ranges of ``range_rows`` keys planned one at a time from the key index, as
  :func:`dblog.core.ranges.plan_more` plans partitions (same names and bounds), so a walk
  follows the table as it grows or shrinks.
* The place (``repair/<table digest>`` under the source's state) names the next range and
  counts the pass under way; a restarted walk resumes at that range.
* The pace: each range's checksummed rows are paid for after it is compared, at
  ``max_rows_per_s``; the next range waits until they are. Time spent in the work itself
  pays too, idle time between ranges buys no credit, so a pass over N rows takes about N /
  rate seconds, and no stretch from a range's start checksums more than the rate allows.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dblog.core.chunking import KeyRange
from dblog.core.events import Key, TableId, key_from_json, key_to_json
from dblog.core.ranges import range_name

PLACES = "repair"
"""ZooKeeper folder (under the source's root) of the continuous walks' places."""


def place_path(table: TableId) -> str:
    """Where a table's place is kept (a name ZooKeeper takes for any table)."""
    digest = hashlib.sha1(f"{table.database}\0{table.table}".encode()).hexdigest()[:16]
    return f"{PLACES}/{digest}"


@dataclass(frozen=True)
class Cursor:
    """Where a walk stands: the next range's index, name and lower bound."""

    index: int
    name: str
    lower: Key | None


@dataclass(frozen=True)
class Step:
    """One range of a walk."""

    index: int
    name: str
    key_range: KeyRange
    last: bool
    """The pass's last range (nothing follows it until the next pass)."""

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.index, self.name, self.key_range.lower)


class RangeWalk(Protocol):
    """A table's ranges, in key order, one at a time."""

    def first(self) -> Step: ...

    def after(self, step: Step) -> Step | None:
        """The range after ``step`` (None: the pass is over)."""
        ...

    def resume(self, cursor: Cursor) -> Step | None:
        """The range at ``cursor`` (None: the walk does not have it; start over)."""
        ...


def every_range(walk: RangeWalk) -> dict[str, KeyRange]:
    """Every range of one pass of ``walk``, by name, in key order."""
    step: Step | None = walk.first()
    out: dict[str, KeyRange] = {}
    while step is not None:
        out[step.name] = step.key_range
        step = walk.after(step)
    return out


class FixedWalk:
    """The ranges given (name -> key range, in key order)."""

    def __init__(self, ranges: Mapping[str, KeyRange]) -> None:
        if not ranges:
            raise ValueError("a walk over no ranges")
        self._steps = [Step(i, name, r, i == len(ranges) - 1)
                       for i, (name, r) in enumerate(ranges.items())]

    def first(self) -> Step:
        return self._steps[0]

    def after(self, step: Step) -> Step | None:
        return None if step.last else self._steps[step.index + 1]

    def resume(self, cursor: Cursor) -> Step | None:
        if 0 <= cursor.index < len(self._steps):
            found = self._steps[cursor.index]
            if found.name == cursor.name:
                return found
        return None


class PlannedWalk:
    """Ranges of ``range_rows`` keys planned as the walk reaches them: range ``i`` is
    ``(L_i, L_i+1]`` with ``L_i+1`` the ``range_rows``-th key above ``L_i``; a range with
    no key above its end is the last, open above (rows inserted there are in it)."""

    def __init__(self, key_after: Callable[[Key | None, int], Key | None],
                 range_rows: int) -> None:
        if range_rows <= 0:
            raise ValueError("range_rows must be positive")
        self._key_after = key_after
        self._range_rows = range_rows

    def _step(self, index: int, lower: Key | None) -> Step:
        boundary = self._key_after(lower, self._range_rows - 1)
        if boundary is None or self._key_after(boundary, 0) is None:
            return Step(index, range_name(index, lower), KeyRange(lower, None), True)
        return Step(index, range_name(index, lower), KeyRange(lower, boundary), False)

    def first(self) -> Step:
        return self._step(0, None)

    def after(self, step: Step) -> Step | None:
        return None if step.last else self._step(step.index + 1, step.key_range.upper)

    def resume(self, cursor: Cursor) -> Step | None:
        if cursor.name != range_name(cursor.index, cursor.lower):
            return None
        return self._step(cursor.index, cursor.lower)


@dataclass(frozen=True)
class Place:
    """A continuous walk's place in one table, and the counts of the pass under way."""

    table: TableId
    pass_number: int
    next: Cursor | None
    """The range to compare next (None: the start of the pass)."""
    rows: int = 0
    """Source rows compared in this pass so far."""
    ranges: int = 0
    differing: int = 0
    repaired: int = 0
    pass_started_ms: int = 0
    last_pass: Mapping[str, Any] | None = field(default=None, compare=True)
    """The previous pass's summary."""

    @classmethod
    def start(cls, table: TableId, now_ms: int) -> Place:
        return cls(table, 1, None, pass_started_ms=now_ms)

    def advanced(self, done: Step, following: Step | None, *, rows: int, differing: int,
                 repaired: int, now_ms: int) -> Place:
        """The place after ``done`` (``following`` comes next; None: a new pass begins)."""
        moved = replace(self, rows=self.rows + rows, ranges=self.ranges + 1,
                        differing=self.differing + differing,
                        repaired=self.repaired + repaired)
        if following is not None:
            return replace(moved, next=following.cursor)
        summary = {"pass": self.pass_number, "ranges": moved.ranges, "rows": moved.rows,
                   "differing": moved.differing, "repaired": moved.repaired,
                   "started_ms": self.pass_started_ms, "ended_ms": now_ms,
                   "seconds": round((now_ms - self.pass_started_ms) / 1000, 3)}
        return Place(self.table, self.pass_number + 1, None, pass_started_ms=now_ms,
                     last_pass=summary)

    def to_json(self) -> dict[str, Any]:
        nxt = self.next
        return {"table": str(self.table), "pass": self.pass_number,
                "next": None if nxt is None else {"index": nxt.index, "name": nxt.name,
                                                  "lower": key_to_json(nxt.lower)},
                "rows": self.rows, "ranges": self.ranges, "differing": self.differing,
                "repaired": self.repaired, "pass_started_ms": self.pass_started_ms,
                "last_pass": None if self.last_pass is None else dict(self.last_pass)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Place:
        nxt = d["next"]
        return cls(TableId.parse(d["table"]), int(d["pass"]),
                   None if nxt is None else Cursor(int(nxt["index"]), str(nxt["name"]),
                                                   key_from_json(nxt["lower"])),
                   rows=int(d["rows"]), ranges=int(d["ranges"]),
                   differing=int(d["differing"]), repaired=int(d["repaired"]),
                   pass_started_ms=int(d["pass_started_ms"]), last_pass=d["last_pass"])


class Pacer:
    """Holds the rows checksummed to ``rows_per_s``: :meth:`begin` when a range's work
    starts, :meth:`paid` with its rows when it is done (waits until they are paid for)."""

    def __init__(self, rows_per_s: float, *, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], bool] | None = None,
                 stop: threading.Event | None = None) -> None:
        if rows_per_s <= 0:
            raise ValueError(f"a pace must be positive, got {rows_per_s!r}")
        self.rows_per_s = float(rows_per_s)
        self._clock = clock
        self._wait = wait or (stop or threading.Event()).wait
        self._due = clock()
        """When the rows charged so far are paid for."""

    def begin(self) -> None:
        """A range's work starts: time idle before it buys no credit."""
        self._due = max(self._due, self._clock())

    def delay(self) -> float:
        """Seconds until the rows charged so far are paid for."""
        return max(0.0, self._due - self._clock())

    def paid(self, rows: int) -> bool:
        """Charge ``rows`` and wait until they are paid for; False if stopped first."""
        self._due += rows / self.rows_per_s
        while (pause := self.delay()) > 0:
            if self._wait(pause):
                return False
        return True
