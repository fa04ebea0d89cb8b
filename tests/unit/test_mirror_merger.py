"""The mirror merger thread: requests made while a merge runs fold into one, a failure
reaches the tailer's thread, and ``wait`` returns only once everything asked is merged."""

from __future__ import annotations

import threading

import pytest

from pipeline.events import Position, TableId
from pipeline.mirror import MirrorMerger
from pipeline.state import PositionState

A, B, C = TableId("d", "a"), TableId("d", "b"), TableId("d", "c")


def at(batch: int) -> PositionState:
    return PositionState(Position(batch * 100), {"file": "f.000001", "pos": batch}, batch)


def test_requests_during_a_merge_fold_into_one_with_every_table() -> None:
    started, release = threading.Event(), threading.Event()
    merges: list[tuple[int, frozenset[TableId]]] = []

    def merge(committed: PositionState, tables: frozenset[TableId]) -> None:
        merges.append((committed.batch, tables))
        started.set()
        release.wait(10)

    merger = MirrorMerger(merge)
    try:
        merger.request(at(1), frozenset({A}))
        assert started.wait(10)
        merger.request(at(2), frozenset({B}))
        merger.request(at(3), frozenset({C}))
        release.set()
        merger.wait()
        assert merges == [(1, frozenset({A})), (3, frozenset({B, C}))]
    finally:
        release.set()
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
