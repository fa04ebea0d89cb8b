"""A capture's windows after their high watermark: waiting for the tailer's verdict, and
settling what a crashed run left open."""

from __future__ import annotations

import threading
import time
from functools import partial

from dblog.capture.base import CaptureBase
from dblog.capture.options import LOOK_S, RangeReport
from dblog.core.errors import DblogError, StateConflict
from dblog.state import Lookout, WindowState, handoff
from dblog.state.handoff import chunk_path


class WindowSettling(CaptureBase):
    """Waits for a window's outcome and settles a range's windows."""

    def _wait(self, window_id: str, report: RangeReport,
              stop: threading.Event | None = None) -> str:
        """Wait until the tailer emitted or aborted the window (``"interrupted"``: stopped
        first; the window stays open)."""
        deadline = time.monotonic() + self.options.emission_timeout_s
        lookout = Lookout(partial(self.state.watch_window, window_id), LOOK_S)
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                return "interrupted"
            if not lookout.due():
                if self.health_check is not None:
                    self.health_check()
                lookout.wait(self.options.poll_seconds)
                continue
            found = self.state.get_window(window_id)
            if found is None:
                return "gone"
            status = found.value.status
            if self.health_check is not None:
                self.health_check()
            if status != "registered":
                lsn = found.value.extra.get("position")
                if isinstance(lsn, int):
                    report.first_lsn = lsn if report.first_lsn is None else report.first_lsn
                    report.last_lsn = lsn
                return status
            lookout.wait(self.options.poll_seconds)
        raise DblogError(
            f"window {window_id} was not emitted within {self.options.emission_timeout_s:.0f}s: "
            "is a tailer running for this source? (`dblog tail`)"
        )


    def _recover(self, capture_id: str, range_id: str,
                 stop: threading.Event | None = None) -> None:
        """Settle windows a crashed run left open for this range."""
        for ws in self._range_windows(capture_id, range_id):
            if ws.status != "registered":
                continue
            if handoff.read_files(self.state, ws.window.window_id) is not None:
                # Its files were written (after its high watermark): the tailer commits
                # them, written again for its attempt if need be.
                waited = self._wait(ws.window.window_id,
                                    RangeReport(capture_id, range_id, ws.window.table), stop)
                if waited == "interrupted":
                    return
            else:
                # The selected rows were held by the run that died: select them again.
                self._abandon(ws.window.window_id)
        self._cleanup(capture_id, range_id)


    def _range_windows(self, capture_id: str, range_id: str) -> list[WindowState]:
        """The windows this range registered (any status)."""
        return [
            found.value for found in self.state.list_windows()
            if (found.value.extra.get("capture_id"), found.value.extra.get("range_id"))
            == (capture_id, range_id)
        ]


    def _abandon(self, window_id: str) -> None:
        """Abort a window whose high watermark was never written (the tailer may be noting
        its low watermark at the same moment: re-read and retry)."""
        for _ in range(20):
            found = self.state.get_window(window_id)
            if found is None or found.value.status != "registered":
                return
            try:
                self.state.set_window_status(
                    window_id, "aborted", "capture stopped before its high watermark",
                    found.version,
                )
                return
            except StateConflict:
                time.sleep(0.05)
        raise DblogError(f"could not settle window {window_id}: it keeps changing")


    def _cleanup(self, capture_id: str, range_id: str) -> None:
        """Forget settled windows of this range: chunk descriptions (with their pins and
        files) and window documents. Files a window's pins had written and no commit added
        are left to VACUUM (it removes them once older than the table's retention)."""
        for ws in self._range_windows(capture_id, range_id):
            if ws.status == "registered":
                continue
            wid = ws.window.window_id
            self.state.delete(chunk_path(wid), recursive=True)
            self.state.remove_window(wid)

