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
text, varchar, uuid, json, jsonb,  STRING              the server's text form ('{1,2}' for
enums, arrays, anything else                           an integer array)
=================================  ==================  =====================================

Every connection (log and chunk selects) runs with :data:`SESSION_SETTINGS`, so text forms
are the same on both paths.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from pipeline.errors import SourceError

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
    base = source_type.split("(")[0]
    for oid, name in _NAMES.items():
        if name == base:
            return oid
    raise ValueError(f"not a PostgreSQL source type name: {source_type!r}")


def canonical_type(oid: int, typmod: int) -> str:
    """The canonical (Spark DDL) type of a column."""
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


def converter(spark_type: str) -> Converter | None:
    """Text (the server's output form) to the canonical Python value; None: keep the text."""
    if spark_type.startswith("DECIMAL("):
        return _decimal
    return _CONVERTERS.get(spark_type)


def projection(column_sql: str, source_type: str, spark_type: str) -> str:
    """The chunk-select expression whose JDBC value casts to the canonical value exactly as
    the log's text converts: text forms for temporal types and text-like columns."""
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
