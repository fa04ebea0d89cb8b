"""The chunk description's versioned JSON (``chunks/<window>``), written by the capture and
read by the tailer."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from dblog.core.events import Key, TableId
from dblog.protocol.chunks import ChunkDescription
from dblog.sources.base import Column, TableSchema

TABLE = TableId("shop", "orders")
SCHEMA = TableSchema(TABLE, (Column("id", "BIGINT", False, "bigint"),
                             Column("at", "TIMESTAMP", True, "timestamp")), ("id",))
keys = st.one_of(st.none(), st.tuples(st.integers(-2**63, 2**63 - 1)),
                 st.tuples(st.text(max_size=8), st.decimals(allow_nan=False,
                                                             allow_infinity=False, places=2)))


@given(keys, st.booleans(), st.one_of(st.none(), st.tuples(keys, keys)), st.booleans())
def test_a_description_reads_back_as_written(
    last: Key | None, final: bool, deletes: tuple[Key | None, Key | None] | None,
    with_schema: bool,
) -> None:
    written = ChunkDescription("c1", "r1", last, final, deletes,
                               SCHEMA if with_schema else None)
    assert ChunkDescription.from_json(TABLE, written.to_json()) == written


def test_the_json_is_the_one_earlier_versions_wrote_and_read() -> None:
    """Field names unchanged: a tailer of this version reads what an older capture wrote."""
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    doc = ChunkDescription("c1", "r1", (7,), True, ((None,), (Decimal("9.50"),)),
                           SCHEMA).to_json()
    assert set(doc) == {"last_key", "final", "capture_id", "range_id", "delete_range",
                        "columns", "key"}
    assert doc["key"] == ["id"] and doc["final"] is True
    older = {"last_key": doc["last_key"], "final": False, "capture_id": "c1",
             "range_id": "r1", "delete_range": None}
    read = ChunkDescription.from_json(TABLE, older)
    assert (read.last_key, read.delete_range, read.schema) == ((7,), None, None)
    assert ChunkDescription.from_json(TABLE, ChunkDescription(
        "c", "r", (when,), False, None, None).to_json()).last_key == (when,)
