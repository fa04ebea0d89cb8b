"""Property test of the batch-cutting rule: crash anywhere, the replayed batch is exactly the
written one, and every tracked transaction lands in exactly one committed batch, in order."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.core.batching import BatchCutter, Cut, Due, ReplayMismatch
from dblog.core.events import Position


@dataclass(frozen=True)
class Tx:
    """A committed transaction: where the log stands after it and how many tracked events it
    has (0: untracked table, DDL, rollback or rotation; the reader skips it silently)."""

    ident: int
    resume: Position
    events: int


def native(p: Position) -> dict[str, int]:
    return {"lsn": p.lsn}


@dataclass
class Reader:
    """A log reader over the transactions available so far (like MySqlLogReader)."""

    log: list[Tx]
    available: int
    at: Position
    rng: random.Random
    cursor: int = 0

    def __post_init__(self) -> None:
        while self.cursor < len(self.log) and self.log[self.cursor].resume <= self.at:
            self.cursor += 1

    def read(self) -> list[Tx]:
        out: list[Tx] = []
        budget = self.rng.randint(0, 4)
        while self.cursor < self.available and len(out) < budget:
            tx = self.log[self.cursor]
            self.cursor += 1
            self.at = tx.resume
            if tx.events:
                out.append(tx)
        return out


@dataclass
class Lake:
    """What Delta and ZooKeeper hold: written batches (by number) and the committed state."""

    written: dict[int, tuple[Position, Position, tuple[int, ...]]] = field(default_factory=dict)
    committed_batch: int = 0
    committed_end: Position = Position(0)
    intent: tuple[int, Position] | None = None
    commits: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)


class Crash(Exception):
    pass


def run_tailer(log: list[Tx], lake: Lake, rng: random.Random, *, crash_after: int | None,
               grow: list[int]) -> None:
    """One tailer process: reads until the whole log is committed, or crashes after
    ``crash_after`` steps (a step is a read, a consumed transaction or a write phase)."""
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1
        if crash_after is not None and steps >= crash_after:
            raise Crash

    clock = [0.0]
    replay = None
    if lake.intent is not None and lake.intent[0] == lake.committed_batch + 1:
        replay = Cut(lake.intent[1], native(lake.intent[1]))
    cutter = BatchCutter(committed=lake.committed_end, max_events=rng.randint(1, 6),
                         max_seconds=rng.choice([0.5, 2.0, 100.0]), now=0.0, replay=replay)
    reader = Reader(log, grow.pop(0) if grow else len(log), lake.committed_end, rng)
    pending: list[int] = []

    def flush(cut: Cut) -> None:
        batch = lake.committed_batch + 1
        if lake.intent is None or lake.intent[0] != batch:
            lake.intent = (batch, cut.end)
        assert lake.intent == (batch, cut.end), "the batch must end where its intent says"
        step()
        content = (lake.committed_end, cut.end, tuple(pending))
        if batch in lake.written:
            assert lake.written[batch] == content, "a replayed batch differs from the written"
        lake.written[batch] = content
        step()
        lake.committed_batch, lake.committed_end, lake.intent = batch, cut.end, None
        lake.commits.append((batch, tuple(pending)))
        pending.clear()
        cutter.cut(cut, clock[0])

    for _ in range(2000):
        if lake.committed_end >= log[-1].resume:
            return
        if reader.available < len(log) and rng.random() < 0.3:
            reader.available = min(len(log), reader.available + rng.randint(1, 5))
        clock[0] += rng.random()
        txs = reader.read()
        step()
        for tx in txs:
            cut = cutter.before(tx.resume)
            if cut is not None:
                flush(cut)
            pending.append(tx.ident)
            cut = cutter.consumed(tx.resume, native(tx.resume), tx.events, clock[0])
            step()
            if cut is not None:
                flush(cut)
        if txs and rng.random() < 0.5:  # the reader had nothing more read ahead
            cut = cutter.drained()
            if cut is not None:
                flush(cut)
        if not txs:
            cut = cutter.idle(reader.at, native(reader.at))
            if cut is not None:
                flush(cut)
    raise AssertionError("the tailer never reached the end of the log (hung in replay?)")


@st.composite
def logs(draw: st.DrawFn) -> list[Tx]:
    sizes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
    out, lsn = [], 100
    for i, events in enumerate(sizes):
        lsn += draw(st.integers(1, 50))
        out.append(Tx(i, Position(lsn), events))
    return out


@settings(max_examples=400, deadline=timedelta(seconds=10))
@given(log=logs(), seed=st.integers(0, 2**32 - 1), crashes=st.lists(st.integers(1, 40),
                                                                     max_size=6))
def test_replayed_batches_equal_written_and_nothing_is_lost(
    log: list[Tx], seed: int, crashes: list[int]
) -> None:
    rng = random.Random(seed)
    lake = Lake()
    grow = [rng.randint(1, len(log)) for _ in range(len(crashes) + 1)]
    for crash_after in [*crashes, None]:
        try:
            run_tailer(log, lake, rng, crash_after=crash_after, grow=grow)
        except Crash:
            continue
    assert lake.committed_end == log[-1].resume
    # Every committed batch is the written one; together they hold every tracked
    # transaction exactly once, in log order.
    for batch, content in lake.commits:
        assert lake.written[batch][2] == content
    assert [b for b, _ in lake.commits] == list(range(1, len(lake.commits) + 1))
    committed = [t for _, content in lake.commits for t in content]
    assert committed == [tx.ident for tx in log if tx.events]


def test_a_transaction_past_the_recorded_end_closes_the_batch_first() -> None:
    """The bug this module fixes: the recorded end lies after an untracked transaction, and
    the next tracked transaction must not join the replayed batch."""
    end = Cut(Position(300), {"lsn": 300})
    cutter = BatchCutter(committed=Position(100), max_events=10, max_seconds=10, now=0,
                         replay=end)
    assert cutter.before(Position(200)) is None
    assert cutter.consumed(Position(200), {"lsn": 200}, 1, 0) is None  # tracked, inside
    assert cutter.before(Position(400)) == end  # past the end: close the batch first
    with pytest.raises(ReplayMismatch):
        cutter.consumed(Position(400), {"lsn": 400}, 1, 0)


def test_idle_reader_past_the_recorded_end_closes_the_batch() -> None:
    end = Cut(Position(300), {"lsn": 300})
    cutter = BatchCutter(committed=Position(100), max_events=10, max_seconds=10, now=0,
                         replay=end)
    assert cutter.idle(Position(250), {"lsn": 250}) is None
    assert cutter.idle(Position(300), {"lsn": 300}) == end
    assert cutter.idle(Position(900), {"lsn": 900}) == end  # reader skipped further


def test_idle_moves_past_untracked_transactions() -> None:
    cutter = BatchCutter(committed=Position(100), max_events=10, max_seconds=10, now=0)
    assert cutter.idle(Position(100), {"lsn": 100}) is None
    assert cutter.idle(Position(150), {"lsn": 150}) == Cut(Position(150), {"lsn": 150})


def test_a_recorded_end_before_the_committed_position_is_refused() -> None:
    with pytest.raises(ReplayMismatch):
        BatchCutter(committed=Position(500), max_events=1, max_seconds=1, now=0,
                    replay=Cut(Position(400), {"lsn": 400}))


def test_a_drained_reader_closes_the_batch_except_in_replay() -> None:
    cutter = BatchCutter(committed=Position(100), max_events=1000, max_seconds=100.0, now=0.0)
    assert cutter.drained() is None  # nothing consumed yet
    assert cutter.consumed(Position(150), {"lsn": 150}, 3, 0.1) is None
    assert cutter.drained() == Cut(Position(150), {"lsn": 150})
    end = Cut(Position(300), {"lsn": 300})
    replaying = BatchCutter(committed=Position(100), max_events=1, max_seconds=0.0, now=0.0,
                            replay=end)
    assert replaying.consumed(Position(150), {"lsn": 150}, 3, 0.1) is None
    assert replaying.drained() is None  # only the recorded end closes a replayed batch


def test_a_reader_behind_the_head_closes_batches_by_size_and_age_only() -> None:
    cutter = BatchCutter(committed=Position(100), max_events=10, max_seconds=2.0, now=0.0)
    assert cutter.consumed(Position(150), {"lsn": 150}, 3, 0.1) is None
    assert cutter.drained(behind=True) is None  # more is on its way: keep the batch open
    assert cutter.consumed(Position(160), {"lsn": 160}, 3, 1.0) is None
    assert cutter.consumed(Position(170), {"lsn": 170}, 3, 2.5) == Cut(Position(170),
                                                                        {"lsn": 170})
    cutter.cut(Cut(Position(170), {"lsn": 170}), 2.5)
    assert cutter.consumed(Position(180), {"lsn": 180}, 11, 2.6) == Cut(Position(180),
                                                                         {"lsn": 180})
    cutter.cut(Cut(Position(180), {"lsn": 180}), 2.6)
    assert cutter.consumed(Position(190), {"lsn": 190}, 1, 2.7) is None
    assert cutter.drained(behind=False) == Cut(Position(190), {"lsn": 190})  # caught up


def test_a_batch_is_full_at_its_event_limit_and_not_merely_old() -> None:
    """The tailer puts off an old batch's cut while pinned chunks' files are written, but
    never a full one's: ``full`` tells them apart."""
    cutter = BatchCutter(committed=Position(100), max_events=10, max_seconds=2.0, now=0.0)
    assert cutter.consumed(Position(150), {"lsn": 150}, 3, 5.0) is not None  # old
    assert not cutter.full
    assert cutter.consumed(Position(160), {"lsn": 160}, 7, 5.1) is not None
    assert cutter.full
    cutter.cut(Cut(Position(160), {"lsn": 160}), 5.2)
    assert not cutter.full


