"""Pure primary-key range planning for chunked table capture.

Bounds convention: a :class:`KeyRange` is the half-open interval
``(lower, upper]`` -- ``lower`` EXCLUSIVE, ``upper`` INCLUSIVE -- and ``None``
means unbounded on that side. The same convention is used for chunks: a chunk
query asks for keys ``> last_key`` (the last key of the previous chunk, or the
range's ``lower``) and ``<= range_end``, ordered by key, with a ``LIMIT``.

Keys are tuples compared lexicographically, which matches SQL row-value
ordering for non-NULL values. Primary-key components are never NULL, so range
functions reject ``None`` components; :func:`key_order` gives a total order
that tolerates ``None`` for sorting only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dblog.core.errors import ConfigError
from dblog.core.events import Key

__all__ = [
    "ChunkOutcome",
    "KeyRange",
    "chunk_outcome",
    "contains",
    "key_order",
    "next_chunk_predicate",
    "next_chunk_rows",
    "plan_chunk_reads",
    "plan_ranges",
    "planned_outcome",
    "split_sizes",
]


def key_order(key: Key) -> tuple[tuple[bool, Any], ...]:
    """Sort key giving a total order over keys that may contain ``None``.

    Each component ``v`` maps to ``(v is not None, v)``: ``None`` sorts before
    every value of its position (like MySQL ``NULLS FIRST``; PostgreSQL sorts
    NULLs last, so do not rely on NULL placement matching the database) and is
    never compared with a value. Non-``None`` components of one position must
    be mutually comparable (ints, or strs, ...), else ``TypeError``.
    """
    return tuple((v is not None, v) for v in key)


def _check_key(key: Key, what: str) -> None:
    if any(v is None for v in key):
        raise ValueError(f"{what} must not contain None (NULL): {key!r}")


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Keys ``k`` with ``lower < k <= upper``; ``None`` bounds are unbounded."""

    lower: Key | None = None
    upper: Key | None = None

    def __post_init__(self) -> None:
        if self.lower is not None:
            _check_key(self.lower, "lower bound")
        if self.upper is not None:
            _check_key(self.upper, "upper bound")
        if self.lower is not None and self.upper is not None and not self.lower < self.upper:
            raise ValueError(f"empty key range: ({self.lower!r}, {self.upper!r}]")

    def contains(self, key: Key) -> bool:
        """Whether ``lower < key <= upper``."""
        return contains(self, key)


def contains(key_range: KeyRange, key: Key) -> bool:
    """Whether ``key`` lies in ``key_range`` (``lower`` exclusive, ``upper`` inclusive)."""
    _check_key(key, "key")
    if key_range.lower is not None and not key > key_range.lower:
        return False
    return key_range.upper is None or key <= key_range.upper


def plan_ranges(sorted_boundary_keys: Sequence[Key]) -> list[KeyRange]:
    """Split the whole key space at strictly increasing boundary keys.

    ``[b1, ..., bn]`` gives ``(None, b1], (b1, b2], ..., (bn-1, bn], (bn, None)``:
    the ranges are disjoint, contiguous, cover every key, and the last is
    open-ended so rows inserted above ``bn`` are still captured. No boundaries
    give the single range ``(None, None)``.
    """
    ranges: list[KeyRange] = []
    previous: Key | None = None
    for boundary in sorted_boundary_keys:
        _check_key(boundary, "boundary key")
        if previous is not None and not previous < boundary:
            raise ValueError(f"boundary keys not strictly increasing: {previous!r}, {boundary!r}")
        ranges.append(KeyRange(previous, boundary))
        previous = boundary
    ranges.append(KeyRange(previous, None))
    return ranges


def _expand(
    columns: Sequence[str], key: Key, last_op: str, leading_op: str, placeholder: str
) -> tuple[str, list[Any]]:
    """Row-value-free ``(c1, .., cn) <last_op> key`` for ``last_op`` ``>`` or ``<=``.

    ``(c1 > ?) OR (c1 = ? AND c2 > ?) OR ...``; the strict operator applies to
    all but the last column. For composite keys a redundant ``c1 >= ?`` (or
    ``c1 <= ?``) conjunct is prepended so both MySQL and PostgreSQL can use an
    index range scan on the leading key column.
    """
    if len(columns) != len(key):
        raise ValueError(f"key {key!r} does not match {len(columns)} key columns")
    _check_key(key, "key")
    strict = last_op[0]  # '>' from '>', '<' from '<='
    disjuncts: list[str] = []
    params: list[Any] = []
    for i in range(len(columns)):
        terms = [f"{columns[j]} = {placeholder}" for j in range(i)]
        op = last_op if i == len(columns) - 1 else strict
        terms.append(f"{columns[i]} {op} {placeholder}")
        disjuncts.append("(" + " AND ".join(terms) + ")")
        params.extend(key[: i + 1])
    sql = " OR ".join(disjuncts)
    if len(columns) > 1:
        sql = f"{columns[0]} {leading_op} {placeholder} AND ({sql})"
        params.insert(0, key[0])
    return f"({sql})", params


