"""The decoder process: transactions survive the trip through the pipe unchanged, come out
once and in order whatever the reads ask for, with a resume that never runs ahead of what
was handed out, and the inner reader's error is raised after what came before it."""

from __future__ import annotations

import pickle
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.decode_process import (
    ProcessLogReader,
    decode_transactions,
    encode_transactions,
    runs_in_own_process,
)
from pipeline.events import ChangeEvent, Op, Position, TableId, WatermarkEvent
from pipeline.sources.base import Column, SchemaChange, TableSchema, Transaction

T = TableId("shop", "orders")
SCHEMA = TableSchema(T, (Column("id", "BIGINT"), Column("v", "STRING")), ("id",))


def image(n: int) -> dict[str, Any]:
    return {"id": n, "v": f"v{n}", "d": Decimal("1.25"), "ts": datetime(2024, 1, 2, tzinfo=UTC),
            "day": date(2024, 1, 3), "b": b"\x00\xff", "f": 0.1, "none": None}


def test_transactions_survive_the_pipe_unchanged() -> None:
    txs = [
        Transaction((ChangeEvent(T, Op.CREATE, (1,), Position(10, 0), None, image(1), 5),
                     ChangeEvent(T, Op.UPDATE, (1,), Position(10, 1), image(1), image(2), 5),
                     ChangeEvent(T, Op.DELETE, (2,), Position(10, 2), image(2), None, None,
                                 "w1")),
                    {"file": "mysql-bin.000001", "pos": 99}, Position(10, 0), 5, {T: SCHEMA}),
        Transaction((WatermarkEvent("low", Position(20, 0), 6),), {"pos": 120},
                    Position(20, 0), 6),
        Transaction((SchemaChange(T, "TRUNCATE t", Position(30, 0), resets_rows=True),),
                    {"pos": 130}, Position(30, 0), None),
        Transaction((), {"pos": 140}, Position(40, 0)),
    ]
    back = decode_transactions(pickle.loads(pickle.dumps(encode_transactions(txs))))
    assert back == txs
    assert [type(i) for tx in back for i in tx.items] == [type(i) for tx in txs
                                                          for i in tx.items]


class Scripted:
    """A picklable reader of scripted reads: ("txs", [numbers]), ("idle", skipped to), or an
    exception; then idles."""

    runs_in_own_process = True

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.resume: dict[str, int] = {"pos": 0}

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        if not self.script:
            time.sleep(min(max_wait_s, 0.01))
            return []
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        kind, values = step
        if kind == "idle":
            self.resume = {"pos": values}
            return []
        self.resume = {"pos": values[-1]}
        return [Transaction((), {"pos": n}, Position(n, 0)) for n in values]

    def close(self) -> None:
        pass


def script_from(sizes: list[int]) -> tuple[list[Any], list[int]]:
    """Consecutive transaction numbers in reads of ``sizes`` (0: an idle read that skipped
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


@settings(max_examples=8, deadline=None)  # a process per example
@given(sizes=st.lists(st.integers(0, 7), max_size=10),
       asks=st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_every_transaction_once_in_order(sizes: list[int], asks: list[int]) -> None:
    script, expected = script_from(sizes)
    reader = ProcessLogReader(Scripted(script), poll_s=0.01)  # type: ignore[arg-type]
    got: list[int] = []
    try:
        deadline = time.monotonic() + 30
        i = 0
        while time.monotonic() < deadline and len(got) < len(expected):
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


def test_an_inner_error_is_raised_after_what_came_before() -> None:
    reader = ProcessLogReader(
        Scripted([("txs", [1, 2]), RuntimeError("connection lost")]),  # type: ignore[arg-type]
        poll_s=0.01)
    try:
        got: list[Transaction] = []
        deadline = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="connection lost"):
            while time.monotonic() < deadline:
                got += reader.read(max_transactions=10, max_wait_s=0.1)
        assert [t.position.lsn for t in got] == [1, 2]
        with pytest.raises(RuntimeError):  # and again: the reader is broken
            reader.read(max_transactions=10, max_wait_s=0.1)
    finally:
        reader.close()


def test_only_readers_that_say_so_move() -> None:
    assert runs_in_own_process(Scripted([]))  # type: ignore[arg-type]
    assert not runs_in_own_process(object())  # type: ignore[arg-type]
