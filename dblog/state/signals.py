"""Change signals: ZooKeeper watches that wake a waiter instead of polling."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ChangeSignal:
    """Set by ZooKeeper watches when a watched znode is created, changed or deleted
    (:meth:`StateStore.watch`), so that a waiter reads again when something changed instead
    of polling. A watch fires once: arm it again before each read that may wait."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def notify(self, _event: object = None) -> None:
        """The watch callback (kazoo calls it with the ``WatchedEvent``)."""
        self._event.set()

    def take(self) -> bool:
        """Whether it fired since the last ``take``; clears it."""
        fired = self._event.is_set()
        self._event.clear()
        return fired

    def wait(self, timeout: float) -> bool:
        """Wait until it fires or ``timeout`` seconds passed; whether it fired."""
        return self._event.wait(timeout)


class Lookout:
    """When to read a few znodes again while waiting for them to change: when their watches
    fired, or ``every`` seconds (a watch lost with an expired session; deadlines), instead
    of at every poll. ``arm`` sets the watches (:meth:`StateStore.watch`), each time before
    the read it allows."""

    def __init__(self, arm: Callable[[ChangeSignal], None], every: float = 1.0) -> None:
        self.signal = ChangeSignal()
        self._arm = arm
        self._every = every
        self._looked: float | None = None

    def due(self) -> bool:
        """Whether to read now (the watches are armed again when it is)."""
        now = time.monotonic()
        if (self._looked is not None and not self.signal.take()
                and now - self._looked < self._every):
            return False
        self._looked = now
        self._arm(self.signal)
        return True

    def again(self) -> None:
        """Make the next :meth:`due` true (the waiter changed something itself)."""
        self._looked = None

    def wait(self, timeout: float) -> None:
        """Wait until a watch fires or ``timeout`` seconds passed."""
        self.signal.wait(timeout)
