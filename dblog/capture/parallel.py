"""Running a capture's ranges a few at a time (``capture.parallel_ranges``).

A range spends much of its time waiting: for the tailer's first position, for each
window's high watermark and for the commit that emits its chunks. With a few ranges under
way at once, a capture of many tables (or of many Dagster partitions) overlaps those waits
where Spark has cores to spare; on two cores, where the capture is CPU-bound, it took about
the same time (docs/performance-log.md, "2026-11-29, 17:50-18:25"). One big range gains
nothing and loses nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_at_once(
    items: Sequence[T],
    work: Callable[[T, threading.Event], R],
    *,
    workers: int,
    stop: threading.Event | None,
    ends_early: Callable[[R], bool],
    name: str = "worker",
    poll_s: float = 0.2,
    interrupted_join_s: float = 60.0,
) -> list[R]:
    """``work(item, halt)`` for the items in their order, up to ``workers`` at once; the
    results of the items that ran, in the items' order.

    No further item starts once a result ``ends_early`` (the items under way go on: they
    meet the same reason themselves), once ``stop`` is set or once an item raised. ``halt``
    is set when ``stop`` is (seen within ``poll_s``) and when an item raised; every item
    under way is then awaited and the first exception raised. With one worker, or one item
    (a capture of one table), the items run in the calling thread, ``halt`` being ``stop``
    itself.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers!r}")
    if workers == 1 or len(items) <= 1:
        own = stop or threading.Event()
        results = []
        for item in items:
            result = work(item, own)
            results.append(result)
            if ends_early(result) or own.is_set():
                break
        return results

    halt = threading.Event()
    lock = threading.Lock()
    done: dict[int, R] = {}
    errors: list[BaseException] = []
    upcoming = iter(range(len(items)))
    no_more = False

    def take() -> int | None:
        with lock:
            if no_more or errors or halt.is_set():
                return None
            return next(upcoming, None)

    def worker() -> None:
        nonlocal no_more
        while (index := take()) is not None:
            try:
                result = work(items[index], halt)
            except BaseException as exc:  # raised in the caller's thread below
                with lock:
                    errors.append(exc)
                halt.set()
                return
            with lock:
                done[index] = result
                no_more = no_more or ends_early(result)

    threads = [threading.Thread(target=worker, name=f"{name}-{n}", daemon=True)
               for n in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(poll_s)
                if stop is not None and stop.is_set():
                    halt.set()
    except BaseException:
        # Interrupted while waiting (a signal, a Dagster run terminated): the items under
        # way stop as if ``stop`` were set, and get a while to do so.
        halt.set()
        for thread in threads:
            thread.join(interrupted_join_s)
        raise
    if errors:
        raise errors[0]
    return [done[index] for index in sorted(done)]
