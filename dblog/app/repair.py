"""Repair: the rolling verification, a continuous safety net for the mirror.

One key range at a time, a table's mirror is compared with its source (row count and
checksum on both sides at a known log position, :mod:`dblog.app.compare`); a range that
differs is compared again (a change between the two sides' reads makes a range differ once),
and one that still differs is captured (a DBLog capture of that range, never a blind
overwrite: it also deletes mirror rows the source no longer has), and is healed once the
mirror has merged that capture. Whatever made it diverge, a divergence is found within a
pass and healed by that capture.

The rows checksummed are paced at ``repair.max_rows_per_s`` (:class:`~dblog.app.rolling.Pacer`),
so a pass over N rows takes about N / rate seconds: that bounds the time to detection. One
pass walks a table once (``dblog repair``; the Dagster repair job; the
``mirror_matches_source`` check, which captures nothing); a continuous walk goes round the
tables for ever and keeps its place in ZooKeeper (``repair/<table digest>``), so a
restarted walk continues at the range it was at. ``capture_all`` captures every range at
once instead of comparing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from dblog.app.compare import WHOLE_TABLE, RangeComparison, compare_ranges
from dblog.app.rolling import (
    FixedWalk,
    Pacer,
    Place,
    PlannedWalk,
    RangeWalk,
    Step,
    every_range,
    place_path,
)
from dblog.app.runtime import Runtime
from dblog.capture import RangeReport
from dblog.capture.range_capture import capture_ranges
from dblog.core.chunking import KeyRange
from dblog.core.errors import DblogError, StateConflict
from dblog.core.events import TableId
from dblog.core.outage import unreachable
from dblog.state import ABSENT

log = logging.getLogger(__name__)

Outcome = Literal["equal", "differing", "repaired", "unrepaired"]
"""``differing``: still differed when compared again (and was not captured: a dry run);
``repaired``: captured, and the mirror has merged the capture; ``unrepaired``: its capture
did not finish."""

OUTAGE_PATIENCE_S = 300.0
"""How long a continuous walk rides out a source or ZooKeeper outage before it stops."""


@dataclass(frozen=True)
class RangeResult:
    """What one range's turn found and did."""

    table: TableId
    step: Step
    first: RangeComparison
    outcome: Outcome
    rows_checked: int
    """Source rows checksummed (every comparison of the range): what the pace charges."""
    seconds: float
    second: RangeComparison | None = None
    """The comparison again, when the first differed."""
    capture: RangeReport | None = None

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def suspect(self) -> bool:
        return not self.first.equal


@dataclass
class RepairReport:
    """What one pass over a table looked at and did."""

    table: TableId
    results: list[RangeResult] = field(default_factory=list)
    captures: dict[str, RangeReport] = field(default_factory=dict)
    """Every range captured, by name (with ``capture_all``: every range)."""
    seconds: float = 0.0
    complete: bool = True
    """False when a stop ended the pass before its last range."""

    @property
    def ranges_checked(self) -> int:
        return len(self.results)

    @property
    def rows_checked(self) -> int:
        return sum(r.first.source_rows for r in self.results)

    @property
    def suspects(self) -> list[str]:
        """Ranges that differed at the first comparison."""
        return sorted(r.name for r in self.results if r.suspect)

    @property
    def differing(self) -> list[RangeComparison]:
        """Ranges that still differed when compared again (their second comparison)."""
        return [r.second for r in self.results if r.second is not None and not r.second.equal]

    @property
    def repaired(self) -> list[str]:
        if not self.results:
            return [name for name, r in self.captures.items() if r.status == "done"]
        return [r.name for r in self.results if r.outcome == "repaired"]

    @property
    def unrepaired(self) -> list[str]:
        if not self.results:
            return [name for name, r in self.captures.items() if r.status != "done"]
        return [r.name for r in self.results if r.outcome == "unrepaired"]


def table_walk(rt: Runtime, table: TableId, ranges: Mapping[str, KeyRange] | None = None
               ) -> RangeWalk:
    """The ranges a pass walks: ``ranges`` (the ``full_state`` partitions'), else ranges
    of ``repair.range_rows`` planned from the key index; the whole table as one range when
    Spark cannot order its key like the database (per-range figures would then count rows
    in the wrong ranges)."""
    if not rt.dialect.spark_orders_keys_like_source(table):
        return FixedWalk({WHOLE_TABLE: KeyRange(None, None)})
    if ranges:
        return FixedWalk(ranges)
    return PlannedWalk(partial(rt.dialect.key_after, table), rt.config.repair.range_rows)


