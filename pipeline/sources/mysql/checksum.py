"""Per-range row count and order-independent checksum computed on MariaDB/MySQL.

Only the aggregate leaves the database. Each row becomes a text that the lake side
(:mod:`pipeline.compare`) rebuilds identically from the mirror's canonical values: every
column (but FLOAT/DOUBLE, whose text forms differ between the engines) as ``N`` for NULL or
``V<length>:<text>``, joined by ``|``; the row's value is the first 15 hex digits of its MD5;
the range's checksum is the sum of the values (a repeated or missing row changes it).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.chunking import KeyRange
from pipeline.errors import ConfigError
from pipeline.sources.base import TableSchema
from pipeline.sources.checksum import checksum_columns
from pipeline.sources.mysql.snapshot import column_projection, key_bounds_sql
from pipeline.sources.mysql.sqltext import quote_table


def _text(expr: str, spark_type: str) -> str:
    """SQL text of a projected value, as :func:`pipeline.compare.row_text` renders it."""
    if spark_type == "BINARY":
        return f"HEX({expr})"
    if spark_type == "TIMESTAMP":
        return f"REPLACE({expr}, 'Z', '')"
    # DATE and DATETIME projections are already text; the rest prints as Spark prints it.
    return f"CONVERT(CAST({expr} AS CHAR) USING utf8mb4)"


def row_hash_sql(schema: TableSchema) -> str:
    """The SQL expression of one row's 60-bit hash."""
    return f"CAST(CONV(LEFT(MD5({row_text_sql(schema)}), 15), 16, 10) AS UNSIGNED)"


def row_text_sql(schema: TableSchema) -> str:
    """The SQL expression of the text a row's hash is taken of."""
    pieces = []
    for name in checksum_columns(schema):
        col = schema.column(name)
        projected = column_projection(col)
        text = _text(projected, col.spark_type)
        pieces.append(f"IF(({projected}) IS NULL, 'N', "
                      f"CONCAT('V', CHAR_LENGTH({text}), ':', {text}))")
    return f"CONCAT_WS('|', {', '.join(pieces)})" if pieces else "''"


def range_checksum_sql(schema: TableSchema, key_range: KeyRange) -> str:
    """``SELECT COUNT(*), SUM(row hash)`` of one key range."""
    if not schema.key:
        raise ConfigError(f"table {schema.table} has no primary key")
    return (f"SELECT COUNT(*), COALESCE(SUM({row_hash_sql(schema)}), 0) "  # noqa: S608 - quoted identifiers and validated literals only
            f"FROM {quote_table(schema.table)} WHERE "
            f"{key_bounds_sql(schema, key_range.lower, key_range.upper, 'key range') or '1 = 1'}")


def all_checksum_sql(schema: TableSchema, ranges: Sequence[KeyRange]) -> list[str]:
    return [range_checksum_sql(schema, r) for r in ranges]
