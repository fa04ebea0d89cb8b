"""Pure helpers of the lake's writes: typed key literals and key predicates.

No value goes through the host's local time (see :func:`literal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import reduce
from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dblog.core.chunking import KeyRange
from dblog.core.events import Key, Op
from dblog.lake.types import WINDOW_COLUMN, coerce, quote_ident


def literal(value: Any, dtype: T.DataType) -> SparkColumn:
    """A key value as a typed Spark literal; no value goes through the host's local time.

    TIMESTAMP_NTZ: from its text. TIMESTAMP: from epoch microseconds, given as such (a
    survey's bound, :func:`dblog.lake.survey.spanned`) or from a time-zone-aware datetime
    (the engine's canonical form); a naive one would be read as local time, and is
    refused."""
    value = coerce(value, dtype)
    if isinstance(dtype, T.TimestampNTZType) and isinstance(value, datetime):
        return F.lit(value.isoformat(sep=" ")).cast(dtype)
    if isinstance(dtype, T.TimestampType) and value is not None:
        return F.timestamp_micros(F.lit(epoch_micros(value)))
    return F.lit(value).cast(dtype)


def epoch_micros(value: Any) -> int:
    """A TIMESTAMP value (epoch microseconds, or an aware datetime) as epoch microseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, datetime) and value.tzinfo is not None:
        delta = value - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    raise ValueError(f"a TIMESTAMP bound needs an aware datetime or epoch microseconds, "
                     f"got {value!r}")


def between(column: SparkColumn, low: Any, high: Any, dtype: T.DataType) -> SparkColumn:
    """``low <= column <= high``, the bounds as typed literals (Delta's data skipping reads
    such a span from the files' statistics)."""
    return (column >= literal(low, dtype)) & (column <= literal(high, dtype))


def _compare(cols: Sequence[SparkColumn], bound: Key, types: Sequence[T.DataType],
             *, above: bool) -> SparkColumn:
    """Lexicographic ``cols > bound`` (``above``) or ``cols <= bound``, as SQL compares row
    values: ``(c1 > b1) OR (c1 = b1 AND c2 > b2) OR ...`` (the last term ``<=`` for below)."""
    terms: list[SparkColumn] = []
    for i, col in enumerate(cols):
        lit = literal(bound[i], types[i])
        prefix = [cols[j] == literal(bound[j], types[j]) for j in range(i)]
        last = i == len(cols) - 1
        step = (col > lit) if above else (col <= lit if last else col < lit)
        terms.append(reduce(SparkColumn.__and__, [*prefix, step]))
    return reduce(SparkColumn.__or__, terms)


def key_range_predicate(
    key: Sequence[str], key_range: KeyRange, types: Sequence[T.DataType]
) -> SparkColumn:
    """Rows whose key lies in ``(lower, upper]`` (see :mod:`dblog.core.chunking`)."""
    cols = [F.col(quote_ident(k)) for k in key]
    parts: list[SparkColumn] = [F.lit(True)]
    if key_range.lower is not None:
        parts.append(_compare(cols, key_range.lower, types, above=True))
    if key_range.upper is not None:
        parts.append(_compare(cols, key_range.upper, types, above=False))
    return reduce(SparkColumn.__and__, parts)


def maybe_in(key_range: KeyRange, key: Key) -> bool:
    """Whether ``key`` may lie in ``key_range`` (True when Python cannot tell)."""
    try:
        return key_range.contains(key)
    except (TypeError, ValueError):
        return True


def newer(s: str, t: str) -> str:
    """SQL: the row aliased ``s`` is newer by position than the row aliased ``t``."""
    return (
        f"({s}._dblog_lsn > {t}._dblog_lsn OR "
        f"({s}._dblog_lsn = {t}._dblog_lsn AND {s}._dblog_seq > {t}._dblog_seq))"
    )


def is_chunk_row() -> SparkColumn:
    """A changelog row a chunk emitted (``r`` with its window), not a log event."""
    return F.col(WINDOW_COLUMN).isNotNull() & (F.col("op") == Op.READ.value)


def commit_time(ms: int | None) -> datetime | None:
    """A source commit time (epoch milliseconds) as an aware datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)