class Repairer:
    """Compares, and repairs, one range at a time, paced; one pass or for ever."""

    def __init__(self, rt: Runtime, *, dry_run: bool = False,
                 stop: threading.Event | None = None,
                 health_check: Callable[[], None] | None = None,
                 capture_prefix: str | None = None,
                 on_differs: Callable[[TableId, Step, RangeComparison], None] | None = None,
                 on_result: Callable[[RangeResult], None] | None = None,
                 pacer: Pacer | None = None) -> None:
        self.rt = rt
        self.dry_run = dry_run
        self.stop = stop or threading.Event()
        self.health_check = health_check
        self.capture_prefix = capture_prefix
        """Captures are named ``<prefix>-<range index>`` (None: fresh ids)."""
        self.on_differs = on_differs
        self.on_result = on_result
        self.pacer = pacer or Pacer(rt.config.repair.max_rows_per_s, stop=self.stop)

    # ---- one range --------------------------------------------------------------------

    def _compare(self, table: TableId, step: Step) -> RangeComparison:
        (found,) = compare_ranges(self.rt, table, {step.name: step.key_range},
                                  check=self.health_check)
        return found

    def check(self, table: TableId, step: Step) -> RangeResult:
        """Compare one range (again when it differs) and capture it if it still differs
        (then wait for the mirror to merge the capture)."""
        began = time.monotonic()
        first = self._compare(table, step)
        rows = first.source_rows
        second = capture = None
        outcome: Outcome = "equal"
        if not first.equal:
            second = self._compare(table, step)
            rows += second.source_rows
            if not second.equal:
                outcome = "differing"
                if self.on_differs is not None:
                    self.on_differs(table, step, second)
        if outcome == "differing" and not self.dry_run:
            capture_id = (None if self.capture_prefix is None
                          else f"{self.capture_prefix}-{step.index:06d}")
            capture = capture_ranges(self.rt, table, {step.name: step.key_range},
                                     capture_id=capture_id,
                                     health_check=self.health_check).get(step.name)
            outcome = "unrepaired"
            if capture is not None and capture.status == "done":
                # Healed once the mirror holds the capture: wait for its merge. (Compared
                # again, a range that writers change keeps differing by their changes.)
                self.rt.wait_caught_up(self.health_check or (lambda: None), timeout=600)
                outcome = "repaired"
        result = RangeResult(table, step, first, outcome, rows, time.monotonic() - began,
                             second, capture)
        if self.on_result is not None:
            self.on_result(result)
        return result

    # ---- one pass ---------------------------------------------------------------------

    def one_pass(self, table: TableId, walk: RangeWalk | None = None) -> RepairReport:
        """Walk ``table`` once from its first range (a stop ends it at a range boundary)."""
        began = time.monotonic()
        walk = walk or table_walk(self.rt, table)
        report = RepairReport(table)
        step: Step | None = walk.first()
        while step is not None:
            self.pacer.begin()
            result = self.check(table, step)
            report.results.append(result)
            if result.capture is not None:
                report.captures[step.name] = result.capture
            step = walk.after(step)
            if not self.pacer.paid(result.rows_checked) or self.stop.is_set():
                report.complete = step is None
                break
        report.seconds = time.monotonic() - began
        return report

    # ---- for ever ---------------------------------------------------------------------

    def continuously(self, tables: Sequence[TableId],
                     walks: Mapping[TableId, RangeWalk] | None = None,
                     on_pass: Callable[[TableId, Mapping[str, Any]], None] | None = None
                     ) -> None:
        """Go round ``tables`` one range of each at a time until stopped, each from the
        place ZooKeeper keeps for it; ``on_pass`` gets each finished pass's summary. A
        source or ZooKeeper outage is waited out for :data:`OUTAGE_PATIENCE_S`."""
        chosen = {t: (walks or {}).get(t) or table_walk(self.rt, t) for t in tables}
        outage_began: float | None = None
        while not self.stop.is_set():
            for table, walk in chosen.items():
                if self.stop.is_set():
                    return
                try:
                    summary = self.next_range(table, walk)
                    outage_began = None
                except Exception as exc:
                    reason = unreachable(exc)
                    now = time.monotonic()
                    outage_began = outage_began or now
                    if reason is None or now - outage_began > OUTAGE_PATIENCE_S:
                        raise
                    log.warning("repair of %s: %s; trying again", table, reason)
                    self.stop.wait(5.0)
                    continue
                if summary is not None and on_pass is not None:
                    on_pass(table, summary)

    def next_range(self, table: TableId, walk: RangeWalk) -> Mapping[str, Any] | None:
        """Compare (and repair) the range at the table's place, move the place on, and
        wait for the pace; the pass's summary when that was its last range."""
        path = place_path(table)
        found = self.rt.state.get(path)
        place = Place.start(table, _now_ms())
        version = ABSENT
        if found is not None:
            place, version = Place.from_json(found.value), found.version
        step = walk.resume(place.next) if place.next is not None else None
        step = step or walk.first()
        self.pacer.begin()
        result = self.check(table, step)
        following = walk.after(step)
        moved = place.advanced(step, following, rows=result.first.source_rows,
                               differing=int(result.outcome != "equal"),
                               repaired=int(result.outcome == "repaired"), now_ms=_now_ms())
        try:
            self.rt.state.put(path, moved.to_json(), version)
        except StateConflict:
            # Another walk of the table moved the place meanwhile: go on from its place.
            log.warning("repair of %s: another walk moved its place; following it", table)
        self.pacer.paid(result.rows_checked)
        return moved.last_pass if following is None else None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def repair_table(
    rt: Runtime,
    table: TableId,
    ranges: Mapping[str, KeyRange] | None = None,
    *,
    capture_all: bool = False,
    dry_run: bool = False,
    capture_id: str | None = None,
    stop: threading.Event | None = None,
    health_check: Callable[[], None] | None = None,
    on_result: Callable[[RangeResult], None] | None = None,
) -> RepairReport:
    """One pass over ``table`` (its ``ranges``, name -> key range, or ranges planned from
    its key index), or, with ``capture_all``, a capture of every range at once."""
    if capture_all:
        if dry_run:
            raise DblogError("a dry run captures nothing: it cannot capture every range")
        began = time.monotonic()
        report = RepairReport(table)
        report.captures = capture_ranges(
            rt, table, dict(ranges or every_range(table_walk(rt, table))),
            capture_id=capture_id, stop=stop, health_check=health_check)
        report.seconds = time.monotonic() - began
        return report
    repairer = Repairer(rt, dry_run=dry_run, stop=stop, health_check=health_check,
                        capture_prefix=capture_id, on_result=on_result)
    return repairer.one_pass(table, table_walk(rt, table, ranges))
