"""Primary-key ranges as stable, ordered names (Dagster partitions of ``full_state``).

A table's ranges are defined by their lower bounds ``L0 = None < L1 < L2 < ...``: range ``i``
holds the keys ``(Li, Li+1]`` and the last one is open above. A range's name carries its index
(zero-padded, so names sort in key order) and its lower bound as typed JSON, so it is
self-describing and never changes once planned; adding a range above the last one only bounds
the previous last range, whose capture fixed its upper bound when it ran anyway (rows inserted
above it later arrive through the log).

:func:`plan_more` extends a table's ranges as it grows: a new lower bound is the
``range_rows``-th key above the last one, added only when at least one key lies above it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dblog.core.chunking import KeyRange
from dblog.core.errors import ConfigError
from dblog.core.events import Key, key_from_json, key_to_json

INDEX_DIGITS = 6
_OPEN = "start"
_INVALID = ("...", "\a", "\b", "\f", "\n", "\r", "\t", "\v", "\0")
"""Substrings Dagster refuses in a partition key (JSON escapes the control characters)."""


@dataclass(frozen=True)
class NamedRange:
    """One planned range: its index, name and lower bound (exclusive; ``None``: the start)."""

    index: int
    lower: Key | None

    @property
    def name(self) -> str:
        return range_name(self.index, self.lower)


def range_name(index: int, lower: Key | None) -> str:
    """``000000:start``, ``000001:[100000]``, ``000002:["eu",17]``: sortable and stable."""
    if index < 0 or index >= 10**INDEX_DIGITS:
        raise ValueError(f"range index {index} out of bounds")
    bound = _OPEN if lower is None else json.dumps(
        key_to_json(lower), separators=(",", ":"), ensure_ascii=True)
    if "..." in bound:
        # Dots occur only inside JSON strings (numbers other than integers are tagged
        # strings): spelled as escapes they decode to the same key.
        bound = bound.replace(".", "\\u002e")
    name = f"{index:0{INDEX_DIGITS}d}:{bound}"
    assert not any(s in name for s in _INVALID), name
    return name


def parse_range_name(name: str) -> NamedRange:
    """The inverse of :func:`range_name` (a clear error for anything else)."""
    index_text, sep, bound = name.partition(":")
    if not sep or len(index_text) != INDEX_DIGITS or not index_text.isdigit():
        raise ConfigError(f"{name!r} is not a key range name (like 000001:[100000])")
    index = int(index_text)
    if bound == _OPEN:
        return NamedRange(index, None)
    try:
        data = json.loads(bound)
    except ValueError:
        raise ConfigError(f"{name!r}: its lower bound is not JSON") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{name!r}: its lower bound must be a non-empty JSON list")
    return NamedRange(index, key_from_json(data))


def key_ranges(names: Sequence[str], selected: Sequence[str]) -> dict[str, KeyRange]:
    """The key range of each ``selected`` name, given all of a table's range names.

    Range ``i`` ends at range ``i+1``'s lower bound; the last range is open above."""
    planned = sorted((parse_range_name(n) for n in names), key=lambda r: r.index)
    for expected, r in enumerate(planned):
        if r.index != expected:
            raise ConfigError(f"key ranges are not contiguous: range {expected} is missing "
                              f"(found {r.name})")
    by_name = {r.name: r for r in planned}
    out: dict[str, KeyRange] = {}
    for name in selected:
        if name not in by_name:
            raise ConfigError(f"{name!r} is not a planned range of this table")
        r = by_name[name]
        upper = planned[r.index + 1].lower if r.index + 1 < len(planned) else None
        out[name] = KeyRange(r.lower, upper)
    return out


def plan_more(
    existing: Sequence[str],
    key_after: Callable[[Key | None, int], Key | None],
    range_rows: int,
    *,
    most: int = 1000,
) -> list[str]:
    """Names of new ranges to add above ``existing`` (in key order; at most ``most``).

    ``key_after(lower, offset)`` is the key at 0-based ``offset`` above ``lower`` (in the
    database's key order), or ``None``. The first call on a new table plans range 0."""
    if range_rows <= 0:
        raise ValueError("range_rows must be positive")
    planned = sorted((parse_range_name(n) for n in existing), key=lambda r: r.index)
    new: list[str] = []
    if not planned:
        planned = [NamedRange(0, None)]
        new.append(planned[0].name)
    last = planned[-1]
    while len(new) < most:
        boundary = key_after(last.lower, range_rows - 1)
        if boundary is None or key_after(boundary, 0) is None:
            break
        last = NamedRange(last.index + 1, boundary)
        new.append(last.name)
    return new
