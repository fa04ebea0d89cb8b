"""PostgreSQL source pure logic: pgoutput and replication protocol messages, type mapping
and conversion, literals."""

from __future__ import annotations

import datetime as dt
import re
import struct
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblog.core.errors import ConfigError, SourceError
from dblog.sources.postgres import pgoutput as po
from dblog.sources.postgres import replication as rp
from dblog.sources.postgres.sqltext import literal, quote_ident
from dblog.sources.postgres.types import (
    NUMERIC,
    canonical_type,
    converter,
    numeric_modifier,
    parse_array,
    source_type_name,
    type_oid,
)


def _tuple(*values: object) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is po.UNCHANGED_TOAST:
            out += b"u"
        else:
            data = str(v).encode()
            out += b"t" + struct.pack(">i", len(data)) + data
    return out


def test_messages_parse() -> None:
    assert po.parse(b"B" + struct.pack(">QqI", 100, 5, 7)) == po.Begin(100, 5, 7)
    assert po.parse(b"C\x00" + struct.pack(">QQq", 100, 120, 5)) == po.Commit(100, 120, 5)
    rel = (b"R" + struct.pack(">I", 42) + b'my "s"\x00t 1\x00f' + struct.pack(">h", 2)
           + b"\x01" + b"id\x00" + struct.pack(">Ii", 23, -1)
           + b"\x00" + "ünï".encode() + b"\x00" + struct.pack(">Ii", 1700, (12 << 16 | 2) + 4))
    parsed = po.parse(rel)
    assert isinstance(parsed, po.Relation)
    assert (parsed.namespace, parsed.name, parsed.replica_identity) == ('my "s"', "t 1", "f")
    assert parsed.columns[1] == po.RelationColumn("ünï", 1700, (12 << 16 | 2) + 4, False)
    assert po.parse(b"I" + struct.pack(">I", 42) + b"N" + _tuple(1, None)) == \
        po.Insert(42, ("1", None))
    update = po.parse(b"U" + struct.pack(">I", 42) + b"O" + _tuple(1, "x") + b"N"
                      + _tuple(2, po.UNCHANGED_TOAST))
    assert update == po.Update(42, ("1", "x"), False, ("2", po.UNCHANGED_TOAST))
    assert po.parse(b"D" + struct.pack(">I", 42) + b"K" + _tuple(1, None)) == \
        po.Delete(42, ("1", None), True)
    assert po.parse(b"T" + struct.pack(">ib", 2, 1) + struct.pack(">II", 42, 43)) == \
        po.Truncate((42, 43), True, False)
    assert po.parse(b"Y" + b"rest") == po.Other("Y")
    with pytest.raises(po.ProtocolError):
        po.parse(b"I" + struct.pack(">I", 42) + b"N" + struct.pack(">h", 1) + b"t\x00\x00")


def test_replication_messages_frame_pgoutput_and_carry_explicit_positions() -> None:
    """XLogData carries a pgoutput message after its 25-byte header; a keepalive its WAL
    end and whether the server wants a reply; the status update reports one position as
    written, flushed and applied, with the clock in PostgreSQL's epoch."""
    data = b"w" + struct.pack(">QQq", 90, 90, 1) + b"B" + struct.pack(">QqI", 100, 5, 7)
    assert data[0] == rp.XLOG_DATA
    assert po.parse(data, rp.XLOG_DATA_HEADER) == po.Begin(100, 5, 7)
    with pytest.raises(po.ProtocolError):
        po.parse(data[:rp.XLOG_DATA_HEADER], rp.XLOG_DATA_HEADER)
    keepalive = b"k" + struct.pack(">Qq", 2**40 + 8, 123) + b"\x01"
    assert keepalive[0] != rp.XLOG_DATA
    assert rp.parse_keepalive(keepalive) == rp.Keepalive(2**40 + 8, True)
    assert rp.parse_keepalive(keepalive[:-1] + b"\x00") == rp.Keepalive(2**40 + 8, False)
    with pytest.raises(po.ProtocolError):
        rp.parse_keepalive(keepalive[:-1])
    with pytest.raises(po.ProtocolError):
        rp.parse_keepalive(data)
    now_us = po.PG_EPOCH_US + 5_000_000
    status = rp.standby_status(confirmed=2**33 + 1, now_us=now_us)
    assert status == b"r" + struct.pack(">QQQqB", 2**33 + 1, 2**33 + 1, 2**33 + 1,
                                        5_000_000, 0)
    assert rp.standby_status(confirmed=0, now_us=now_us, reply=True)[-1] == 1


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_lsn_text_round_trips(lsn: int) -> None:
    assert po.parse_lsn(po.lsn_text(lsn)) == lsn


def test_numeric_mapping() -> None:
    assert numeric_modifier(-1) is None
    assert numeric_modifier((12 << 16 | 2) + 4) == (12, 2)
    assert canonical_type(NUMERIC, (12 << 16 | 2) + 4) == "DECIMAL(12,2)"
    assert canonical_type(NUMERIC, -1) == "STRING"  # unconstrained: exact text, NaN kept
    assert canonical_type(NUMERIC, (50 << 16 | 2) + 4) == "STRING"  # wider than DECIMAL
    assert canonical_type(NUMERIC, (5 << 16 | 0x7FE) + 4) == "STRING"  # negative scale
    assert source_type_name(NUMERIC, (12 << 16 | 2) + 4) == "numeric(12,2)"
    with pytest.raises(SourceError, match="NaN or infinity"):
        converter("DECIMAL(12,2)")("NaN")  # type: ignore[misc]


