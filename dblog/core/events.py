"""Change events and log positions: immutable, ordered, serializable values.

A :class:`Position` is a point in a source's log. ``lsn`` is a totally ordered
int64 (MariaDB/MySQL: ``binlog_file_index << 32 | offset``; PostgreSQL: the
WAL LSN), ``seq`` orders events that share one ``lsn`` (the row index inside
one binlog rows event, or the chunk row index after a high watermark).
Positions compare as ``(lsn, seq)``.
"""

from __future__ import annotations

import base64
import datetime
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

Key = tuple[Any, ...]
"""A primary-key value: the key columns' values in key-column order."""

Row = Mapping[str, Any]


class Op(str, enum.Enum):  # noqa: UP042 - keep str()/format() of the shared contract
    """What happened to a row: create, update, delete, or read (a captured chunk row)."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"


MAX_OFFSET_BITS = 32


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """A totally ordered point in a source log (see module docstring)."""

    lsn: int
    seq: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.lsn < 2**63):
            raise ValueError(f"lsn out of int64 range: {self.lsn}")
        if self.seq < 0:
            raise ValueError(f"seq must be >= 0: {self.seq}")

    @classmethod
    def from_binlog(cls, file_index: int, offset: int, seq: int = 0) -> Position:
        """Encode a MariaDB/MySQL binlog coordinate (``mysql-bin.000042``, offset)."""
        if not (0 <= offset < 2**MAX_OFFSET_BITS):
            raise ValueError(f"binlog offset out of range: {offset}")
        return cls((file_index << MAX_OFFSET_BITS) | offset, seq)

    @property
    def binlog_file_index(self) -> int:
        return self.lsn >> MAX_OFFSET_BITS

    @property
    def binlog_offset(self) -> int:
        return self.lsn & ((1 << MAX_OFFSET_BITS) - 1)

    def to_json(self) -> dict[str, int]:
        return {"lsn": self.lsn, "seq": self.seq}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Position:
        return cls(int(data["lsn"]), int(data.get("seq", 0)))


@dataclass(frozen=True, slots=True)
class TableId:
    """A source table: database (schema) and name."""

    database: str
    table: str

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"

    @classmethod
    def parse(cls, text: str) -> TableId:
        database, sep, table = text.partition(".")
        if not sep or not database or not table:
            raise ValueError(f"expected DATABASE.TABLE, got {text!r}")
        return cls(database, table)


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One row change read from the log (or a chunk row, with ``op=READ``)."""

    table: TableId
    op: Op
    key: Key
    position: Position
    before: Row | None = None
    after: Row | None = None
    commit_ts_ms: int | None = None
    window_id: str | None = None

    def __post_init__(self) -> None:
        if self.op in (Op.CREATE, Op.READ) and self.after is None:
            raise ValueError(f"{self.op.name} event needs an after image")
        if self.op is Op.DELETE and self.before is None:
            raise ValueError("DELETE event needs a before image")
        if self.op is Op.UPDATE and self.after is None:
            raise ValueError("UPDATE event needs an after image")

    def to_json(self) -> dict[str, Any]:
        return {
            "table": [self.table.database, self.table.table],
            "op": self.op.value,
            "key": list(self.key),
            "position": self.position.to_json(),
            "before": dict(self.before) if self.before is not None else None,
            "after": dict(self.after) if self.after is not None else None,
            "commit_ts_ms": self.commit_ts_ms,
            "window_id": self.window_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChangeEvent:
        return cls(
            table=TableId(*data["table"]),
            op=Op(data["op"]),
            key=tuple(data["key"]),
            position=Position.from_json(data["position"]),
            before=data.get("before"),
            after=data.get("after"),
            commit_ts_ms=data.get("commit_ts_ms"),
            window_id=data.get("window_id"),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class WatermarkEvent:
    """A write to the watermark table, seen in the log at ``position``."""

    value: str
    position: Position
    commit_ts_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """A DBLog watermark window around one chunk select.

    ``low`` and ``high`` are the watermark values (fresh UUIDs) the capture
    writes before and after selecting the chunk of ``table``.
    """

    window_id: str
    table: TableId
    low: str
    high: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.low == self.high:
            raise ValueError("low and high watermark values must differ")


def seconds_since_commit(commit_ts_ms: int | None, now_s: float) -> float | None:
    """Seconds from a source commit at ``commit_ts_ms`` (epoch milliseconds, by the source's
    clock; None: unknown) to ``now_s`` (epoch seconds, by ours): the lag of a tailer whose
    last written transaction committed then. Negative when the source's clock is ahead."""
    return None if commit_ts_ms is None else now_s - commit_ts_ms / 1000


def _value_to_json(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"$f": repr(value)}
    if isinstance(value, Decimal):
        return {"$dec": str(value)}
    if isinstance(value, bytes | bytearray):
        return {"$b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime.datetime):
        return {"$ts": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    raise TypeError(f"cannot store a key value of type {type(value).__name__}")


def _value_from_json(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, text),) = value.items()
    decoders: dict[str, Any] = {
        "$f": float,
        "$dec": Decimal,
        "$b64": base64.b64decode,
        "$ts": datetime.datetime.fromisoformat,
        "$date": datetime.date.fromisoformat,
    }
    if tag not in decoders:
        raise ValueError(f"unknown key value tag {tag!r}")
    return decoders[tag](text)


def key_to_json(key: Key | None) -> list[Any] | None:
    """A primary key as JSON that keeps its types (DECIMAL, bytes, dates survive)."""
    return None if key is None else [_value_to_json(v) for v in key]


def key_from_json(data: Any) -> Key | None:
    """The inverse of :func:`key_to_json`."""
    return None if data is None else tuple(_value_from_json(v) for v in data)
