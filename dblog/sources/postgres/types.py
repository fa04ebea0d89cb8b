"""PostgreSQL column types in the engine's canonical form.

A column is identified by its type OID and type modifier (``pg_attribute.atttypid`` /
``atttypmod``; the log's relation messages carry the same pair), so the catalog and the log
agree on every column without a catalog lookup while decoding.

=================================  ==================  =====================================
PostgreSQL                         canonical (Spark)   value
=================================  ==================  =====================================
boolean                            BOOLEAN
smallint / integer / bigint        SMALLINT/INT/BIGINT
real / double precision            FLOAT / DOUBLE      NaN and +-Infinity kept
numeric(p,s), p <= 38, 0 <= s <= p DECIMAL(p,s)        NaN/Infinity refused (DECIMAL cannot
                                                       hold them): the tailer stops and names
                                                       the row's column
numeric (unconstrained or wider)   STRING              the exact text, 'NaN' included
date                               DATE                infinity / BC dates refused
timestamp                          TIMESTAMP_NTZ       infinity / BC refused
timestamptz                        TIMESTAMP (UTC)     infinity / BC refused
bytea                              BINARY
interval                           STRING              ISO 8601 ('P1DT2H')
time, timetz                       STRING              '12:34:56.5', '12:34:56+02'
char(n)                            STRING              blank-padded, as stored
text, varchar, uuid, json, jsonb,  STRING              the server's text form
enums, anything else
an array of a type above           ARRAY<element>      one-dimensional, indexed from 1;
                                                       NULL elements kept; any other shape
                                                       is refused (the tailer or capture
                                                       stops and names the column)
an array of another type (enum[])  STRING              the server's text form ('{a,b}')
=================================  ==================  =====================================

Every connection (log and chunk selects) runs with :data:`SESSION_SETTINGS`, so text forms
are the same on both paths.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from dblog.core.errors import SourceError
from dblog.sources.base import element_type

SESSION_SETTINGS = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "bytea_output": "hex",
    "extra_float_digits": "3",
    "standard_conforming_strings": "on",
}
"""Settings of every session that reads values, so that text forms never vary."""

BOOL, BYTEA, CHAR, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP = 700, 701, 1042, 1043, 1082, 1083, 1114
TIMESTAMPTZ, INTERVAL, TIMETZ, NUMERIC, UUID, JSON, JSONB = 1184, 1186, 1266, 1700, 2950, 114, 3802

_NAMES = {
    BOOL: "boolean", BYTEA: "bytea", CHAR: '"char"', INT8: "bigint", INT2: "smallint",
    INT4: "integer", TEXT: "text", OID: "oid", FLOAT4: "real", FLOAT8: "double precision",
    BPCHAR: "character", VARCHAR: "character varying", DATE: "date", TIME: "time",
    TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamptz", INTERVAL: "interval",
    TIMETZ: "timetz", NUMERIC: "numeric", UUID: "uuid", JSON: "json", JSONB: "jsonb",
}
_SIMPLE = {BOOL: "BOOLEAN", BYTEA: "BINARY", INT2: "SMALLINT", INT4: "INT", INT8: "BIGINT",
           FLOAT4: "FLOAT", FLOAT8: "DOUBLE", DATE: "DATE", TIMESTAMP: "TIMESTAMP_NTZ",
           TIMESTAMPTZ: "TIMESTAMP"}
ARRAYS = {
    1000: BOOL, 1001: BYTEA, 1016: INT8, 1005: INT2, 1007: INT4, 1009: TEXT, 1021: FLOAT4,
    1022: FLOAT8, 1014: BPCHAR, 1015: VARCHAR, 1182: DATE, 1183: TIME, 1115: TIMESTAMP,
    1185: TIMESTAMPTZ, 1187: INTERVAL, 1270: TIMETZ, 1231: NUMERIC, 2951: UUID, 199: JSON,
    3807: JSONB,
}
"""Built-in array types (OID) captured as Delta arrays, and their element type (OID). A
column's type modifier applies to its elements (``numeric(6,2)[]``)."""
MAX_DECIMAL_PRECISION = 38
TEMPORAL = frozenset({"DATE", "TIMESTAMP", "TIMESTAMP_NTZ"})


