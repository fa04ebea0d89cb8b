"""Capture chosen key ranges of one table while a separate tailer process runs.

This is what materializing ``full_state`` partitions does: one capture whose ranges are the
partitions' key ranges, run to the end. The chunks are emitted by the source's tailer (a
Dagster job of its own); a capture never starts a tailer itself, and it fails with a clear
message when no tailer holds the lock for long. Interrupted (the run was terminated), it
cancels its capture so no unfinished capture is left behind to pin positions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from dblog.app.runtime import Runtime
from dblog.capture import CaptureRequest, RangeReport, range_id_for
from dblog.core.chunking import KeyRange
from dblog.core.errors import DblogError
from dblog.core.events import TableId
from dblog.state import StateStore


class CapturePaused(DblogError):
    """A capture of the table is paused: resume (or cancel) it first."""


def paused_captures(state: StateStore, table: TableId) -> list[str]:
    """Ids of the table's paused captures."""
    return [f.value.capture_id for f in state.list_captures()
            if f.value.status == "paused" and table in f.value.tables]


def tailer_watchdog(rt: Runtime, grace_s: float = 120.0,
                    now: Callable[[], float] = time.monotonic) -> Callable[[], None]:
    """A health check that raises once no tailer has held the source's lock for ``grace_s``
    (captured chunks are emitted only by a running tailer)."""
    last_seen = now()

    def check() -> None:
        nonlocal last_seen
        if rt.state.lock_holder() is not None:
            last_seen = now()
        elif now() - last_seen > grace_s:
            raise DblogError(
                f"no tailer has run for source {rt.config.source.name} for {grace_s:.0f}s: "
                "captured chunks reach the lake only through the tailer; turn on its "
                "keep-alive sensor (Dagster) or run `dblog tail`")

    return check


def capture_ranges(
    rt: Runtime,
    table: TableId,
    ranges: Mapping[str, KeyRange],
    *,
    capture_id: str | None = None,
    stop: threading.Event | None = None,
    health_check: Callable[[], None] | None = None,
    on_progress: Callable[[RangeReport], None] | None = None,
) -> dict[str, RangeReport]:
    """Capture ``ranges`` (name -> key range, in key order) of ``table``; the report of each
    range by name. Raises :class:`CapturePaused` while a capture of the table is paused."""
    paused = paused_captures(rt.state, table)
    if paused:
        raise CapturePaused(
            f"capture {', '.join(paused)} of {table} is paused: run `dblog resume {table}` "
            f"(or `dblog cancel {table}`) before capturing it again")
    names = list(ranges)
    capturer = rt.capturer()
    capturer.health_check = health_check
    capture_id = capturer.plan(CaptureRequest((table,)), capture_id=capture_id,
                               ranges={table: [ranges[n] for n in names]})
    finished = False
    try:
        reports = capturer.run(capture_id, stop=stop, on_progress=on_progress)
        finished = True
    finally:
        if not finished:
            _cancel(rt, capture_id)
    by_range = {r.range_id: r for r in reports}
    # plan() numbered the ranges in the order given.
    return {name: by_range[range_id_for(table, i)] for i, name in enumerate(names)
            if range_id_for(table, i) in by_range}


def _cancel(rt: Runtime, capture_id: str) -> None:
    """Cancel an interrupted capture and abort its open windows (best effort: on a lost
    ZooKeeper the windows expire and the capture shows as unfinished in ``dblog status``)."""
    try:
        found = rt.state.get_capture(capture_id)
        if found is not None and found.value.status in ("running", "paused"):
            rt.state.set_capture_status(capture_id, "cancelled", found.version)
        rt.state.abort_open_windows(capture_id, "the capture's run was interrupted")
    except DblogError:
        pass
