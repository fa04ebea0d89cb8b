"""Per-range row count and checksum computed on PostgreSQL, matching
:func:`dblog.app.compare.row_text` over the mirror (see ``sources/mysql/checksum.py`` for
the row text: ``N`` or ``V<length>:<text>`` per column, ``|``-joined, MD5's first 15 hex
digits summed). A real or double precision value (an array's elements too) is the hex of
its IEEE 754 bits, ``float8send`` of the value widened to double precision
(:mod:`dblog.sources.checksum`)."""

from __future__ import annotations

from collections.abc import Sequence

from dblog.core.chunking import KeyRange
from dblog.sources.base import TableSchema, element_type
from dblog.sources.checksum import FLOAT_TYPES, NAN_BITS
from dblog.sources.postgres.snapshot import key_bounds_sql
from dblog.sources.postgres.sqltext import quote_ident, quote_table


def _text(col_sql: str, spark_type: str, source_type: str) -> str:
    """SQL text of a value as Spark prints its canonical form (an array: its elements'
    texts, each ``N`` or ``V<length>:<text>``, ``,``-joined; ``compare.row_text``)."""
    element_spark = element_type(spark_type)
    if element_spark is not None:
        element = _text("_dblog_e", element_spark, source_type[:-2])
        piece = ("CASE WHEN _dblog_e IS NULL THEN 'N' ELSE "
                 f"'V' || char_length({element}) || ':' || {element} END")
        return (f"array_to_string(ARRAY(SELECT {piece} FROM unnest({col_sql}) WITH ORDINALITY"  # noqa: S608 - quoted identifiers only
                " AS _dblog_a(_dblog_e, _dblog_n) ORDER BY _dblog_n), ',')")
    if spark_type in FLOAT_TYPES:  # NaN = NaN in PostgreSQL, whatever the bits
        return (f"CASE WHEN {col_sql} = 'NaN' THEN '{NAN_BITS}' "
                f"ELSE upper(encode(float8send({col_sql}::float8), 'hex')) END")
    if spark_type == "BINARY":
        return f"upper(encode({col_sql}, 'hex'))"
    if spark_type == "TIMESTAMP":
        return f"to_char({col_sql} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
    if spark_type == "TIMESTAMP_NTZ":
        return f"to_char({col_sql}, 'YYYY-MM-DD HH24:MI:SS.US')"
    if spark_type == "DATE":
        return f"to_char({col_sql}, 'YYYY-MM-DD')"
    if spark_type == "STRING" and (source_type == "character"
                                   or source_type.startswith("character(")):
        return f"bpcharout({col_sql})::text"
    return f"{col_sql}::text"


def row_text_sql(schema: TableSchema) -> str:
    pieces = []
    for col in schema.columns:
        ref = quote_ident(col.name)
        text = _text(ref, col.spark_type, col.source_type)
        pieces.append(f"CASE WHEN {ref} IS NULL THEN 'N' ELSE "
                      f"'V' || char_length({text}) || ':' || {text} END")
    return f"concat_ws('|', {', '.join(pieces)})" if pieces else "''"


def row_hash_sql(schema: TableSchema) -> str:
    """A row's 60-bit hash: the first 15 hex digits of the MD5 of its text."""
    return (f"('x' || lpad(substr(md5({row_text_sql(schema)}), 1, 15), 16, '0'))"
            "::bit(64)::bigint")


def range_checksum_sql(schema: TableSchema, key_range: KeyRange) -> str:
    bounds = key_bounds_sql(schema, key_range.lower, key_range.upper, "key range")
    return (f"SELECT count(*), COALESCE(sum({row_hash_sql(schema)}), 0) "  # noqa: S608 - quoted identifiers and validated literals only
            f"FROM {quote_table(schema.table)} WHERE {bounds or 'TRUE'}")


def all_checksum_sql(schema: TableSchema, ranges: Sequence[KeyRange]) -> list[str]:
    return [range_checksum_sql(schema, r) for r in ranges]
