"""Running a capture's ranges a few at a time (pure logic, real threads)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.capture.parallel import run_at_once


class Tracker:
    """Counts the items under way at once and records the order they started in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started: list[int] = []

    def enter(self, item: int) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(item)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


@settings(max_examples=30, deadline=timedelta(seconds=10))
@given(durations=st.lists(st.integers(0, 4), min_size=1, max_size=8),
       workers=st.integers(1, 4))
def test_every_item_runs_once_at_most_workers_at_a_time_results_in_item_order(
    durations: list[int], workers: int
) -> None:
    tracker = Tracker()

    def work(item: int, halt: threading.Event) -> int:
        tracker.enter(item)
        time.sleep(durations[item] / 1000)
        tracker.leave()
        return item * 10

    results = run_at_once(list(range(len(durations))), work, workers=workers, stop=None,
                          ends_early=lambda _: False, poll_s=0.01)
    assert results == [i * 10 for i in range(len(durations))]
    assert sorted(tracker.started) == list(range(len(durations)))
    assert tracker.started == sorted(tracker.started)  # taken in the items' order
    assert tracker.most <= workers


def test_items_run_side_by_side() -> None:
    both = threading.Barrier(2, timeout=5)  # broken (raises) unless two items run at once

    def work(item: int, halt: threading.Event) -> int:
        both.wait()
        return item

    assert run_at_once([1, 2, 3, 4], work, workers=2, stop=None,
                       ends_early=lambda _: False) == [1, 2, 3, 4]


def test_a_result_that_ends_early_starts_no_further_item_and_those_under_way_finish() -> None:
    second_started = threading.Event()

    def work(item: int, halt: threading.Event) -> str:
        if item == 0:
            second_started.wait(5)
            return "paused"
        if item == 1:
            second_started.set()
            time.sleep(0.2)  # still under way when item 0 ends early
            return "done"
        return "done"

    results = run_at_once([0, 1, 2, 3], work, workers=2, stop=None,
                          ends_early=lambda r: r == "paused", poll_s=0.01)
    assert results == ["paused", "done"]


def test_a_failing_item_halts_the_others_and_its_error_is_raised() -> None:
    started = threading.Event()
    halted: list[bool] = []
    ran: list[int] = []

    def work(item: int, halt: threading.Event) -> int:
        ran.append(item)
        if item == 0:
            started.wait(5)
            raise RuntimeError("range 0 failed")
        started.set()
        halted.append(halt.wait(10))  # runs until halted
        return item

    began = time.monotonic()
    with pytest.raises(RuntimeError, match="range 0 failed"):
        run_at_once([0, 1, 2, 3], work, workers=2, stop=None, ends_early=lambda _: False,
                    poll_s=0.01)
    assert halted == [True]
    assert sorted(ran) == [0, 1]  # nothing started after the failure
    assert time.monotonic() - began < 5


def test_the_callers_stop_halts_the_items_under_way_and_starts_no_more() -> None:
    stop = threading.Event()
    ran: list[int] = []

    def work(item: int, halt: threading.Event) -> str:
        ran.append(item)
        if item == 1:
            stop.set()
        return "stopped" if halt.wait(10) else "done"

    results = run_at_once([0, 1, 2, 3], work, workers=2, stop=stop,
                          ends_early=lambda r: r == "stopped", poll_s=0.01)
    assert results == ["stopped", "stopped"]
    assert sorted(ran) == [0, 1]


def test_one_worker_or_one_item_runs_in_the_callers_thread_with_its_stop() -> None:
    stop = threading.Event()
    seen: list[tuple[str, bool]] = []

    def work(item: int, halt: threading.Event) -> int:
        seen.append((threading.current_thread().name, halt is stop))
        return item

    assert run_at_once([5, 6], work, workers=1, stop=stop, ends_early=lambda _: False) == [5, 6]
    assert run_at_once([7], work, workers=2, stop=stop, ends_early=lambda _: False) == [7]
    assert seen == [(threading.current_thread().name, True)] * 3


class InterruptOnPoll(threading.Event):
    """A stop whose check, in the waiting thread, is interrupted (as a signal would be)."""

    def __init__(self, waiter: threading.Thread) -> None:
        super().__init__()
        self.waiter = waiter

    def is_set(self) -> bool:
        if threading.current_thread() is self.waiter:
            raise KeyboardInterrupt
        return super().is_set()


def test_an_interrupted_caller_halts_the_items_and_waits_for_them() -> None:
    finished: list[int] = []

    def work(item: int, halt: threading.Event) -> int:
        assert halt.wait(10)
        finished.append(item)
        return item

    with pytest.raises(KeyboardInterrupt):
        run_at_once([0, 1, 2], work, workers=2, stop=InterruptOnPoll(threading.current_thread()),
                    ends_early=lambda _: False, poll_s=0.01)
    assert sorted(finished) == [0, 1]


def test_no_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        run_at_once([1], lambda item, halt: item, workers=0, stop=None,
                    ends_early=lambda _: False)
