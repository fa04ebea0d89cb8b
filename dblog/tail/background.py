"""Runs a tailer in a background thread while a capture runs in the foreground.

``dblog capture`` works alone: it tails in-process until its chunks are emitted. While another
process holds the source's tailer lock it stands by and relies on that tailer, taking over as
soon as the lock frees up (e.g. when a crashed tailer's ZooKeeper session expires).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from dblog.core.errors import DblogError, LeadershipLost, LockHeld
from dblog.core.outage import unreachable

if TYPE_CHECKING:
    from dblog.tail import Tailer, TailSummary


log = logging.getLogger(__name__)


class BackgroundTailer:
    """A tailer on a daemon thread; :meth:`check` re-raises its failure in the caller."""

    def __init__(self, tailer: Tailer, outage_patience_s: float = 120.0, *,
                 merge_at_end: bool = True) -> None:
        self.tailer = tailer
        self.outage_patience_s = outage_patience_s
        self.merge_at_end = merge_at_end
        """Whether a stop waits for every mirror to be merged (``Tailer.run``)."""
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="dblog-tailer", daemon=True)
        self.external = False
        self.summary: TailSummary | None = None

    def _main(self) -> None:
        outage_began: float | None = None
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    self.summary = self.tailer.run(stop=self._stop, lock_timeout=2.0,
                                                   merge_at_end=self.merge_at_end)
                    self.external = False
                    return
                except LockHeld:
                    self.external = True
                    outage_began = None
                    self._stop.wait(1.0)
                except LeadershipLost:
                    # Our ZooKeeper session was interrupted: another tailer may write now.
                    # Stand by like any other contender.
                    self.external = True
                    self._stop.wait(1.0)
                except Exception as exc:
                    # The source or ZooKeeper restarting: try again, for a while.
                    reason = unreachable(exc)
                    now = time.monotonic()
                    if outage_began is None or now - began > 10.0:
                        outage_began = now  # a new outage: the tailer had been running
                    if reason is None or now - outage_began > self.outage_patience_s:
                        raise
                    log.warning("in-process tailer: %s; trying again", reason)
                    self.external = True
                    self._stop.wait(2.0)
        except BaseException as exc:  # surfaced by check()
            self._error = exc

    def start(self) -> BackgroundTailer:
        self._thread.start()
        return self

    def check(self) -> None:
        if self._error is not None:
            raise DblogError(f"the in-process tailer failed: {self._error}") from self._error

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self.check()

    def __enter__(self) -> BackgroundTailer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
