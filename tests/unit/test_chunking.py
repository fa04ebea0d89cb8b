"""Unit tests for key-range planning and chunk predicates (dblog.core.chunking)."""

from __future__ import annotations

import itertools
import sqlite3
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.core.chunking import (
    KeyRange,
    contains,
    key_order,
    next_chunk_predicate,
    plan_chunk_reads,
    plan_ranges,
    planned_outcome,
    split_sizes,
)
from dblog.core.events import Key


def dq(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_plan_ranges_bounds_and_open_end() -> None:
    assert plan_ranges([(10,), (20,)]) == [
        KeyRange(None, (10,)),
        KeyRange((10,), (20,)),
        KeyRange((20,), None),
    ]
    assert plan_ranges([]) == [KeyRange(None, None)]


@pytest.mark.parametrize("bounds", [[(2,), (2,)], [(3,), (1,)], [(1, None)]])
def test_plan_ranges_rejects_bad_boundaries(bounds: list[Key]) -> None:
    with pytest.raises(ValueError):
        plan_ranges(bounds)


def test_contains_is_lower_exclusive_upper_inclusive() -> None:
    r = KeyRange((10,), (20,))
    assert [k for k in range(8, 23) if contains(r, (k,))] == list(range(11, 21))
    assert r.contains((20,)) and not r.contains((10,))
    assert contains(KeyRange(None, None), (-(10**9),))
    assert contains(KeyRange((1, "b"), (2, "a")), (1, "c"))
    assert not contains(KeyRange((1, "b"), (2, "a")), (2, "b"))
    with pytest.raises(ValueError):
        contains(r, (None,))
    with pytest.raises(ValueError):
        KeyRange((5,), (5,))


@given(st.lists(st.integers(-50, 50), unique=True).map(sorted), st.integers(-60, 60))
def test_planned_ranges_partition_the_key_space(bounds: list[int], k: int) -> None:
    ranges = plan_ranges([(b,) for b in bounds])
    assert sum(contains(r, (k,)) for r in ranges) == 1


def test_key_order_total_with_none() -> None:
    keys: list[Key] = [(2, "b"), (None, "z"), (1, None), (1, "a"), (None, None)]
    assert sorted(keys, key=key_order) == [
        (None, None),
        (None, "z"),
        (1, None),
        (1, "a"),
        (2, "b"),
    ]


def test_predicate_single_column() -> None:
    sql, params = next_chunk_predicate(["id"], (5,), (9,), quote_ident=dq)
    assert sql == '(("id" > %s)) AND (("id" <= %s))'
    assert params == [5, 9]


def test_predicate_composite_expansion_has_no_row_values() -> None:
    sql, params = next_chunk_predicate(["a", "b"], (1, "x"), None, quote_ident=dq)
    assert sql == '("a" >= %s AND (("a" > %s) OR ("a" = %s AND "b" > %s)))'
    assert params == [1, 1, 1, "x"]
    sql, params = next_chunk_predicate(["a", "b", "c"], None, (1, 2, 3), quote_ident=dq)
    assert sql == (
        '("a" <= %s AND (("a" < %s) OR ("a" = %s AND "b" < %s)'
        ' OR ("a" = %s AND "b" = %s AND "c" <= %s)))'
    )
    assert params == [1, 1, 1, 2, 1, 2, 3]


def test_predicate_unbounded_and_errors() -> None:
    assert next_chunk_predicate(["id"], None, None, quote_ident=dq) == ("1 = 1", [])
    with pytest.raises(ValueError):
        next_chunk_predicate(["a", "b"], (1,), None, quote_ident=dq)
    with pytest.raises(ValueError):
        next_chunk_predicate([], None, None, quote_ident=dq)
    with pytest.raises(ValueError):
        next_chunk_predicate(["a"], (None,), None, quote_ident=dq)


def test_predicate_never_formats_values_into_sql() -> None:
    evil = "x'; DROP TABLE t; --"
    sql, params = next_chunk_predicate(
        ['we"ird', "b"], (evil, 1), (evil, 2), quote_ident=dq, placeholder="?"
    )
    assert evil not in sql and "DROP" not in sql
    assert '"we""ird"' in sql
    assert params.count(evil) == 6


KEYS = [(a, b, c) for a, b, c in itertools.product(range(3), ["a", "b", "c"], range(3))]
optional_key = st.none() | st.sampled_from(KEYS)


@settings(max_examples=200, deadline=timedelta(seconds=10))
@given(optional_key, optional_key)
def test_predicate_matches_tuple_order_in_sqlite(last: Key | None, end: Key | None) -> None:
    """Executed against SQLite: the predicate selects exactly keys in (last, end]."""
    con = sqlite3.connect(":memory:")
    con.execute('CREATE TABLE t ("a" INTEGER, "b" TEXT, "c" INTEGER, PRIMARY KEY (a, b, c))')
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", KEYS)
    sql, params = next_chunk_predicate(["a", "b", "c"], last, end, quote_ident=dq, placeholder="?")
    query = "SELECT a, b, c FROM t WHERE " + sql + " ORDER BY a, b, c"  # noqa: S608 - test only
    got: list[Any] = [tuple(r) for r in con.execute(query, params)]
    expected = [k for k in sorted(KEYS) if (last is None or k > last) and (end is None or k <= end)]
    assert got == expected
    con.close()


# ---- chunks read by several selects at once ------------------------------------------------

def _model_key_after(keys: list[int]) -> Any:
    """The database's ``key_after`` over a sorted key list."""
    def key_after(lower: Key | None, offset: int, upper: Key | None) -> Key | None:
        inside = [k for k in keys if (lower is None or k > lower[0])
                  and (upper is None or k <= upper[0])]
        return (inside[offset],) if offset < len(inside) else None
    return key_after


@given(st.integers(1, 40), st.integers(1, 6))
def test_split_sizes_spread_rows_evenly_and_never_empty(rows: int, parts: int) -> None:
    sizes = split_sizes(rows, parts)
    assert sum(sizes) == rows and min(sizes) >= 1
    assert len(sizes) == min(rows, parts) and max(sizes) - min(sizes) <= 1


@settings(max_examples=300)
@given(st.lists(st.integers(0, 60), unique=True).map(sorted),
       st.none() | st.integers(-1, 61), st.none() | st.integers(-1, 61),
       st.integers(1, 30), st.integers(1, 5))
def test_a_planned_chunk_reads_its_range_in_contiguous_parts(
    keys: list[int], lo: int | None, hi: int | None, rows: int, parts: int,
) -> None:
    after = None if lo is None else (lo,)
    upper = None if hi is None or (lo is not None and hi <= lo) else (hi,)
    bounds = plan_chunk_reads(after, upper, rows, parts, _model_key_after(keys))
    assert bounds[0] == after and 2 <= len(bounds) <= parts + 1
    inner = [b for b in bounds[1:] if b is not None]
    assert inner == sorted(inner) and len(set(inner)) == len(inner)
    end = bounds[-1]
    through = upper if end is None else end

    def between(a: Key | None, b: Key | None) -> list[int]:
        return [k for k in keys if (a is None or k > a[0]) and (b is None or k <= b[0])]

    covered = between(after, through)
    if end is not None and end != upper:
        assert len(covered) == rows  # a full chunk holds exactly its size
    else:
        assert len(covered) <= rows  # the range ends within the chunk
    # the parts (b0, b1], (b1, b2], ... (the last to upper when end is None) tile it
    tops = [upper if b is None else b for b in bounds[1:]]
    assert sum(len(between(a, b)) for a, b in zip(bounds, tops, strict=False)) == len(covered)
    outcome = planned_outcome(after=after, upper=upper, end=end)
    assert outcome.final == (end is None or end == upper)
    assert outcome.delete_range == (after, through)


def test_a_planned_chunk_that_ends_a_range_is_final() -> None:
    assert planned_outcome(after=(1,), upper=(9,), end=(5,), ends_range=True).final
    assert not planned_outcome(after=(1,), upper=(9,), end=(5,)).final
    assert planned_outcome(after=(1,), upper=None, end=(5,), filtered=True).delete_range is None
