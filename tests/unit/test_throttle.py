"""The capture read-rate limit's token bucket (pure logic, a fake clock)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblog.capture.throttle import RowRate


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_read_may_start_at_once_and_the_next_waits_for_its_rows() -> None:
    clock = FakeClock()
    rate = RowRate(1000, clock=clock)
    assert rate.delay() == 0
    rate.charge(3000)  # one second's credit, then two in debt
    assert rate.delay() == pytest.approx(2.0)
    clock.now += 1.5
    assert rate.delay() == pytest.approx(0.5)
    clock.now += 0.5 + 1e-6
    assert rate.delay() == 0


def test_idle_time_buys_at_most_one_seconds_rows() -> None:
    clock = FakeClock()
    rate = RowRate(500, clock=clock)
    clock.now += 3600
    rate.charge(1000)
    assert rate.delay() == pytest.approx(1.0)


def test_chunks_ask_for_the_rows_of_their_target_time() -> None:
    assert RowRate(2500.7).chunk_rows(1) == 2500
    assert RowRate(1000).chunk_rows(15) == 15_000
    assert RowRate(0.5).chunk_rows(1) == 1


def test_a_stop_ends_the_wait() -> None:
    rate = RowRate(1)
    rate.charge(3600)
    stop = threading.Event()
    stop.set()
    assert rate.wait(stop) is False


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_rate_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        RowRate(bad)


@given(rows_per_s=st.floats(1, 1e6), chunk_seconds=st.floats(0.1, 30),
       reads=st.lists(st.tuples(st.floats(0, 10), st.floats(0, 1)), min_size=1, max_size=60))
def test_rows_read_never_run_ahead_of_the_rate(
        rows_per_s: float, chunk_seconds: float, reads: list[tuple[float, float]]) -> None:
    """Readers that wait as told, read chunks of at most ``chunk_rows`` and pause as they
    like: at every read's start, the rows read so far are at most ``rate * (t + 1)`` plus
    one chunk, ``t`` the seconds since the start."""
    clock = FakeClock()
    start = clock.now
    rate = RowRate(rows_per_s, clock=clock)
    read = 0
    for pause, share in reads:
        clock.now += pause
        clock.now += rate.delay()
        assert rate.delay() == 0
        chunk = rate.chunk_rows(chunk_seconds)
        assert read <= rows_per_s * (clock.now - start + 1) + chunk + 1e-6
        rows = int(chunk * share)
        rate.charge(rows)
        read += rows
