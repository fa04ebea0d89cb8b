"""Key-range names (full_state partitions): stable, sortable, reversible, and planned in
key order with the requested size."""

from __future__ import annotations

import bisect
import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblog.core.chunking import KeyRange
from dblog.core.errors import ConfigError
from dblog.core.events import Key
from dblog.core.ranges import key_ranges, parse_range_name, plan_more, range_name

INVALID = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")

key_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.dates(),
    st.datetimes(timezones=st.sampled_from([None, dt.UTC])),
)


@given(st.integers(min_value=0, max_value=999_999),
       st.one_of(st.none(), st.lists(key_values, min_size=1, max_size=3).map(tuple)))
def test_names_round_trip_and_are_valid_partition_keys(index: int, lower: Key | None) -> None:
    name = range_name(index, lower)
    assert not any(bad in name for bad in INVALID)
    parsed = parse_range_name(name)
    assert parsed.index == index
    assert parsed.lower == lower


def test_dots_in_string_keys_survive() -> None:
    name = range_name(3, ("a...b", "....."))
    assert "..." not in name
    assert parse_range_name(name).lower == ("a...b", ".....")


@given(st.lists(st.integers(min_value=0, max_value=999_999), min_size=2, unique=True))
def test_names_sort_by_index(indexes: list[int]) -> None:
    names = [range_name(i, (i * 7,)) for i in indexes]
    assert sorted(names) == [range_name(i, (i * 7,)) for i in sorted(indexes)]


@pytest.mark.parametrize("bad", ["", "1:start", "00000x:start", "000001:", "000001:{}",
                                 "000001:[]", "000001:[1"])
def test_malformed_names_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_range_name(bad)


def test_key_ranges_chain_lower_bounds_and_leave_the_last_open() -> None:
    names = [range_name(0, None), range_name(1, (100,)), range_name(2, (250,))]
    got = key_ranges(names, names)
    assert got == {names[0]: KeyRange(None, (100,)), names[1]: KeyRange((100,), (250,)),
                   names[2]: KeyRange((250,), None)}
    with pytest.raises(ConfigError, match="missing"):
        key_ranges([names[0], names[2]], [names[0]])
    with pytest.raises(ConfigError, match="not a planned range"):
        key_ranges(names, [range_name(5, (1,))])
    assert key_ranges([range_name(1, (100,)), range_name(0, None)], [names[0]]) == {
        names[0]: KeyRange(None, (100,))}
    assert Decimal  # typed keys are covered by the round-trip property


def fake_table(keys: list[int]):  # type: ignore[no-untyped-def]
    ordered = sorted(keys)

    def key_after(after: Key | None, offset: int) -> Key | None:
        start = 0 if after is None else bisect.bisect_right(ordered, after[0])
        i = start + offset
        return (ordered[i],) if i < len(ordered) else None

    return key_after


@given(st.lists(st.integers(min_value=0, max_value=10_000), unique=True, max_size=300),
       st.integers(min_value=1, max_value=40))
def test_planned_ranges_cover_all_keys_with_the_asked_size(keys: list[int], rows: int) -> None:
    names = plan_more([], fake_table(keys), rows)
    ranges = list(key_ranges(names, names).values())
    counts = [sum(1 for k in keys if r.contains((k,))) for r in ranges]
    assert sum(counts) == len(keys)  # contiguous, disjoint, complete
    assert all(c == rows for c in counts[:-1])  # every range but the open last one: exactly
    assert len(ranges) == 1 or counts[-1] >= 1  # the last range is never planned empty


@given(st.lists(st.integers(min_value=0, max_value=10_000), unique=True, max_size=200),
       st.lists(st.integers(min_value=10_001, max_value=20_000), unique=True, max_size=200),
       st.integers(min_value=1, max_value=30))
def test_growth_adds_ranges_above_and_keeps_existing_names(
        first: list[int], later: list[int], rows: int) -> None:
    before = plan_more([], fake_table(first), rows)
    added = plan_more(before, fake_table(first + later), rows)
    assert not set(added) & set(before)
    assert [parse_range_name(n).index for n in before + added] == list(
        range(len(before) + len(added)))
    assert plan_more(before + added, fake_table(first + later), rows) == []
    names = before + added
    counts = [sum(1 for k in first + later if r.contains((k,)))
              for r in key_ranges(names, names).values()]
    assert sum(counts) == len(first) + len(later)


def test_plan_more_stops_at_most() -> None:
    names = plan_more([], fake_table(list(range(1000))), 10, most=5)
    assert len(names) == 5
    assert len(plan_more(names, fake_table(list(range(1000))), 10, most=1000)) == 95