def next_chunk_predicate(
    key_columns: Sequence[str],
    last_key: Key | None,
    range_end: Key | None,
    *,
    quote_ident: Callable[[str], str],
    placeholder: str = "%s",
) -> tuple[str, list[Any]]:
    """SQL ``WHERE`` predicate and params for keys in ``(last_key, range_end]``.

    ``last_key`` is the previous chunk's last key (or the range's ``lower``);
    ``None`` on either side drops that bound (``"1 = 1"`` if both are None).
    Identifiers go through ``quote_ident``; values are only ever passed as
    ``placeholder`` parameters (``%s`` suits PyMySQL and psycopg). Composite
    keys are expanded without row-value comparison, e.g. for ``(a, b) > (x, y)``:
    ``(a >= %s AND ((a > %s) OR (a = %s AND b > %s)))`` with ``[x, x, x, y]``.
    """
    if not key_columns:
        raise ValueError("at least one key column is required")
    columns = [quote_ident(c) for c in key_columns]
    parts: list[str] = []
    params: list[Any] = []
    if last_key is not None:
        sql, p = _expand(columns, last_key, ">", ">=", placeholder)
        parts.append(sql)
        params.extend(p)
    if range_end is not None:
        sql, p = _expand(columns, range_end, "<=", "<=", placeholder)
        parts.append(sql)
        params.extend(p)
    if not parts:
        return "1 = 1", []
    return " AND ".join(parts), params


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What one chunk select means for its range.

    ``final``: the range is finished with this chunk. ``delete_range``: the key range
    ``(after, through]`` the select read completely (``None`` on a side = open), so keys of it
    the select did not return no longer existed when it ran; ``None`` when the capture
    filters rows (a ``keys`` list or a ``where``), which says nothing about absent keys.
    Bounds are keys in the database's order (collation, ENUM/SET, ...), not Python's.
    """

    final: bool
    delete_range: tuple[Key | None, Key | None] | None


def chunk_outcome(
    *,
    after: Key | None,
    upper: Key | None,
    rows: int,
    limit: int,
    last: Key | None,
    filtered: bool,
    ends_range: bool = False,
) -> ChunkOutcome:
    """The outcome of a chunk select of ``(after, upper] ORDER BY key LIMIT limit``.

    ``rows`` rows came back, the last (in the database's order) being ``last`` (``None``
    when none came back). A short chunk read its whole interval, up to ``upper``; a full one
    read up to ``last`` only. The chunk is final when it is short, when it reached the
    range's fixed upper bound (``last == upper``), or when the caller says it ``ends_range``
    (a range whose table held no key above ``after`` when its upper bound was fixed: one
    chunk, whatever it reads).
    """
    if limit <= 0 or not 0 <= rows <= limit:
        raise ValueError(f"impossible chunk: {rows} rows with limit {limit}")
    if (rows > 0) != (last is not None):
        raise ValueError(f"a chunk of {rows} rows must name its last key (got {last!r})")
    full = rows == limit
    final = not full or ends_range or (upper is not None and last == upper)
    through = last if full else upper
    return ChunkOutcome(final=final, delete_range=None if filtered else (after, through))


def planned_outcome(
    *, after: Key | None, upper: Key | None, end: Key | None, filtered: bool = False,
    ends_range: bool = False,
) -> ChunkOutcome:
    """The outcome of a chunk whose extent was planned before its select: it reads
    ``(after, end]`` completely, or ``(after, upper]`` when ``end`` is None (fewer rows than
    the chunk's size were left up to ``upper`` when it was planned).

    Such a chunk is read by several selects at once, one per key range; no ``LIMIT`` cuts
    it. It is final when it reads up to the range's end (``end`` None or equal to
    ``upper``) or when the caller says it ``ends_range``."""
    if end is not None:
        _check_key(end, "a chunk's planned end")
    final = end is None or ends_range or (upper is not None and end == upper)
    through = upper if end is None else end
    return ChunkOutcome(final=final, delete_range=None if filtered else (after, through))


def split_sizes(rows: int, parts: int) -> list[int]:
    """``rows`` spread over ``parts`` read partitions as evenly as whole rows allow
    (the first ones one larger), none empty; fewer parts for fewer rows."""
    if rows <= 0 or parts <= 0:
        raise ValueError(f"cannot split {rows} rows into {parts} parts")
    parts = min(parts, rows)
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def plan_chunk_reads(
    after: Key | None, upper: Key | None, rows: int, parts: int,
    key_after: Callable[[Key | None, int, Key | None], Key | None],
) -> list[Key | None]:
    """The bounds ``[after, k1, ..., end]`` of a chunk of ``rows`` rows above ``after``
    read by ``parts`` selects at once, over ``(after, k1], (k1, k2], ...``.

    ``key_after(lower, offset, upper)`` is the key at 0-based ``offset`` above ``lower``
    and at or below ``upper`` (None if there is none), in the database's order. The plan
    stops early when a bound reaches ``upper``, or finds none: then fewer rows were left,
    and the last select reads up to ``upper`` (``end`` is None)."""
    bounds: list[Key | None] = [after]
    for size in split_sizes(rows, parts):
        bound = key_after(bounds[-1], size - 1, upper)
        bounds.append(bound)
        if bound is None or bound == upper:
            break
    return bounds


MOST_GROWTH = 8.0
"""The most one chunk's size multiplies the next one's."""


def next_chunk_rows(rows_asked: int, rows_read: int, seconds: float, *, first: int,
                    most: int, target_seconds: float) -> int:
    """How many rows the next chunk of a range asks for, sized by rows and time.

    A chunk that came back full in under half ``target_seconds`` grows the next one toward
    the target at its pace: ``target / seconds`` times, at least twice and at most
    :data:`MOST_GROWTH` times (up to ``most``). Its seconds include a chunk's fixed costs,
    so the next one tends to land under the target rather than over. One that took over
    twice the target halves it (never below ``first``, the configured size); a short chunk
    (the range is ending, or a filter) changes nothing. DBLog allows any amount of reading
    between a low and a high watermark, so the size is a matter of speed (fewer windows,
    commits and round trips, each with fixed costs) against window length.
    """
    asked = max(1, rows_asked)
    floor = max(1, min(first, most))
    if rows_read < asked or target_seconds <= 0:
        return max(floor, min(asked, most))
    if seconds < target_seconds / 2:
        growth = MOST_GROWTH if seconds <= 0 else min(MOST_GROWTH, target_seconds / seconds)
        return max(floor, min(int(asked * max(2.0, growth)), most))
    if seconds > target_seconds * 2:
        return max(floor, min(asked // 2, most))
    return max(floor, min(asked, most))


LITERAL_MARK = "\x00"
"""A parameter placeholder that cannot occur in a quoted identifier."""


def chunk_predicate_sql(
    key_columns: Sequence[str],
    last_key: Key | None,
    range_end: Key | None,
    *,
    quote_ident: Callable[[str], str],
    literal: Callable[[Any], str],
) -> str:
    """:func:`next_chunk_predicate` with its values rendered by ``literal`` (a dialect's
    safe-literal function), for SQL that cannot bind parameters (Spark JDBC's ``query``)."""
    sql, params = next_chunk_predicate(key_columns, last_key, range_end,
                                       quote_ident=quote_ident, placeholder=LITERAL_MARK)
    parts = sql.split(LITERAL_MARK)
    if len(parts) != len(params) + 1:
        raise AssertionError("placeholder count mismatch")
    out = [parts[0]]
    for value, tail in zip(params, parts[1:], strict=True):
        out += [literal(value), tail]
    return "".join(out)


def limit_sql(limit: int | None) -> str:
    """A chunk select's `` LIMIT n`` clause, or none for ``None`` (a chunk bounded by its
    planned keys alone); ConfigError unless ``limit`` is a positive integer or None."""
    if limit is None:
        return ""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise ConfigError(f"chunk limit must be a positive integer, got {limit!r}")
    return f" LIMIT {int(limit)}"
