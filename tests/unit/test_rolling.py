"""The rolling verification's pure parts: the walk over a table's key ranges, the place it
keeps (and resumes from), and its pace (a fake clock)."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblog.app.rolling import (
    Cursor,
    FixedWalk,
    Pacer,
    Place,
    PlannedWalk,
    RangeWalk,
    Step,
    every_range,
    place_path,
)
from dblog.core.chunking import KeyRange
from dblog.core.events import Key, TableId
from dblog.core.ranges import key_ranges, plan_more

TABLE = TableId("shop", "orders")


def index_of(keys: Sequence[int]) -> Callable[[Key | None, int], Key | None]:
    """``key_after`` over a sorted list of integer keys, as a database's index answers it."""

    def key_after(after: Key | None, offset: int) -> Key | None:
        start = 0 if after is None else bisect.bisect_right(keys, after[0])
        at = start + offset
        return (keys[at],) if at < len(keys) else None

    return key_after


def walk_all(walk: RangeWalk) -> list[Step]:
    steps = [walk.first()]
    while (after := walk.after(steps[-1])) is not None:
        steps.append(after)
    return steps


def covered(keys: Sequence[int], r: KeyRange) -> list[int]:
    return [k for k in keys
            if (r.lower is None or k > r.lower[0]) and (r.upper is None or k <= r.upper[0])]


@given(st.lists(st.integers(-10**6, 10**6), unique=True, max_size=60).map(sorted),
       st.integers(1, 12))
def test_a_planned_walk_covers_every_key_once_in_ranges_of_range_rows(
        keys: list[int], range_rows: int) -> None:
    steps = walk_all(PlannedWalk(index_of(keys), range_rows))
    assert [s.index for s in steps] == list(range(len(steps)))
    assert steps[0].key_range.lower is None and steps[-1].key_range.upper is None
    assert [s.last for s in steps] == [False] * (len(steps) - 1) + [True]
    for before, after in zip(steps, steps[1:], strict=False):
        assert before.key_range.upper == after.key_range.lower  # contiguous
    pieces = [covered(keys, s.key_range) for s in steps]
    assert [k for p in pieces for k in p] == keys  # every key once, in order
    assert all(len(p) == range_rows for p in pieces[:-1])
    assert len(pieces[-1]) <= 2 * range_rows  # the last range is open above
    # The ranges are the ones the Dagster planner would plan (same names and bounds).
    names = plan_more([], index_of(keys), range_rows, most=10**6)
    assert {s.name: s.key_range for s in steps} == key_ranges(names, names)
    assert every_range(PlannedWalk(index_of(keys), range_rows)) == key_ranges(names, names)


def test_a_planned_walk_follows_the_table_as_it_changes() -> None:
    keys = list(range(1, 11))
    walk = PlannedWalk(index_of(keys), 4)
    first = walk.first()
    assert first.key_range == KeyRange(None, (4,))
    keys[:] = [*range(1, 11), *range(100, 110)]  # grew above while the walk went on
    second = walk.after(first)
    assert second is not None and second.key_range == KeyRange((4,), (8,))
    assert [s.key_range.upper for s in walk_all(walk)][-1] is None


def test_a_fixed_walk_goes_through_the_given_ranges_in_order() -> None:
    ranges = {"a": KeyRange(None, (10,)), "b": KeyRange((10,), (20,)), "c": KeyRange((20,), None)}
    steps = walk_all(FixedWalk(ranges))
    assert [(s.index, s.name, s.key_range, s.last) for s in steps] == [
        (0, "a", ranges["a"], False), (1, "b", ranges["b"], False), (2, "c", ranges["c"], True)]
    with pytest.raises(ValueError, match="no ranges"):
        FixedWalk({})


def test_a_walk_resumes_at_its_cursor_or_starts_over() -> None:
    keys = list(range(1, 21))
    planned = PlannedWalk(index_of(keys), 5)
    steps = walk_all(planned)
    for step in steps:
        assert planned.resume(step.cursor) == step
    fixed = FixedWalk({s.name: s.key_range for s in steps})
    assert fixed.resume(steps[2].cursor) == steps[2]
    # A range the fixed walk no longer has (its partitions were planned anew): start over.
    assert fixed.resume(Cursor(2, "000002:[999]", (999,))) is None
    assert fixed.resume(Cursor(7, steps[2].name, steps[2].key_range.lower)) is None


