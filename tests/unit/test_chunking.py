"""Unit tests for key-range planning and chunk predicates (pipeline.chunking)."""

from __future__ import annotations

import itertools
import sqlite3
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.chunking import KeyRange, contains, key_order, next_chunk_predicate, plan_ranges
from pipeline.events import Key


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


@settings(max_examples=200, deadline=None)
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
