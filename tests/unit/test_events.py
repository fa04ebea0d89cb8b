"""Unit tests for the shared event contract (dblog.core.events)."""

from __future__ import annotations

import json

import pytest

from dblog.core.events import ChangeEvent, Op, Position, TableId, WatermarkEvent, Window

T = TableId("shop", "orders")


def test_positions_order_by_lsn_then_seq() -> None:
    assert Position(1, 5) < Position(2, 0) < Position(2, 1)
    assert sorted([Position(3), Position(1, 2), Position(1)]) == [
        Position(1),
        Position(1, 2),
        Position(3),
    ]


@pytest.mark.parametrize("lsn,seq", [(-1, 0), (2**63, 0), (0, -1)])
def test_position_rejects_out_of_range(lsn: int, seq: int) -> None:
    with pytest.raises(ValueError):
        Position(lsn, seq)


def test_binlog_encoding_roundtrips_and_orders_across_files() -> None:
    p = Position.from_binlog(42, 2**32 - 1, seq=3)
    assert (p.binlog_file_index, p.binlog_offset, p.seq) == (42, 2**32 - 1, 3)
    assert Position.from_binlog(42, 2**32 - 1) < Position.from_binlog(43, 4)
    with pytest.raises(ValueError):
        Position.from_binlog(1, 2**32)


def test_position_json_roundtrip() -> None:
    p = Position(123, 4)
    assert Position.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert Position.from_json({"lsn": 7}) == Position(7, 0)


def test_table_id_parse_and_str() -> None:
    assert TableId.parse("shop.orders") == T
    assert str(T) == "shop.orders"
    for bad in ["orders", ".orders", "shop.", ""]:
        with pytest.raises(ValueError):
            TableId.parse(bad)


def test_change_event_json_roundtrip() -> None:
    e = ChangeEvent(
        T,
        Op.UPDATE,
        (1, "a"),
        Position(10, 2),
        before={"id": 1, "v": "x"},
        after={"id": 1, "v": "y"},
        commit_ts_ms=1700000000000,
        window_id="w1",
    )
    back = ChangeEvent.from_json(json.loads(e.dumps()))
    assert back == e
    assert back.key == (1, "a")


@pytest.mark.parametrize(
    "op,before,after",
    [
        (Op.CREATE, None, None),
        (Op.READ, {"id": 1}, None),
        (Op.UPDATE, {"id": 1}, None),
        (Op.DELETE, None, {"id": 1}),
    ],
)
def test_change_event_requires_images(
    op: Op, before: dict[str, int] | None, after: dict[str, int] | None
) -> None:
    with pytest.raises(ValueError):
        ChangeEvent(T, op, (1,), Position(1), before=before, after=after)


def test_watermark_and_window_values() -> None:
    assert WatermarkEvent("u", Position(1)) == WatermarkEvent("u", Position(1))
    w = Window("w1", T, "lo", "hi", meta={"range": 1})
    assert w == Window("w1", T, "lo", "hi")  # meta does not take part in equality
    assert hash(w) == hash(Window("w1", T, "lo", "hi", meta={"other": 2}))
    with pytest.raises(ValueError):
        Window("w2", T, "same", "same")


def test_keys_keep_their_types_through_json() -> None:
    import datetime
    import json
    from decimal import Decimal

    from hypothesis import given
    from hypothesis import strategies as st

    from dblog.core.events import key_from_json, key_to_json

    values = st.one_of(
        st.integers(), st.text(), st.binary(), st.decimals(allow_nan=False, allow_infinity=False),
        st.dates(), st.datetimes(), st.floats(allow_nan=False), st.none(), st.booleans(),
    )

    @given(st.lists(values, min_size=1, max_size=4).map(tuple))
    def roundtrip(key: tuple[object, ...]) -> None:
        back = key_from_json(json.loads(json.dumps(key_to_json(key))))
        assert back == key
        assert [type(v) for v in back] == [type(v) for v in key]

    roundtrip()
    assert key_from_json(None) is None
    assert key_to_json((Decimal("18446744073709551615"), datetime.date(2024, 1, 2))) == [
        {"$dec": "18446744073709551615"}, {"$date": "2024-01-02"}]
