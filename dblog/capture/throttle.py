"""A capture's read-rate limit (``capture.max_rows_per_s``): a token bucket paid after the
fact, since a chunk's row count is known only once it is read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RowRate:
    """At most ``rows_per_s`` rows read on average, with bursts of one second's rows.

    A reader calls :meth:`wait` before a read and :meth:`charge` with the rows it got after.
    The balance grows by ``rows_per_s`` a second up to one second's rows; a read may take it
    below zero, and the next :meth:`wait` lasts until it is back above. Over any stretch of
    ``t`` seconds from the start, the rows charged are at most ``rows_per_s * (t + 1)`` plus
    the last read. Shared by the ranges a process runs.
    """

    def __init__(self, rows_per_s: float, *, clock: Callable[[], float] = time.monotonic,
                 ) -> None:
        if rows_per_s <= 0:
            raise ValueError(f"a read rate must be positive, got {rows_per_s!r}")
        self.rows_per_s = float(rows_per_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._balance = self.rows_per_s
        self._at = clock()

    def chunk_rows(self, seconds: float) -> int:
        """The most rows one read should ask for to take about ``seconds`` at the rate (a
        chunk's target time: fewer, larger chunks keep their fixed costs small, so a
        throttled capture still moves at about the rate)."""
        return max(1, int(self.rows_per_s * seconds))

    def _refill(self) -> float:
        now = self._clock()
        self._balance = min(self.rows_per_s,
                            self._balance + (now - self._at) * self.rows_per_s)
        self._at = now
        return self._balance

    def delay(self) -> float:
        """Seconds until a read may start (0: now)."""
        with self._lock:
            balance = self._refill()
        return 0.0 if balance >= -1e-6 else -balance / self.rows_per_s  # clock rounding

    def wait(self, stop: threading.Event) -> bool:
        """Block until a read may start; False if ``stop`` was set first."""
        while (pause := self.delay()) > 0:
            if stop.wait(pause):
                return False
        return not stop.is_set()

    def charge(self, rows: int) -> None:
        """Pay for ``rows`` rows just read."""
        with self._lock:
            self._refill()
            self._balance -= rows
