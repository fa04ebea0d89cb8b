"""The capturer: plans a capture's ranges and runs them, ``parallel_ranges`` at a time."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from dblog.capture.options import CaptureRequest, RangeReport, range_id_for
from dblog.capture.parallel import run_at_once
from dblog.capture.walk import RangeWalk
from dblog.core.chunking import KeyRange
from dblog.core.errors import DblogError
from dblog.core.events import TableId, key_to_json
from dblog.core.outage import ride_out
from dblog.state import RangeProgress


class Capturer(RangeWalk):
    """Runs captures for one source. Thread-safe per range; ranges may run in parallel."""

    def plan(
        self,
        request: CaptureRequest,
        *,
        capture_id: str | None = None,
        ranges: dict[TableId, list[KeyRange]] | None = None,
    ) -> str:
        """Register a capture and its key ranges (default: one open range per table)."""
        ride_out(  # refuses unknown tables and tables without a PK; a restart is waited for
            lambda: [self.dialect.table_schema(table) for table in request.tables],
            patience_s=self.options.outage_patience_s,
            what="the capture was not started: run `dblog capture` again once it is back")
        capture_id = capture_id or uuid.uuid4().hex[:16]
        spec: dict[str, Any] = {
            "keys": [key_to_json(k) for k in request.keys] if request.keys is not None else None,
            "where": request.where,
        }
        planned_ranges: dict[str, RangeProgress] = {}
        for table in request.tables:
            planned = (ranges or {}).get(table) or [KeyRange(None, None)]
            for i, kr in enumerate(planned):
                progress = RangeProgress(table, kr.lower, kr.upper, last_emitted_key=kr.lower)
                planned_ranges[range_id_for(table, i)] = progress
        # One ZooKeeper transaction: a capture never exists without its ranges.
        self.state.create_capture(capture_id, request.tables, spec, planned_ranges)
        return capture_id


    def run(
        self,
        capture_id: str,
        *,
        stop: threading.Event | None = None,
        on_progress: Callable[[RangeReport], None] | None = None,
    ) -> list[RangeReport]:
        """Run every unfinished range of the capture, ``parallel_ranges`` at a time in
        their order; returns one report each, in their order (a range that a pause, cancel
        or stop kept from starting reports as such). A range that fails stops the others,
        and its error is raised.

        A source or ZooKeeper restart meanwhile is ridden out: the capture goes on from its
        saved progress (ranges already done report as done again)."""
        return ride_out(
            partial(self._run, capture_id, stop=stop, on_progress=on_progress),
            patience_s=self.options.outage_patience_s, stop=stop,
            what=f"capture {capture_id} stopped, its progress saved: run `dblog resume "
                 "TABLE` once the service is back")


    def _run(
        self,
        capture_id: str,
        *,
        stop: threading.Event | None = None,
        on_progress: Callable[[RangeReport], None] | None = None,
    ) -> list[RangeReport]:
        range_ids = sorted(self.state.list_ranges(capture_id))
        if not range_ids:
            raise DblogError(f"capture {capture_id} has no key ranges (its creation was "
                             "interrupted): cancel it and start a new capture")
        ran = run_at_once(
            range_ids,
            lambda range_id, halt: self.run_range(capture_id, range_id, stop=halt,
                                                  on_progress=on_progress),
            workers=self.options.parallel_ranges, stop=stop,
            ends_early=lambda report: report.status in ("paused", "cancelled", "stopped"),
            name=f"capture-{capture_id}")
        by_range = {report.range_id: report for report in ran}
        reports = [by_range.get(range_id) or self._not_started(capture_id, range_id)
                   for range_id in range_ids]
        if all(r.status == "done" for r in reports):
            found = self.state.get_capture(capture_id)
            if found is not None and found.value.status == "running":
                self.state.set_capture_status(capture_id, "done", found.version)
        return reports


    def _not_started(self, capture_id: str, range_id: str) -> RangeReport:
        """The report of a range a pause, cancel or stop kept from starting."""
        progress = self._progress(capture_id, range_id)
        status = self._status(capture_id)
        return RangeReport(capture_id, range_id, progress.table,
                           status="done" if progress.done
                           else status if status in ("paused", "cancelled") else "stopped",
                           rows_emitted=progress.rows_emitted,
                           rows_dropped=progress.rows_dropped,
                           rows_deleted=progress.rows_deleted)