# ---- when a batch holding pinned chunks is cut (BatchCutter.due, may_close, waiting) ----


def pinning_cutter(*, replay: Cut | None = None, max_events: int = 10,
                   pins_per_batch: int | None = 2, pin_ahead_s: float | None = 1.0
                   ) -> BatchCutter:
    return BatchCutter(committed=Position(100), max_events=max_events, max_seconds=100.0,
                       now=0.0, replay=replay, pins_per_batch=pins_per_batch,
                       pin_ahead_s=pin_ahead_s)


def test_a_batch_with_pins_waits_for_their_files_until_it_must_be_cut() -> None:
    cutter = pinning_cutter()
    assert cutter.consumed(Position(150), {"lsn": 150}, 1, 0.1, pinned=1) is None
    assert cutter.due(closed=False, pinned=0, first_change_at=0.1, now=0.2) is Due.NOW
    assert cutter.due(closed=False, pinned=1, first_change_at=0.1, now=0.2) is (
        Due.IF_FILES_READY)
    # its first log change waited pin_ahead_s: cut without the files
    assert cutter.due(closed=False, pinned=1, first_change_at=0.1, now=1.1) is Due.NOW
    # pins_per_batch pinned: cut without the files
    assert cutter.due(closed=False, pinned=2, first_change_at=0.1, now=0.2) is Due.NOW
    # only chunk emissions, no log change: no age of its changes
    assert cutter.due(closed=False, pinned=1, first_change_at=None, now=99.0) is (
        Due.IF_FILES_READY)


