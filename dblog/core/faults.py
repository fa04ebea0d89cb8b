"""Crash points for tests: ``DBLOG_FAULT=<point>:<n>`` kills this process with SIGKILL the
n-th time execution reaches ``<point>`` (e.g. ``tail.after_delta:3``). Inert otherwise."""

from __future__ import annotations

import os
import signal
from collections import Counter

_seen: Counter[str] = Counter()


def crash_point(point: str) -> None:
    """Die like ``kill -9`` here if the environment asks for it."""
    spec = os.environ.get("DBLOG_FAULT")
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != point:
        return
    _seen[point] += 1
    if _seen[point] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
