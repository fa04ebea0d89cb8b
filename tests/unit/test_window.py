"""Unit tests for the watermark window processor (dblog.core.window)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from dblog.core.events import ChangeEvent, Key, Op, Position, Row, TableId, WatermarkEvent, Window
from dblog.core.window import (
    HW_WITHOUT_LW,
    ChunkEmission,
    Output,
    UnknownWatermark,
    WindowAborted,
    WindowProcessor,
    materialize,
)

T = TableId("db", "t")
OTHER = TableId("db", "other")


def row(k: int, v: str = "chunk") -> Row:
    return {"id": k, "v": v}


def upd(k: int, lsn: int, table: TableId = T) -> ChangeEvent:
    return ChangeEvent(table, Op.UPDATE, (k,), Position(lsn), before=row(k), after=row(k, "log"))


def ins(k: int, lsn: int, table: TableId = T) -> ChangeEvent:
    return ChangeEvent(table, Op.CREATE, (k,), Position(lsn), after=row(k, "log"))


def dele(k: int, lsn: int, table: TableId = T) -> ChangeEvent:
    return ChangeEvent(table, Op.DELETE, (k,), Position(lsn), before=row(k))


def wm(value: str, lsn: int) -> WatermarkEvent:
    return WatermarkEvent(value, Position(lsn), commit_ts_ms=lsn * 1000)


def win(n: int, table: TableId = T) -> Window:
    return Window(f"w{n}", table, f"lo{n}", f"hi{n}")


def run(p: WindowProcessor, events: Iterable[ChangeEvent | WatermarkEvent]) -> list[Output]:
    out: list[Output] = []
    for e in events:
        out.extend(p.process(e))
    return out


def windows(p: WindowProcessor) -> tuple[tuple[Window, ...], tuple[Window, ...]]:
    """(open, active) windows; a function so mypy does not narrow the properties."""
    return p.open_windows, p.active_windows


def chunk(*keys: int) -> list[tuple[Key, Row]]:
    return [((k,), row(k)) for k in keys]


def test_paper_example_k1_to_k6() -> None:
    """DBLog paper figure: k1 and k3 change in the window, k6 is deleted."""
    p = WindowProcessor()
    w = win(1)
    p.register(w)
    log = [upd(1, 20), upd(3, 30), dele(6, 40)]
    out = run(p, [upd(2, 5), wm("lo1", 10), *log, wm("hi1", 50), upd(4, 60)])
    assert out[0] == upd(2, 5)
    assert out[1:4] == log
    emission = out[4]
    assert emission == ChunkEmission(w, Position(50), frozenset({(1,), (3,), (6,)}), 50_000)
    assert out[5] == upd(4, 60)
    # the chunk may hold pre- or post-change images; k6 may or may not be in it
    reads = materialize(emission, chunk(6, 5, 4, 3, 2, 1))  # selected order is irrelevant
    # numbered in key order over every selected row: dropped k1, k3, k6 leave 1, 3, 6 unused
    assert [(e.key, e.position) for e in reads] == [
        ((2,), Position(50, 2)),
        ((4,), Position(50, 4)),
        ((5,), Position(50, 5)),
    ]
    assert all(e.op is Op.READ and e.window_id == "w1" and e.table == T for e in reads)
    assert all(e.commit_ts_ms == 50_000 and e.after == row(e.key[0]) for e in reads)
    assert windows(p) == ((), ())


def test_changes_before_low_and_after_high_are_not_dropped() -> None:
    p = WindowProcessor()
    p.register(win(1))
    out = run(p, [upd(1, 5), wm("lo1", 10), wm("hi1", 20), upd(2, 30)])
    assert isinstance(out[1], ChunkEmission)
    assert out[1].dropped_keys == frozenset()


def test_other_tables_pass_through_and_are_not_recorded() -> None:
    p = WindowProcessor()
    p.register(win(1))
    events: list[ChangeEvent | WatermarkEvent] = [
        wm("lo1", 10),
        upd(1, 11, OTHER),
        ins(9, 12, OTHER),
        upd(2, 13),
        wm("hi1", 20),
    ]
    out = run(p, events)
    assert out[:3] == [upd(1, 11, OTHER), ins(9, 12, OTHER), upd(2, 13)]
    assert isinstance(out[3], ChunkEmission)
    assert out[3].dropped_keys == {(2,)}


def test_overlapping_windows_same_and_other_table() -> None:
    p = WindowProcessor()
    w1, w2, w3 = win(1), win(2), win(3, OTHER)
    for w in (w1, w2, w3):
        p.register(w)
    out = run(
        p,
        [
            wm("lo1", 10),
            upd(1, 11),
            wm("lo2", 12),
            wm("lo3", 13),
            upd(2, 14),
            upd(2, 15, OTHER),
            wm("hi1", 16),
            upd(3, 17),
            upd(4, 18, OTHER),
            wm("hi3", 19),
            wm("hi2", 20),
        ],
    )
    emissions = {o.window.window_id: o for o in out if isinstance(o, ChunkEmission)}
    assert emissions["w1"].dropped_keys == {(1,), (2,)}
    assert emissions["w2"].dropped_keys == {(2,), (3,)}
    assert emissions["w3"].dropped_keys == {(2,), (4,)}
    assert [o.window.window_id for o in out if isinstance(o, ChunkEmission)] == ["w1", "w3", "w2"]
    assert [e.position.lsn for e in out if isinstance(e, ChangeEvent)] == [11, 14, 15, 17, 18]


def test_windows_are_independent_after_close() -> None:
    p = WindowProcessor()
    p.register(win(1))
    run(p, [wm("lo1", 1), upd(1, 2), wm("hi1", 3)])
    p.register(win(2))
    out = run(p, [wm("lo2", 4), upd(2, 5), wm("hi2", 6)])
    assert isinstance(out[1], ChunkEmission)
    assert out[1].dropped_keys == {(2,)}


def test_high_without_low_aborts() -> None:
    """E.g. the tailer restarted between LW and HW: the new processor never saw LW."""
    p = WindowProcessor()
    p.register(win(1))
    out = run(p, [upd(1, 2), wm("hi1", 3)])
    assert out == [upd(1, 2), WindowAborted(win(1), HW_WITHOUT_LW)]
    assert p.open_windows == ()
    # its low watermark arriving afterwards is simply unknown
    assert p.process(wm("lo1", 4)) == [UnknownWatermark(wm("lo1", 4))]


def test_unknown_watermark_changes_nothing_and_can_be_retried() -> None:
    p = WindowProcessor()
    lw = wm("lo1", 10)
    assert not p.is_known("lo1")
    assert p.process(lw) == [UnknownWatermark(lw)]
    assert windows(p) == ((), ())
    p.register(win(1))  # tailer refreshed its registry
    assert p.is_known("lo1") and p.is_known("hi1")
    assert p.process(lw) == []
    assert p.active_windows == (win(1),)
    out = run(p, [upd(1, 11), wm("hi1", 12)])
    assert isinstance(out[1], ChunkEmission) and out[1].dropped_keys == {(1,)}
    assert not p.is_known("hi1")


def test_discard_active_and_pending_windows() -> None:
    p = WindowProcessor()
    p.register(win(1))
    p.register(win(2))
    run(p, [wm("lo1", 1), upd(1, 2)])
    assert windows(p) == ((win(1), win(2)), (win(1),))
    assert p.discard("w1") == win(1)
    assert p.discard("w2") == win(2)
    assert p.discard("w1") is None
    assert windows(p) == ((), ())
    assert p.process(wm("hi1", 3)) == [UnknownWatermark(wm("hi1", 3))]
    assert p.process(upd(1, 4)) == [upd(1, 4)]


def test_register_is_idempotent_but_rejects_clashes() -> None:
    p = WindowProcessor()
    p.register(win(1))
    p.register(win(1))
    assert p.open_windows == (win(1),)
    with pytest.raises(ValueError):
        p.register(Window("w1", T, "lo1", "other"))
    with pytest.raises(ValueError):
        p.register(Window("w9", T, "x", "hi1"))
    assert p.open_windows == (win(1),)


def test_repeated_low_watermark_keeps_seen_keys() -> None:
    p = WindowProcessor()
    p.register(win(1))
    out = run(p, [wm("lo1", 1), upd(1, 2), wm("lo1", 3), wm("hi1", 4)])
    assert isinstance(out[1], ChunkEmission) and out[1].dropped_keys == {(1,)}


def test_materialize_composite_keys_with_none_and_duplicates() -> None:
    w = Window("w", T, "l", "h")
    e = ChunkEmission(w, Position(7, 3), frozenset({(1, "b")}))
    rows: list[tuple[Key, Row]] = [
        ((2, "a"), {"v": 1}),
        ((1, "b"), {"v": 2}),
        ((1, None), {"v": 3}),
        ((1, "a"), {"v": 4}),
    ]
    out = materialize(e, rows)
    # (1, "b") is dropped and keeps its number, 6
    assert [(x.key, x.position.seq) for x in out] == [((1, None), 4), ((1, "a"), 5), ((2, "a"), 7)]
    assert materialize(e, []) == []
    with pytest.raises(ValueError):
        materialize(e, [((1, "b"), {}), ((1, "b"), {})])


def test_touched_keys_are_dropped_by_the_active_windows_of_their_table_only() -> None:
    """Rows changed without row events (a partial row image) count as changed in every
    window that is active on their table, and in no other."""
    p = WindowProcessor()
    p.register(win(1))
    p.register(win(2, OTHER))
    p.register(win(3))
    run(p, [wm("lo1", 1), wm("lo2", 2)])
    p.touch(T, [(7,), (8,)])  # window 3 is registered, not active: it sees nothing
    p.touch(OTHER, [(9,)])
    out = run(p, [wm("lo3", 3), wm("hi1", 4), wm("hi2", 5), wm("hi3", 6)])
    emitted = {e.window.window_id: e.dropped_keys for e in out if isinstance(e, ChunkEmission)}
    assert emitted == {"w1": {(7,), (8,)}, "w2": {(9,)}, "w3": frozenset()}