def numeric_modifier(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a numeric type modifier, None when unconstrained."""
    if typmod < 4:
        return None
    packed = typmod - 4
    precision = (packed >> 16) & 0xFFFF
    scale = packed & 0x7FF
    if scale & 0x400:  # PostgreSQL 15 allows negative scales (11-bit two's complement)
        scale -= 0x800
    return precision, scale


def source_type_name(oid: int, typmod: int) -> str:
    """The column's source type as recorded in ``Column.source_type``: the name with its
    modifier, and the OID (``text-like oid 16385`` for types outside the table above)."""
    element = ARRAYS.get(oid)
    if element is not None:
        return source_type_name(element, typmod) + "[]"
    name = _NAMES.get(oid)
    if name is None:
        return f"text-like oid {oid}"
    if oid == NUMERIC:
        mod = numeric_modifier(typmod)
        return name if mod is None else f"numeric({mod[0]},{mod[1]})"
    if oid in (BPCHAR, VARCHAR) and typmod >= 4:
        return f"{name}({typmod - 4})"
    return name


def type_oid(source_type: str) -> int:
    """The OID a ``source_type_name`` names."""
    if source_type.startswith("text-like oid "):
        return int(source_type.rsplit(" ", 1)[1])
    if source_type.endswith("[]"):
        element = type_oid(source_type[:-2])
        return next(oid for oid, elem in ARRAYS.items() if elem == element)
    base = source_type.split("(")[0]
    for oid, name in _NAMES.items():
        if name == base:
            return oid
    raise ValueError(f"not a PostgreSQL source type name: {source_type!r}")


def canonical_type(oid: int, typmod: int) -> str:
    """The canonical (Spark DDL) type of a column."""
    element = ARRAYS.get(oid)
    if element is not None:
        return f"ARRAY<{canonical_type(element, typmod)}>"
    simple = _SIMPLE.get(oid)
    if simple is not None:
        return simple
    if oid == NUMERIC:
        mod = numeric_modifier(typmod)
        if mod is not None:
            precision, scale = mod
            if 0 < precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision:
                return f"DECIMAL({precision},{scale})"
    return "STRING"


Converter = Callable[[str], Any]


def _bool(text: str) -> bool:
    return text == "t"


def _bytes(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea not in hex form")
    return bytes.fromhex(text[2:])


def _refuse(text: str, what: str) -> SourceError:
    return SourceError(f"a {what} value {text!r} cannot be held by the lake's type")


def _decimal(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise _refuse(text, "numeric") from None
    if not value.is_finite():
        raise SourceError(
            f"a numeric value {text!r} (NaN or infinity) cannot be held by the lake's DECIMAL; "
            "make the column unconstrained numeric (captured as exact text) or replace the value"
        )
    return value


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise _refuse(text, "date") from None


def _timestamp(text: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise _refuse(text, "timestamp") from None


def _timestamptz(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise _refuse(text, "timestamptz") from None
    if value.tzinfo is None:  # a chunk select's projection: UTC already
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


_CONVERTERS: dict[str, Converter] = {
    "BOOLEAN": _bool, "BINARY": _bytes, "SMALLINT": int, "INT": int, "BIGINT": int,
    "FLOAT": float, "DOUBLE": float, "DATE": _date, "TIMESTAMP_NTZ": _timestamp,
    "TIMESTAMP": _timestamptz,
}


class ArrayShapeError(ValueError):
    """An array value the lake's one-dimensional ARRAY type cannot hold as it is."""


def parse_array(text: str) -> list[str | None]:
    """The elements of a one-dimensional array in PostgreSQL's output form (``{1,NULL,"a
    b"}``): element texts, None for NULL. ArrayShapeError for more dimensions or a lower
    bound other than 1 (``[0:1]={1,2}``); ValueError for malformed text."""
    if text.startswith("["):
        raise ArrayShapeError(f"an array with explicit bounds {text.split('=', 1)[0]}")
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not an array: {text[:40]!r}")
    body, i, n = text[1:-1], 0, len(text) - 2
    out: list[str | None] = []
    if n == 0:
        return []
    if body.startswith("{"):
        raise ArrayShapeError("a multi-dimensional array")
    while True:
        if i < n and body[i] == '"':
            chars: list[str] = []
            i += 1
            while i < n and body[i] != '"':
                if body[i] == "\\":
                    i += 1
                if i < n:
                    chars.append(body[i])
                    i += 1
            if i >= n:
                raise ValueError("an unterminated quoted array element")
            out.append("".join(chars))
            i += 1
        else:
            end = body.find(",", i)
            end = n if end < 0 else end
            word = body[i:end]
            if not word or any(c in word for c in '"{}'):
                raise ValueError(f"a malformed array element {word!r}")
            out.append(None if word == "NULL" else word)
            i = end
        if i == n:
            return out
        if body[i] != ",":
            raise ValueError(f"a malformed array after element {len(out)}")
        i += 1


def _array_converter(element: str) -> Converter:
    convert = converter(element)

    def to_list(text: str) -> list[Any]:
        try:
            items = parse_array(text)
        except ArrayShapeError as exc:
            raise SourceError(f"{exc} cannot be held by the lake's ARRAY<{element}>, which "
                              "holds one-dimensional arrays indexed from 1: store such "
                              "values in that form, or change the column's type") from None
        if convert is None:
            return items
        return [None if item is None else convert(item) for item in items]

    return to_list


def converter(spark_type: str) -> Converter | None:
    """Text (the server's output form) to the canonical Python value; None: keep the text."""
    element = element_type(spark_type)
    if element is not None:
        return _array_converter(element)
    if spark_type.startswith("DECIMAL("):
        return _decimal
    return _CONVERTERS.get(spark_type)


def projection(column_sql: str, source_type: str, spark_type: str) -> str:
    """The chunk-select expression whose JDBC value casts to the canonical value exactly as
    the log's text converts: text forms for temporal types and text-like columns; an
    array's elements each so (as a ``text[]``), and a clear error from the server for an
    array the lake cannot hold (:func:`parse_array`)."""
    element = element_type(spark_type)
    if element is not None:
        return _array_projection(column_sql, source_type, element)
    if spark_type == "TIMESTAMP":
        return (f"to_char({column_sql} AT TIME ZONE 'UTC', "
                "'YYYY-MM-DD HH24:MI:SS.US')")
    if spark_type == "TIMESTAMP_NTZ":
        return f"to_char({column_sql}, 'YYYY-MM-DD HH24:MI:SS.US')"
    if spark_type == "DATE":
        return f"to_char({column_sql}, 'YYYY-MM-DD')"
    if spark_type == "STRING":
        if source_type.startswith("character(") or source_type == "character":
            return f"bpcharout({column_sql})::text"  # keeps the padding, as the log does
        return f"{column_sql}::text"
    return column_sql


def _array_projection(column_sql: str, source_type: str, element: str) -> str:
    element_sql = projection("_dblog_e", source_type[:-2], element)
    if element == "BINARY":
        element_sql = "encode(_dblog_e, 'hex')"  # unhexed by the chunk's cast
    elif "::text" not in element_sql and "to_char" not in element_sql:
        element_sql = f"{element_sql}::text"
    # A value the lake cannot hold fails the select with the column named: the cast of
    # this message to integer cannot succeed, and names the value (its first 60 chars).
    refusal = (f"ARRAY[('dblog: column ' || {sql_string(column_sql)} || ' holds an array "
               "that is not one-dimensional from index 1; the lake''s ARRAY holds only "
               f"those: ' || left({column_sql}::text, 60))::int::text]")
    return (f"CASE WHEN {column_sql} IS NULL THEN NULL"  # noqa: S608 - quoted identifiers only
            f" WHEN array_ndims({column_sql}) > 1 OR array_lower({column_sql}, 1) <> 1"
            f" THEN {refusal}"
            f" ELSE ARRAY(SELECT {element_sql} FROM unnest({column_sql})"
            " WITH ORDINALITY AS _dblog_a(_dblog_e, _dblog_n) ORDER BY _dblog_n) END")


def sql_string(text: str) -> str:
    """``text`` as a standard SQL string literal (single quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def spark_orders_like_source(oid: int, typmod: int, collation: str | None) -> bool:
    """Whether Spark orders the canonical values of a key column as PostgreSQL's btree
    orders the column: integers, DECIMAL numerics, booleans, dates and timestamps, bytea,
    uuid (lower-case hex text), and text or varchar only under the ``C``/``POSIX``
    collation (byte order, which for UTF-8 is Spark's code-point order)."""
    if oid in (BOOL, INT2, INT4, INT8, DATE, TIMESTAMP, TIMESTAMPTZ, BYTEA, UUID):
        return True
    if oid == NUMERIC:
        return canonical_type(oid, typmod).startswith("DECIMAL(")
    if oid in (TEXT, VARCHAR):
        return collation in ("C", "POSIX", "C.UTF-8", "C.utf8", "ucs_basic")
    return False
