"""Merges the mirrors in a thread of their own, so batches keep going into the changelog
while a MERGE runs.

The tailer hands over what to merge (the committed position and the tables written since
the last request); requests made while a merge runs are folded into one. A failure (a lost
lock, a Delta error) is kept and raised in the tailer's thread at its next request or wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dblog.core.events import TableId, seconds_since_commit
from dblog.state import PositionState

MergeFn = Callable[[PositionState, frozenset[TableId]], None]


BEHIND_LAG_S = 10.0
"""A tailer whose last written transaction committed longer ago than this is behind the
log. (By the source's clock against the tailer's: a source clock that lags the tailer's by
more than this makes every tailer look behind, and its mirror merge every
``tail.mirror_every_s_behind``.)"""


def behind_the_log(commit_ts_ms: int | None, now_s: float) -> bool:
    """Whether a tailer whose last written transaction committed at ``commit_ts_ms``
    (None: unknown) is behind the log at ``now_s`` (seconds since the epoch)."""
    since = seconds_since_commit(commit_ts_ms, now_s)
    return since is not None and since > BEHIND_LAG_S


def mirror_due(*, unmerged_for_s: float | None, unmerged_events: int, backlogged: bool,
               capturing: bool, every_s: float, every_s_behind: float,
               every_s_capturing: float, max_events: int) -> bool:
    """Whether the batches the mirrors lack should be merged now.

    ``unmerged_for_s``: how old the oldest of them is (None: there are none). They are
    merged once that is ``every_s``, or the longest period that applies: ``every_s_behind``
    while the tailer is ``backlogged`` (:func:`behind_the_log`), ``every_s_capturing``
    while ``capturing`` (a capture's chunk window is open). A MERGE costs seconds of the
    same two cores whatever it holds; a tailer behind the log needs them to catch up (its
    mirror is behind by the lag anyway), and a capture's chunks would otherwise be copied
    into the mirror beside the capture, merge after merge, instead of once after it.
    Or once they hold ``max_events``, whatever applies."""
    if unmerged_for_s is None:
        return False
    if unmerged_events >= max_events:
        return True
    every = max(every_s,
                every_s_behind if backlogged else 0.0,
                every_s_capturing if capturing else 0.0)
    return unmerged_for_s >= every


class MirrorMerger:
    """One background thread running ``merge(committed, tables)`` for the latest request."""

    def __init__(self, merge: MergeFn) -> None:
        self._merge = merge
        self._cond = threading.Condition()
        self._request: tuple[PositionState, frozenset[TableId]] | None = None
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="dblog-mirror", daemon=True)
        self._thread.start()

    def request(self, committed: PositionState, tables: frozenset[TableId]) -> None:
        """Merge ``tables`` (and those of any request not started yet) up to ``committed``."""
        with self._cond:
            self._raise_failure()
            if self._request is not None:
                tables = tables | self._request[1]
            self._request = (committed, tables)
            self._cond.notify_all()

    def check(self) -> None:
        """Raise the failure of a merge, if one failed."""
        with self._cond:
            self._raise_failure()

    def wait(self) -> None:
        """Until every request so far is merged (raises the merge's failure)."""
        with self._cond:
            while not self._idle() and self._error is None:
                self._cond.wait()
            self._raise_failure()

    def idle(self) -> bool:
        """Whether no merge is running and none is waiting to start."""
        with self._cond:
            return self._idle()

    def _idle(self) -> bool:
        return self._request is None and not self._busy

    def close(self, timeout: float = 600.0) -> None:
        """Stop after the merge running now (requests not started are dropped: the next
        tailer merges from the mirror's own record)."""
        with self._cond:
            self._closed = True
            self._request = None
            self._cond.notify_all()
        self._thread.join(timeout)

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._request is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                assert self._request is not None
                committed, tables = self._request
                self._request, self._busy = None, True
            try:
                self._merge(committed, tables)
            except BaseException as exc:  # raised in the tailer's thread
                with self._cond:
                    self._error, self._busy = exc, False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()


__all__ = ["BEHIND_LAG_S", "MirrorMerger", "behind_the_log", "mirror_due"]
