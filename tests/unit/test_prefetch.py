"""The prefetching reader hands out exactly the inner reader's transactions, in order, with
a resume position that never runs ahead of what was handed out (except past skipped log)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.core.events import Position
from dblog.sources.base import Transaction
from dblog.tail.prefetch import PrefetchingReader


def tx(n: int) -> Transaction:
    return Transaction(items=(), resume={"pos": n}, position=Position(n, 0))


class ScriptedReader:
    """Returns scripted reads: a list of transaction numbers, [] for an idle poll (the
    reader skipped up to ``skip`` meanwhile), or an exception. Then idles forever."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.resume: dict[str, int] = {"pos": 0}
        self.closed = False
        self.lock = threading.Lock()

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        with self.lock:
            step = self.script.pop(0) if self.script else None
        if step is None:
            time.sleep(min(max_wait_s, 0.01))
            return []
        if isinstance(step, BaseException):
            raise step
        kind, values = step
        if kind == "idle":
            self.resume = {"pos": values}
            return []
        out = [tx(n) for n in values]
        self.resume = {"pos": values[-1]}
        return out

    def close(self) -> None:
        self.closed = True


def script_from(sizes: list[int]) -> tuple[list[Any], list[int]]:
    """Consecutive transaction numbers in reads of ``sizes`` (0 = an idle poll that skipped
    one untracked transaction)."""
    script: list[Any] = []
    numbers: list[int] = []
    n = 0
    for size in sizes:
        if size == 0:
            n += 1
            script.append(("idle", n))
            continue
        values = list(range(n + 1, n + size + 1))
        n += size
        numbers += values
        script.append(("txs", values))
    return script, numbers


@settings(max_examples=60, deadline=timedelta(seconds=10))
@given(sizes=st.lists(st.integers(0, 7), max_size=12),
       asks=st.lists(st.integers(1, 5), min_size=1, max_size=6),
       max_ahead=st.integers(1, 10))
def test_every_transaction_once_in_order(sizes: list[int], asks: list[int],
                                         max_ahead: int) -> None:
    script, expected = script_from(sizes)
    inner = ScriptedReader(script)
    reader = PrefetchingReader(inner, max_ahead=max_ahead, read_transactions=3, poll_s=0.01)
    got: list[int] = []
    try:
        deadline = time.monotonic() + 20
        i = 0
        while time.monotonic() < deadline and (len(got) < len(expected) or inner.script):
            ask = asks[i % len(asks)]
            i += 1
            txs = reader.read(max_transactions=ask, max_wait_s=0.05)
            assert len(txs) <= ask
            got += [t.position.lsn for t in txs]
            resume = reader.resume
            if txs:
                assert resume is not None
                # never behind what was handed out; ahead only by skipped (idle) log
                assert resume["pos"] >= got[-1]
                later = [n for n in expected if n > got[-1]]
                assert not later or resume["pos"] < later[0]
    finally:
        reader.close()
    assert got == expected
    assert inner.closed


def test_an_inner_error_is_raised_after_what_came_before() -> None:
    inner = ScriptedReader([("txs", [1, 2]), RuntimeError("connection lost")])
    reader = PrefetchingReader(inner, read_transactions=10, poll_s=0.01)
    try:
        got: list[Transaction] = []
        deadline = time.monotonic() + 5
        with pytest.raises(RuntimeError, match="connection lost"):
            while time.monotonic() < deadline:
                got += reader.read(max_transactions=10, max_wait_s=0.1)
        assert [t.position.lsn for t in got] == [1, 2]
        with pytest.raises(RuntimeError):  # and again: the reader is broken
            reader.read(max_transactions=10, max_wait_s=0.1)
    finally:
        reader.close()


def test_reading_ahead_stops_at_max_ahead() -> None:
    inner = ScriptedReader([("txs", [n]) for n in range(1, 101)])
    reader = PrefetchingReader(inner, max_ahead=5, read_transactions=1, poll_s=0.01)
    try:
        time.sleep(0.3)
        assert len(inner.script) >= 100 - 6, "read far past max_ahead"
        assert [t.position.lsn for t in reader.read(max_transactions=3, max_wait_s=1)] == [1, 2, 3]
    finally:
        reader.close()


def test_a_full_read_means_the_reader_is_behind_until_a_read_comes_back_short() -> None:
    release = threading.Event()

    class Gated(ScriptedReader):
        def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
            if not self.script or self.script[0] == ("txs", [4]):
                release.wait(5)
            return super().read(max_transactions=max_transactions, max_wait_s=max_wait_s)

    inner = Gated([("txs", [1, 2, 3]), ("txs", [4])])
    reader = PrefetchingReader(inner, read_transactions=3, poll_s=0.01)  # type: ignore[arg-type]
    try:
        assert [t.position.lsn for t in reader.read(max_transactions=10, max_wait_s=1)] == [
            1, 2, 3]
        assert reader.behind  # its read came back full: more of the log is waiting
        release.set()
        assert [t.position.lsn for t in reader.read(max_transactions=10, max_wait_s=1)] == [4]
        assert not reader.behind  # a short read: it follows the head
    finally:
        reader.close()


def test_a_read_returns_after_max_wait_while_the_inner_read_goes_on() -> None:
    """A caller that has something else to look at (a tailer whose batch waits for pinned
    chunks' files) is not held for the inner reader's whole read; what that read brings
    comes with a later call, and an idle inner read is told apart from a wait cut short."""
    release = threading.Event()

    class Slow(ScriptedReader):
        def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
            if self.script and self.script[0] == ("txs", [2]):
                release.wait(10)
            return super().read(max_transactions=max_transactions, max_wait_s=max_wait_s)

    inner = Slow([("txs", [1]), ("txs", [2]), ("idle", 3)])
    reader = PrefetchingReader(inner, read_transactions=3, poll_s=0.01)  # type: ignore[arg-type]
    try:
        assert [t.position.lsn for t in reader.read(max_transactions=10, max_wait_s=5)] == [1]
        began = time.monotonic()
        assert reader.read(max_transactions=10, max_wait_s=0.05) == []
        assert time.monotonic() - began < 2.0, "held for the inner reader's whole read"
        assert reader.timed_out
        assert reader.resume == {"pos": 1}  # nothing handed out: still after 1
        release.set()
        assert [t.position.lsn for t in reader.read(max_transactions=10, max_wait_s=5)] == [2]
        assert not reader.timed_out
        assert reader.read(max_transactions=10, max_wait_s=5) == []  # the idle inner read
        assert not reader.timed_out
        assert reader.resume == {"pos": 3}  # past what the idle read skipped
    finally:
        release.set()
        reader.close()