def test_after_a_closed_batch_the_next_is_cut_only_when_full_or_its_changes_waited() -> None:
    cutter = pinning_cutter(max_events=3)
    assert cutter.consumed(Position(150), {"lsn": 150}, 1, 0.1) is None
    assert cutter.due(closed=True, pinned=0, first_change_at=0.1, now=0.2) is Due.NOT_YET
    assert cutter.due(closed=True, pinned=5, first_change_at=0.1, now=0.2) is Due.NOT_YET
    assert cutter.due(closed=True, pinned=0, first_change_at=0.1, now=1.1) is Due.NOW
    assert cutter.consumed(Position(160), {"lsn": 160}, 2, 0.3) is not None  # full
    assert cutter.due(closed=True, pinned=0, first_change_at=0.1, now=0.3) is Due.NOW


def test_a_batch_that_pinned_pins_per_batch_chunks_is_cut_after_its_transaction() -> None:
    cutter = pinning_cutter(pins_per_batch=2)
    assert cutter.consumed(Position(150), {"lsn": 150}, 0, 0.1, pinned=1) is None
    assert cutter.consumed(Position(160), {"lsn": 160}, 0, 0.2, pinned=2) == Cut(
        Position(160), {"lsn": 160})
    unlimited = pinning_cutter(pins_per_batch=None)
    assert unlimited.consumed(Position(150), {"lsn": 150}, 0, 0.1, pinned=50) is None
    assert not unlimited.pins_full(10**6)


