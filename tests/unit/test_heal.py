"""Heal requests: how requests for one table merge, and their stored form."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from dblog.core.events import TableId
from dblog.tail.heal import MAX_KEYS, MAX_REASONS, HealRequest, heal_path

T = TableId("shop", "orders")


def test_keys_merge_and_a_whole_table_request_absorbs_them() -> None:
    first = HealRequest(T, ((1,), (2,)), ("a",), requested_at_ms=1)
    both = first.merged([(2,), (3,)], "b", 2)
    assert both.keys == ((1,), (2,), (3,)) and both.reasons == ("a", "b")
    assert both.generation == first.generation + 1
    whole = both.merged(None, "c", 3)
    assert whole.whole_table and whole.merged([(4,)], "d", 4).whole_table


def test_too_many_keys_heal_the_whole_table_and_reasons_stay_few() -> None:
    request = HealRequest(T, tuple((i,) for i in range(MAX_KEYS)), ("r0",))
    assert request.merged([(MAX_KEYS,)], "r1", 1).whole_table
    for i in range(2 * MAX_REASONS):
        request = request.merged(None, f"r{i}", i)
    assert len(request.reasons) == MAX_REASONS and request.reasons[-1] == f"r{2 * MAX_REASONS - 1}"
    assert request.merged(None, request.reasons[-1], 99).reasons == request.reasons


keys = st.lists(st.tuples(st.one_of(
    st.integers(-2**63, 2**63 - 1), st.text(max_size=5), st.binary(max_size=4),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.dates(), st.datetimes(timezones=st.just(dt.UTC)))), max_size=5)


@given(keys, st.booleans())
def test_a_request_survives_its_stored_form(found: list[tuple[object, ...]], whole: bool) -> None:
    request = HealRequest(T, None if whole else tuple(dict.fromkeys(found)), ("why",), 3, 7,
                          "cap", 2, "boom", 9)
    assert HealRequest.from_json(request.to_json()) == request


def test_every_table_has_its_own_place() -> None:
    assert heal_path(T) != heal_path(TableId("shop", "order"))
    assert heal_path(TableId("a b", "c/d")).count("/") == 1