def test_converters() -> None:
    assert converter("BOOLEAN")("t") is True  # type: ignore[misc]
    assert converter("BINARY")("\\x00ff") == b"\x00\xff"  # type: ignore[misc]
    assert converter("DOUBLE")("-Infinity") == float("-inf")  # type: ignore[misc]
    assert converter("DECIMAL(5,2)")("-1.50") == Decimal("-1.50")  # type: ignore[misc]
    assert converter("TIMESTAMP")("2024-01-02 01:04:05.5+00") == \
        dt.datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=dt.UTC)  # type: ignore[misc]
    assert converter("TIMESTAMP_NTZ")("2024-01-02 01:04:05") == \
        dt.datetime(2024, 1, 2, 1, 4, 5)  # type: ignore[misc]
    with pytest.raises(SourceError):
        converter("DATE")("infinity")  # type: ignore[misc]
    assert converter("STRING") is None


@given(st.text())
def test_string_literals_are_letters_digits_and_unicode_escapes(value: str) -> None:
    """Nothing in the literal's body can end it (no quote, no bare backslash pair), and
    PostgreSQL's reading of its escapes gives the value back. Only a value PostgreSQL
    cannot hold (a NUL, a lone surrogate) is refused."""
    if "\x00" in value or any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        with pytest.raises(ConfigError):
            literal(value)
        return
    rendered = literal(value)
    assert rendered.startswith("U&'") and rendered.endswith("'")
    body = rendered[3:-1]
    assert re.fullmatch(r"(?:[A-Za-z0-9]|\\[0-9A-F]{4}|\\\+[0-9A-F]{6})*", body), body
    decoded = re.sub(r"\\\+([0-9A-F]{6})|\\([0-9A-F]{4})",
                     lambda m: chr(int(m.group(1) or m.group(2), 16)), body)
    assert decoded == value


def test_a_chunk_select_has_a_limit_unless_planned() -> None:
    from dblog.core.events import TableId
    from dblog.sources.base import ChunkSpec, Column, TableSchema
    from dblog.sources.postgres.snapshot import build_chunk_sql

    table = TableId("public", "t")
    schema = TableSchema(table, (Column("a", "INT", False, "integer"),), ("a",))
    limited = build_chunk_sql(ChunkSpec(table, 7, after_key=(1,)), schema)
    assert limited.endswith(' ORDER BY "public"."t"."a" LIMIT 7')
    planned = build_chunk_sql(ChunkSpec(table, None, after_key=(1,), upper_key=(9,)), schema)
    assert planned.endswith(' ORDER BY "public"."t"."a"') and "LIMIT" not in planned


def test_identifiers_are_quoted() -> None:
    assert quote_ident('a "b"') == '"a ""b"""'
    with pytest.raises(ConfigError):
        quote_ident("")
    with pytest.raises(ConfigError):
        literal(float("nan"))


def _array_out(items: list[str | None]) -> str:
    """An array as PostgreSQL's ``array_out`` writes it (``utils/adt/arrayfuncs.c``)."""
    def element(item: str | None) -> str:
        if item is None:
            return "NULL"
        if (item == "" or item.upper() == "NULL"
                or any(c in item for c in '{},"\\ \t\n\r\v\f')):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return item
    return "{" + ",".join(element(i) for i in items) + "}"


@given(st.lists(st.none() | st.text()))
def test_array_text_parses_back_to_its_elements(items: list[str | None]) -> None:
    assert parse_array(_array_out(items)) == items


def test_arrays_map_to_delta_arrays_of_their_element_type() -> None:
    assert canonical_type(1007, -1) == "ARRAY<INT>"
    numeric_62 = (6 << 16 | 2) + 4
    assert canonical_type(1231, numeric_62) == "ARRAY<DECIMAL(6,2)>"
    assert source_type_name(1231, numeric_62) == "numeric(6,2)[]"
    assert type_oid("numeric(6,2)[]") == 1231 and type_oid("timestamptz[]") == 1185
    assert canonical_type(1115, -1) == "ARRAY<TIMESTAMP_NTZ>"
    assert canonical_type(16400, -1) == "STRING"  # an enum's array: its text
    to_list = converter("ARRAY<DECIMAL(6,2)>")
    assert to_list is not None and to_list("{1.50,NULL,-2.00}") == \
        [Decimal("1.50"), None, Decimal("-2.00")]
    to_bytes = converter("ARRAY<BINARY>")
    assert to_bytes is not None and to_bytes('{"\\\\x00ff",NULL}') == [b"\x00\xff", None]
    to_text = converter("ARRAY<STRING>")
    assert to_text is not None and to_text('{"NULL",NULL,""}') == ["NULL", None, ""]


@pytest.mark.parametrize("text", ["{{1,2},{3,4}}", "[0:1]={1,2}", "[1:1][1:2]={{1,2}}"])
def test_arrays_the_lake_cannot_hold_are_refused_with_their_shape(text: str) -> None:
    to_list = converter("ARRAY<INT>")
    assert to_list is not None
    with pytest.raises(SourceError, match="one-dimensional arrays indexed from 1"):
        to_list(text)


@pytest.mark.parametrize("text", ["1,2", "{1,2", '{"a}', "{a,,b}", '{a"b}', "{a}b}"])
def test_malformed_array_text_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the reader adds table and column
        parse_array(text)