def test_a_replayed_batch_pins_without_limit_is_never_closed_and_is_cut_at_its_end() -> None:
    end = Cut(Position(300), {"lsn": 300})
    cutter = pinning_cutter(replay=end, pins_per_batch=1)
    assert cutter.consumed(Position(150), {"lsn": 150}, 1, 0.1, pinned=3) is None
    assert not cutter.pins_full(3)
    assert not cutter.may_close(3)
    assert cutter.waiting(3) is None  # only its recorded end closes it
    assert cutter.due(closed=False, pinned=3, first_change_at=0.1, now=0.2) is Due.NOW
    assert cutter.consumed(Position(300), {"lsn": 300}, 1, 0.2, pinned=3) == end


def test_a_timed_out_read_considers_the_pending_cut_of_a_batch_with_pins_only() -> None:
    cutter = pinning_cutter()
    assert cutter.waiting(1) is None  # nothing consumed yet
    assert cutter.consumed(Position(150), {"lsn": 150}, 1, 0.1) is None
    assert cutter.waiting(0) is None
    assert cutter.waiting(1) == Cut(Position(150), {"lsn": 150})
    assert cutter.may_close(1) and not cutter.may_close(0)


@settings(max_examples=300, deadline=500)
@given(closed=st.booleans(), replaying=st.booleans(), pinned=st.integers(0, 6),
       pins_per_batch=st.none() | st.integers(1, 4), events=st.integers(0, 12),
       first_change_at=st.none() | st.floats(0.0, 10.0),
       waited_for=st.floats(0.0, 10.0), pin_ahead_s=st.none() | st.floats(0.0, 5.0))
def test_due_follows_the_pinning_rules(
    closed: bool, replaying: bool, pinned: int, pins_per_batch: int | None, events: int,
    first_change_at: float | None, waited_for: float, pin_ahead_s: float | None
) -> None:
    replay = Cut(Position(10**6), {"lsn": 10**6}) if replaying else None
    cutter = pinning_cutter(replay=replay, max_events=8, pins_per_batch=pins_per_batch,
                            pin_ahead_s=pin_ahead_s)
    cutter.consumed(Position(150), {"lsn": 150}, events, 0.0)
    now = (first_change_at or 0.0) + waited_for
    verdict = cutter.due(closed=closed, pinned=pinned, first_change_at=first_change_at,
                         now=now)
    full = events >= 8
    waited = (first_change_at is not None and pin_ahead_s is not None
              and now - first_change_at >= pin_ahead_s)
    if closed:  # never sooner than it must, never waiting on its own files
        assert verdict is (Due.NOW if full or waited else Due.NOT_YET)
        return
    assert verdict is not Due.NOT_YET
    if replaying or full or waited or not pinned:
        assert verdict is Due.NOW
    elif pins_per_batch is not None and pinned >= pins_per_batch:
        assert verdict is Due.NOW
    else:
        assert verdict is Due.IF_FILES_READY
    # a batch that waits for files is one that may be closed to wait for them
    assert cutter.may_close(pinned) == (pinned > 0 and not replaying)
    if verdict is Due.IF_FILES_READY:
        assert cutter.may_close(pinned)
