"""Per-range row count and order-independent checksum computed on MariaDB/MySQL.

Only the aggregate leaves the database. Each row becomes a text that the lake side
(:mod:`dblog.app.compare`) rebuilds identically from the mirror's canonical values: every
column as ``N`` for NULL or ``V<length>:<text>``, joined by ``|`` (FLOAT and DOUBLE values
as the hex digits of their IEEE 754 bits, :mod:`dblog.sources.checksum`); the row's value
is the first 15 hex digits of its MD5; the range's checksum is the sum of the values (a
repeated or missing row changes it).
"""

from __future__ import annotations

from collections.abc import Sequence

from dblog.core.chunking import KeyRange
from dblog.core.errors import ConfigError
from dblog.sources.base import TableSchema
from dblog.sources.checksum import (
    FLOAT_TYPES,
    NEGATIVE_ZERO_BITS,
    POSITIVE_ZERO_BITS,
)
from dblog.sources.mysql.snapshot import column_projection, key_bounds_sql
from dblog.sources.mysql.sqltext import quote_table


def double_bits_sql(x: str) -> str:
    """The IEEE 754 bits of the DOUBLE ``x`` as 16 hex digits (``sources.checksum``).

    MariaDB has no bit cast, so the value is taken apart exactly: ``e0``, FLOOR(LOG2(|x|))
    clamped to the normal exponents [-1022, 1023], is the binary exponent or one off it, so
    ``m0`` = |x| / 2^e0 lies in [0.5, 4); one halving or doubling brings it into [1, 2), but
    for a subnormal (e0 = -1022, m0 < 1: exponent field 0). POW(2, n) of an integer n is
    exact, and so is every scaling by it here (no result leaves the normal range).
    MariaDB stores neither NaN nor infinities, and -0.0 as 0.0; a -0.0 (from an expression)
    still renders as its bits.
    """
    a = f"ABS({x})"
    e0 = f"LEAST(GREATEST(FLOOR(LOG2({a})), -1022), 1023)"
    m0 = f"({a} / POW(2, {e0}))"

    def bits(e: str, m: str, *, normal: bool) -> str:
        field = f"({e}) + 1023" if normal else f"(({e}) + 1023) * FLOOR({m})"
        fraction = f"({m}) - 1" if normal else f"({m}) - FLOOR({m})"
        return (f"CONCAT(LPAD(HEX(CAST(({x} < 0) * 2048 + {field} AS UNSIGNED)), 3, '0'), "
                f"LPAD(HEX(CAST(({fraction}) * 4503599627370496 AS UNSIGNED)), 13, '0'))")

    return (f"CASE WHEN {x} = 0 THEN IF(ATAN2({x}, -1) < 0, '{NEGATIVE_ZERO_BITS}', "
            f"'{POSITIVE_ZERO_BITS}')"
            f" WHEN {m0} >= 2 THEN {bits(f'{e0} + 1', f'{m0} / 2', normal=True)}"
            f" WHEN {m0} < 1 AND {e0} > -1022 THEN {bits(f'{e0} - 1', f'{m0} * 2', normal=True)}"
            f" ELSE {bits(e0, m0, normal=False)} END")


def _text(expr: str, spark_type: str) -> str:
    """SQL text of a projected value, as :func:`dblog.app.compare.row_text` renders it."""
    if spark_type in FLOAT_TYPES:  # a FLOAT's projection is already a DOUBLE
        return double_bits_sql(expr)
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
    for col in schema.columns:
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
