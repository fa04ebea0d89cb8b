"""The mirror merger thread: requests made while a merge runs fold into one, a failure
reaches the tailer's thread, and ``wait`` returns only once everything asked is merged."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblog.core.events import Position, TableId
from dblog.state import PositionState
from dblog.tail.merger import BEHIND_LAG_S, MirrorMerger, behind_the_log, mirror_due

A, B, C = TableId("d", "a"), TableId("d", "b"), TableId("d", "c")


def at(batch: int) -> PositionState:
    return PositionState(Position(batch * 100), {"file": "f.000001", "pos": batch}, batch)


def test_requests_during_a_merge_fold_into_one_with_every_table() -> None:
    started, release = threading.Semaphore(0), threading.Semaphore(0)
    merges: list[tuple[int, frozenset[TableId]]] = []

    def merge(committed: PositionState, tables: frozenset[TableId]) -> None:
        merges.append((committed.batch, tables))
        started.release()
        assert release.acquire(timeout=10)

    merger = MirrorMerger(merge)
    try:
        assert merger.idle()
        merger.request(at(1), frozenset({A}))
        assert started.acquire(timeout=10)
        assert not merger.idle()  # a merge running
        merger.request(at(2), frozenset({B}))
        merger.request(at(3), frozenset({C}))
        release.release()
        assert started.acquire(timeout=10)
        assert not merger.idle()  # the folded request running
        release.release()
        merger.wait()
        assert merger.idle()
        assert merges == [(1, frozenset({A})), (3, frozenset({B, C}))]
    finally:
        release.release(2)
        merger.close()


def test_a_failed_merge_is_raised_in_the_caller() -> None:
    def merge(committed: PositionState, tables: frozenset[TableId]) -> None:
        raise RuntimeError(f"lost the lock at batch {committed.batch}")

    merger = MirrorMerger(merge)
    try:
        merger.request(at(4), frozenset({A}))
        with pytest.raises(RuntimeError, match="batch 4"):
            merger.wait()
        with pytest.raises(RuntimeError, match="batch 4"):
            merger.check()
        with pytest.raises(RuntimeError, match="batch 4"):
            merger.request(at(5), frozenset({A}))
    finally:
        merger.close()


def test_close_drops_requests_not_started() -> None:
    merges: list[int] = []
    gate = threading.Event()

    def merge(committed: PositionState, tables: frozenset[TableId]) -> None:
        gate.wait(10)
        merges.append(committed.batch)

    merger = MirrorMerger(merge)
    merger.request(at(1), frozenset({A}))
    merger.request(at(2), frozenset({A}))
    gate.set()
    merger.close()
    assert merges in ([1], [2], [])  # the running one finishes; the queued one is dropped
    assert not merger._thread.is_alive()


# ---- when the mirror merges -----------------------------------------------------------

def due(for_s: float | None, events: int = 10, *, backlogged: bool = False,
        capturing: bool = False, every_s: float = 10.0, every_s_behind: float = 60.0,
        every_s_capturing: float = 60.0, max_events: int = 500) -> bool:
    return mirror_due(unmerged_for_s=for_s, unmerged_events=events, backlogged=backlogged,
                      capturing=capturing, every_s=every_s, every_s_behind=every_s_behind,
                      every_s_capturing=every_s_capturing, max_events=max_events)


def test_a_tailer_that_keeps_up_merges_every_mirror_every_s() -> None:
    assert not due(None)
    assert not due(9.9)
    assert due(10.0)


def test_a_tailer_behind_the_log_merges_less_often_but_by_size_as_ever() -> None:
    assert not due(10.0, backlogged=True)
    assert not due(59.9, backlogged=True)
    assert due(60.0, backlogged=True)
    assert due(1.0, 500, backlogged=True)
    assert due(0.0, 500)


def test_while_a_chunk_window_is_open_the_mirror_merges_less_often_but_by_size_as_ever(
) -> None:
    assert not due(10.0, capturing=True)
    assert not due(29.9, capturing=True, every_s_capturing=30.0)
    assert due(30.0, capturing=True, every_s_capturing=30.0)
    assert due(1.0, 500, capturing=True)
    assert not due(60.0, backlogged=True, capturing=True, every_s_capturing=120.0)
    assert due(120.0, backlogged=True, capturing=True, every_s_capturing=120.0)
    assert not due(100.0, backlogged=True, capturing=True, every_s_behind=120.0,
                   every_s_capturing=30.0)


def test_the_longer_period_applies_and_zero_turns_a_deferral_off() -> None:
    assert not due(100.0, backlogged=True, every_s=120.0)
    assert due(120.0, backlogged=True, every_s=120.0)
    assert due(0.0, backlogged=True, every_s=0.0, every_s_behind=0.0)
    assert due(0.0, capturing=True, every_s=0.0, every_s_capturing=0.0)
    assert due(10.0, capturing=True, every_s_capturing=0.0)
    assert due(0.0, every_s=0.0)


@given(for_s=st.one_of(st.none(), st.floats(0, 1e4)), events=st.integers(0, 10_000),
       backlogged=st.booleans(), capturing=st.booleans(),
       every_s=st.floats(0, 1e3), every_s_behind=st.floats(0, 1e3),
       every_s_capturing=st.floats(0, 1e3), max_events=st.integers(1, 10_000))
def test_a_deferral_only_ever_delays_a_merge_and_never_past_its_size_bound(
        for_s: float | None, events: int, backlogged: bool, capturing: bool, every_s: float,
        every_s_behind: float, every_s_capturing: float, max_events: int) -> None:
    periods = {"every_s": every_s, "every_s_behind": every_s_behind,
               "every_s_capturing": every_s_capturing, "max_events": max_events}
    deferred = due(for_s, events, backlogged=backlogged, capturing=capturing, **periods)
    keeping_up = due(for_s, events, **periods)
    assert keeping_up or not deferred
    if for_s is not None and (events >= max_events
                              or for_s >= max(every_s, every_s_behind, every_s_capturing)):
        assert deferred
    if for_s is None:
        assert not keeping_up and not deferred


def test_a_tailer_is_behind_once_its_last_transaction_is_older_than_the_lag_bound() -> None:
    now = 1_800_000_000.0
    assert not behind_the_log(None, now)
    assert not behind_the_log(int(now * 1000), now)
    assert not behind_the_log(int((now - BEHIND_LAG_S) * 1000), now)
    assert behind_the_log(int((now - BEHIND_LAG_S - 0.5) * 1000), now)
    assert not behind_the_log(int((now + 30) * 1000), now)  # a source clock ahead
