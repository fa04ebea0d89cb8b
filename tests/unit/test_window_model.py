"""Property test: WindowProcessor + materialize against a reference table model.

Hypothesis generates a script over two tables with small integer keys: writes
(insert / update / delete, so delete-then-reinsert of a key happens), chunk
captures (LW, chunk SELECT of the true table state in a random key range with
a LIMIT at some point between LW and HW, HW) interleaved arbitrarily, tailer
restarts (the new processor never saw earlier LWs) and cancellations
(``discard``). Initial table contents are never in the log, so they reach the
output only through chunks. A model tailer feeds the log to the processor,
registering windows lazily on ``UnknownWatermark`` as the real tailer does.

Checked:
(a) replaying the output (READ/CREATE/UPDATE upsert, DELETE removes) from an
    empty state gives the true final state restricted to the covered keys:
    keys written in the log or present in the chunk of an emitted capture;
(b) output positions strictly increase (so per key they never go backwards),
    and the log's change events pass through unchanged and in order;
(c) each emitted capture emits exactly its chunk rows whose keys did not change
    between its LW and HW -- so every unchanged row appears exactly once -- and
    each capture is emitted / aborted / silent exactly when expected.

Mutation check (done by hand when this test was written): making
``WindowProcessor.process`` not record seen keys fails (a) and (c); emitting
at the LW position instead of the HW fails (b); recording keys in windows of
other tables fails (a); not aborting on HW-without-LW (emitting with no
dropped keys) fails the status check and, with that check removed, (a).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.core.events import ChangeEvent, Key, Op, Position, Row, TableId, WatermarkEvent, Window
from dblog.core.window import (
    ChunkEmission,
    Output,
    UnknownWatermark,
    WindowAborted,
    WindowProcessor,
    materialize,
)

TABLES = [TableId("db", "a"), TableId("db", "b")]
KEY_SPACE = range(6)


# Tailer-side control markers interleaved with the log in the model stream.
@dataclass(frozen=True)
class Announce:
    """The capture wrote ``window`` to the registry (before its LW)."""

    window: Window


@dataclass(frozen=True)
class Register:
    """The tailer registered ``window`` eagerly."""

    window: Window


@dataclass(frozen=True)
class Discard:
    window_id: str


@dataclass(frozen=True)
class Restart:
    pass


Item = ChangeEvent | WatermarkEvent | Announce | Register | Discard | Restart


@dataclass
class Capture:
    window: Window
    lo: int | None
    hi: int | None
    limit: int
    lw_index: int
    chunk: list[tuple[Key, Row]] | None = None
    hw_index: int | None = None
    discard_index: int | None = None
    emitted: list[ChangeEvent] = field(default_factory=list)


@dataclass
class Scenario:
    stream: list[Item]
    captures: list[Capture]
    final: dict[tuple[TableId, Key], Row]


def build(initial: list[dict[int, int]], script: list[tuple[Any, ...]]) -> Scenario:
    state: dict[TableId, dict[Key, Row]] = {
        t: {(k,): {"id": k, "v": f"init{v}"} for k, v in init.items()}
        for t, init in zip(TABLES, initial, strict=True)
    }
    stream: list[Item] = []
    captures: list[Capture] = []
    lsn = 0

    def pos() -> Position:
        nonlocal lsn
        lsn += 10
        return Position(lsn)

    def select(c: Capture) -> None:
        rows = sorted(state[c.window.table].items())
        c.chunk = [
            (k, r)
            for k, r in rows
            if (c.lo is None or k[0] > c.lo) and (c.hi is None or k[0] <= c.hi)
        ][: c.limit]

    def close(c: Capture) -> None:
        if c.chunk is None:
            select(c)
        c.hw_index = len(stream)
        stream.append(WatermarkEvent(c.window.high, pos()))

    for n, op in enumerate(script):
        kind = op[0]
        if kind == "write":
            _, ti, k, delete = op
            t, key = TABLES[ti], (k,)
            cur = state[t].get(key)
            new = {"id": k, "v": f"w{n}"}
            if cur is None:
                stream.append(ChangeEvent(t, Op.CREATE, key, pos(), after=new))
                state[t][key] = new
            elif delete:
                stream.append(ChangeEvent(t, Op.DELETE, key, pos(), before=cur))
                del state[t][key]
            else:
                stream.append(ChangeEvent(t, Op.UPDATE, key, pos(), before=cur, after=new))
                state[t][key] = new
        elif kind == "open":
            _, ti, lo, hi, limit, eager = op
            if lo is not None and hi is not None and lo >= hi:
                lo, hi = (hi, lo) if lo > hi else (lo, None)
            w = Window(f"w{n}", TABLES[ti], f"lo{n}", f"hi{n}")
            stream.append(Announce(w))
            if eager:
                stream.append(Register(w))
            captures.append(Capture(w, lo, hi, limit, lw_index=len(stream)))
            stream.append(WatermarkEvent(w.low, pos()))
        elif kind == "select":
            pending = [c for c in captures if c.chunk is None and c.hw_index is None]
            if pending:
                select(pending[op[1] % len(pending)])
        elif kind == "close":
            running = [c for c in captures if c.hw_index is None]
            if running:
                close(running[op[1] % len(running)])
        elif kind == "discard":
            live = [c for c in captures if c.discard_index is None]
            if live:
                c = live[op[1] % len(live)]
                c.discard_index = len(stream)
                stream.append(Discard(c.window.window_id))
        else:
            assert kind == "restart"
            stream.append(Restart())
    for c in captures:
        if c.hw_index is None:
            close(c)
    final = {(t, k): r for t in TABLES for k, r in state[t].items()}
    return Scenario(stream, captures, final)


def tail(stream: list[Item]) -> list[Output]:
    """A model log tailer: window registry, lazy refresh, restarts."""
    proc = WindowProcessor()
    registry: dict[str, Window] = {}
    outputs: list[Output] = []
    for item in stream:
        if isinstance(item, Announce):
            registry[item.window.window_id] = item.window
        elif isinstance(item, Register):
            if item.window.window_id in registry:
                proc.register(item.window)
        elif isinstance(item, Discard):
            registry.pop(item.window_id, None)
            proc.discard(item.window_id)
        elif isinstance(item, Restart):
            proc = WindowProcessor()
            for w in registry.values():
                proc.register(w)
        else:
            out = proc.process(item)
            if out and isinstance(out[0], UnknownWatermark):
                assert isinstance(item, WatermarkEvent) and out == [UnknownWatermark(item)]
                for w in registry.values():
                    proc.register(w)
                out = proc.process(item)
                if out and isinstance(out[0], UnknownWatermark):
                    out = []  # stale watermark of a finished or cancelled capture: skip
            for o in out:
                if isinstance(o, ChunkEmission | WindowAborted):
                    del registry[o.window.window_id]  # the capture finishes / retries
            outputs.extend(out)
        assert len(proc.active_windows) <= len(proc.open_windows) <= len(registry)
    return outputs


def expected_status(c: Capture, stream: list[Item]) -> str:
    assert c.hw_index is not None
    if c.discard_index is not None and c.discard_index < c.hw_index:
        return "silent"
    restarted = any(isinstance(stream[i], Restart) for i in range(c.lw_index + 1, c.hw_index))
    return "aborted" if restarted else "emitted"


indices = st.integers(0, 30)
writes = st.tuples(st.just("write"), st.integers(0, 1), st.sampled_from(KEY_SPACE), st.booleans())
opens = st.tuples(
    st.just("open"),
    st.integers(0, 1),
    st.none() | st.none() | st.integers(-1, 6),
    st.none() | st.none() | st.integers(-1, 6),
    st.integers(1, 7),
    st.booleans(),
)
ops = st.one_of(
    writes,
    writes,
    writes,
    opens,
    opens,
    st.tuples(st.just("select"), indices),
    st.tuples(st.just("close"), indices),
    writes,
    st.tuples(st.just("discard"), indices) | st.tuples(st.just("restart")),
)
initial_table = st.dictionaries(st.sampled_from(KEY_SPACE), st.integers(0, 9), min_size=2)


@settings(max_examples=400, deadline=timedelta(seconds=10))
@given(st.lists(initial_table, min_size=2, max_size=2), st.lists(ops, min_size=10, max_size=60))
def test_window_processor_matches_model(
    initial: list[dict[int, int]], script: list[tuple[Any, ...]]
) -> None:
    sc = build(initial, script)
    outputs = tail(sc.stream)
    by_id = {c.window.window_id: c for c in sc.captures}

    events: list[ChangeEvent] = []
    status = {c.window.window_id: "silent" for c in sc.captures}
    for o in outputs:
        if isinstance(o, ChangeEvent):
            events.append(o)
        elif isinstance(o, ChunkEmission):
            c = by_id[o.window.window_id]
            assert c.chunk is not None and status[c.window.window_id] == "silent"
            status[c.window.window_id] = "emitted"
            c.emitted = materialize(o, c.chunk)
            events.extend(c.emitted)
        else:
            assert isinstance(o, WindowAborted), o
            assert status[o.window.window_id] == "silent"
            status[o.window.window_id] = "aborted"
    assert status == {c.window.window_id: expected_status(c, sc.stream) for c in sc.captures}

    # (b) log events pass through in order; positions strictly increase
    log = [e for e in sc.stream if isinstance(e, ChangeEvent)]
    assert [e for e in events if e.op is not Op.READ] == log
    positions = [e.position for e in events]
    assert all(a < b for a, b in zip(positions, positions[1:], strict=False))

    # (a) replay from empty == true final state on covered keys
    replay: dict[tuple[TableId, Key], Row] = {}
    for e in events:
        if e.op is Op.DELETE:
            replay.pop((e.table, e.key), None)
        else:
            assert e.after is not None
            replay[(e.table, e.key)] = e.after
    covered = {(e.table, e.key) for e in log}
    for c in sc.captures:
        if status[c.window.window_id] == "emitted":
            assert c.chunk is not None
            covered |= {(c.window.table, k) for k, _ in c.chunk}
    assert replay == {tk: r for tk, r in sc.final.items() if tk in covered}

    # (c) an emitted capture = its chunk minus keys changed between LW and HW
    for c in sc.captures:
        if status[c.window.window_id] != "emitted":
            continue
        assert c.chunk is not None and c.hw_index is not None
        changed = {
            e.key
            for e in sc.stream[c.lw_index : c.hw_index]
            if isinstance(e, ChangeEvent) and e.table == c.window.table
        }
        unchanged = [(k, r) for k, r in c.chunk if k not in changed]
        emitted = [(e.key, e.after) for e in c.emitted]
        assert Counter(k for k, _ in emitted) == Counter(k for k, _ in unchanged)
        assert emitted == unchanged
        assert all(e.window_id == c.window.window_id for e in c.emitted)
