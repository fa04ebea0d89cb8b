"""Repair dumps: find the key ranges where the mirror differs from the source and capture
only those (a DBLog capture, never a blind overwrite; a range's capture also deletes mirror
rows the source no longer has). ``capture_all`` captures every range instead."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipeline.capture import RangeReport
from pipeline.chunking import KeyRange
from pipeline.compare import RangeComparison, comparable_ranges, compare_twice
from pipeline.events import TableId
from pipeline.range_capture import capture_ranges
from pipeline.runtime import Runtime


@dataclass
class RepairReport:
    """What a repair looked at and did."""

    table: TableId
    ranges_checked: int = 0
    suspects: list[str] = field(default_factory=list)
    """Ranges that differed at the first comparison."""
    differing: list[RangeComparison] = field(default_factory=list)
    """Ranges that still differed when compared again: these were captured."""
    captures: dict[str, RangeReport] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def repaired(self) -> list[str]:
        return [name for name, r in self.captures.items() if r.status == "done"]


def repair_table(
    rt: Runtime,
    table: TableId,
    ranges: Mapping[str, KeyRange],
    *,
    capture_all: bool = False,
    capture_id: str | None = None,
    stop: threading.Event | None = None,
    health_check: Callable[[], None] | None = None,
) -> RepairReport:
    """Compare ``ranges`` (name -> key range, all of the table's), compare the differing ones
    again, and capture those that still differ (or every range with ``capture_all``)."""
    began = time.monotonic()
    report = RepairReport(table)
    if capture_all:
        to_capture = dict(ranges)
        report.ranges_checked = 0
    else:
        compared = comparable_ranges(rt, table, ranges)
        report.ranges_checked = len(compared)
        first, report.differing = compare_twice(rt, table, compared, check=health_check)
        report.suspects = sorted(c.name for c in first if not c.equal)
        to_capture = {c.name: c.key_range for c in report.differing}
    if to_capture:
        report.captures = capture_ranges(rt, table, to_capture, capture_id=capture_id,
                                         stop=stop, health_check=health_check)
    report.seconds = time.monotonic() - began
    return report