def test_the_place_moves_on_range_by_range_and_a_new_pass_begins_after_the_last() -> None:
    keys = list(range(1, 10))
    walk = PlannedWalk(index_of(keys), 5)
    steps = walk_all(walk)
    assert len(steps) == 2
    place = Place.start(TABLE, now_ms=1_000)
    assert (place.pass_number, place.next, place.rows) == (1, None, 0)
    place = place.advanced(steps[0], walk.after(steps[0]), rows=5, differing=1, repaired=1,
                           now_ms=2_000)
    assert place.next == steps[1].cursor and place.rows == 5 and place.pass_number == 1
    place = place.advanced(steps[1], None, rows=4, differing=0, repaired=0, now_ms=31_000)
    assert (place.pass_number, place.next, place.rows, place.ranges) == (2, None, 0, 0)
    assert place.pass_started_ms == 31_000
    assert place.last_pass == {"pass": 1, "ranges": 2, "rows": 9, "differing": 1,
                               "repaired": 1, "started_ms": 1_000, "ended_ms": 31_000,
                               "seconds": 30.0}


@given(st.one_of(st.none(), st.tuples(st.integers(), st.text())),
       st.integers(1, 10**6), st.integers(0, 10**9))
def test_a_place_survives_its_json(lower: Key | None, pass_number: int, rows: int) -> None:
    cursor = Cursor(3, "000003:x", lower)
    place = Place(TABLE, pass_number, cursor, rows=rows, ranges=3, differing=1, repaired=0,
                  pass_started_ms=5, last_pass={"pass": 1, "seconds": 2.5})
    assert Place.from_json(place.to_json()) == place
    assert Place.from_json(Place.start(TABLE, 9).to_json()) == Place.start(TABLE, 9)


def test_a_place_lives_under_the_source_state_at_a_name_zookeeper_takes() -> None:
    path = place_path(TableId("my db", "ordres/été"))
    assert path.startswith("repair/") and path.count("/") == 1
    assert path[len("repair/"):].isalnum()
    assert place_path(TableId("a", "b")) != place_path(TableId("a", "c"))


class FakeTime:
    """A clock whose waits move it on (a stop ends a wait early)."""

    def __init__(self) -> None:
        self.now = 50.0
        self.stop_at: float | None = None

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        if self.stop_at is not None and self.now + seconds >= self.stop_at:
            self.now = max(self.now, self.stop_at)
            return True
        self.now += seconds
        return False


@given(st.floats(10, 1e6), st.lists(st.tuples(st.integers(0, 200_000), st.floats(0, 30)),
                                    min_size=1, max_size=30),
       st.lists(st.floats(0, 100), min_size=30, max_size=30))
def test_the_pace_holds_rows_to_the_rate_and_a_pass_takes_rows_over_rate(
        rate: float, ranges: list[tuple[int, float]], idle: list[float]) -> None:
    """Each range takes ``work`` seconds and checksums ``rows`` rows; between ranges the
    caller may idle. From the first range's start, the rows of ranges 1..k never exceed
    ``rate`` times the time until range k is paid for, so a pass of R rows takes at least
    R / rate seconds; and it takes no longer than its work and idle time or that."""
    t = FakeTime()
    pacer = Pacer(rate, clock=t.clock, wait=t.wait)
    began = t.now
    rows_so_far, work_so_far = 0, 0.0
    for (rows, work), pause in zip(ranges, idle, strict=False):
        pacer.begin()
        t.now += work
        assert pacer.paid(rows)
        rows_so_far += rows
        work_so_far += work
        assert rows_so_far <= rate * (t.now - began) * (1 + 1e-9) + 1e-6
        t.now += pause
    spent = t.now - began - sum(idle[:len(ranges)])
    assert spent >= rows_so_far / rate * (1 - 1e-9) - 1e-6
    assert spent <= work_so_far + rows_so_far / rate + 1e-6


def test_idle_time_between_ranges_buys_no_credit() -> None:
    t = FakeTime()
    pacer = Pacer(100, clock=t.clock, wait=t.wait)
    t.now += 3600
    pacer.begin()
    assert pacer.paid(500)
    assert t.now == pytest.approx(50 + 3600 + 5)


def test_work_slower_than_the_rate_is_not_waited_for_again() -> None:
    t = FakeTime()
    pacer = Pacer(1000, clock=t.clock, wait=t.wait)
    pacer.begin()
    t.now += 8  # the mirror's merge took its time
    assert pacer.paid(2000)  # 2 s of rows: already paid by 8 s of work
    assert t.now == pytest.approx(58)
    assert pacer.delay() == 0


def test_a_stop_ends_the_wait_at_once() -> None:
    t = FakeTime()
    t.stop_at = 52.0
    pacer = Pacer(10, clock=t.clock, wait=t.wait)
    pacer.begin()
    assert not pacer.paid(1000)  # 100 s to pay: stopped after 2
    assert t.now == 52.0
    real = Pacer(1, stop=(stop := threading.Event()))
    stop.set()
    real.begin()
    assert not real.paid(3600)
    with pytest.raises(ValueError, match="positive"):
        Pacer(0)
