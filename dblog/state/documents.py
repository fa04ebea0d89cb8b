"""The typed state documents and their versioned JSON.

Every value is a JSON document ``{"schema": 1, ...}`` (UTF-8, sorted keys): :func:`encode`
adds the schema and :func:`decode` checks and removes it. Each read returns a document with
its znode version (:class:`Versioned`), to pass back for compare-and-set.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar, cast, get_args

from dblog.core.chunking import KeyRange
from dblog.core.errors import DblogError
from dblog.core.events import Key, Position, TableId, Window, key_from_json, key_to_json

SCHEMA_VERSION: Final = 1
ABSENT: Final = -1
"""``expected_version`` meaning "the znode must not exist yet" (create only)."""

MAX_DOC_BYTES: Final = 1_000_000  # ZooKeeper's default jute.maxbuffer is 1 MiB

WindowStatus = Literal["registered", "emitted", "aborted"]
CaptureStatus = Literal["running", "paused", "cancelled", "done"]
WINDOW_STATUSES: Final = frozenset(get_args(WindowStatus))
CAPTURE_STATUSES: Final = frozenset(get_args(CaptureStatus))

T = TypeVar("T")
Doc = dict[str, Any]


class StateSchemaError(DblogError):
    """A stored document is corrupt or written by a newer, unknown schema."""


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    """A stored value and the znode version to pass back for compare-and-set."""

    value: T
    version: int


@dataclass(frozen=True, slots=True)
class PositionState:
    """The log position after the last committed micro-batch."""

    position: Position
    source_position: Mapping[str, Any]
    """Source-native coordinate: ``{"file": ..., "pos": ...}`` or ``{"lsn": "0/16B3748"}``."""
    batch: int
    updated_at_ms: int = field(default_factory=lambda: now_ms())
    generation: str = ""
    """Names this line of batch numbers. A position created afresh (first start, a reset to
    the head, a new ZooKeeper root) gets a new generation, so its batch numbers never meet
    the idempotent-write versions an earlier line left in the lake (see ``txn_app_id``)."""
    commit_ts_ms: int | None = None
    """Source commit time of the last transaction in the committed batches (lag in time)."""

    def txn_app_id(self, source: str) -> str:
        """Delta's idempotent-write application id for this line of batches."""
        return f"dblog:{source}" + (f":{self.generation}" if self.generation else "")

    def to_json(self) -> Doc:
        return {
            "position": self.position.to_json(),
            "source_position": dict(self.source_position),
            "batch": self.batch,
            "updated_at_ms": self.updated_at_ms,
            "generation": self.generation,
            "commit_ts_ms": self.commit_ts_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PositionState:
        ts = d.get("commit_ts_ms")
        return cls(
            Position.from_json(d["position"]),
            dict(d["source_position"]),
            int(d["batch"]),
            int(d["updated_at_ms"]),
            str(d.get("generation", "")),
            int(ts) if ts is not None else None,
        )


@dataclass(frozen=True, slots=True)
class BatchIntent:
    """Write-ahead record of the micro-batch being written (``start``/``end`` are positions)."""

    batch: int
    start: Mapping[str, Any]
    end: Mapping[str, Any]
    created_at_ms: int = field(default_factory=lambda: now_ms())
    windows: Mapping[str, str] = field(default_factory=dict)
    """Window id -> ``emitted``/``aborted``: the outcomes the batch holds (a replay must
    rebuild exactly these)."""
    attempts: tuple[str, ...] = ()
    """The write attempts at this batch so far, oldest first (each tags the changelog rows
    it writes; a replay fences the earlier ones off). Empty in an intent recorded by a
    version without write attempts."""

    def to_json(self) -> Doc:
        return {
            "batch": self.batch,
            "start": dict(self.start),
            "end": dict(self.end),
            "created_at_ms": self.created_at_ms,
            "windows": dict(self.windows),
            "attempts": list(self.attempts),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BatchIntent:
        return cls(int(d["batch"]), dict(d["start"]), dict(d["end"]), int(d["created_at_ms"]),
                   {str(k): str(v) for k, v in dict(d.get("windows") or {}).items()},
                   tuple(str(a) for a in d.get("attempts") or ()))


@dataclass(frozen=True, slots=True)
class WindowState:
    """A registered watermark window and its outcome."""

    window: Window
    status: WindowStatus = "registered"
    detail: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    created_at_ms: int = field(default_factory=lambda: now_ms())
    updated_at_ms: int = field(default_factory=lambda: now_ms())

    def to_json(self) -> Doc:
        w = self.window
        return {
            "window_id": w.window_id,
            "table": [w.table.database, w.table.table],
            "low": w.low,
            "high": w.high,
            "meta": dict(w.meta),
            "status": self.status,
            "detail": self.detail,
            "extra": dict(self.extra),
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WindowState:
        window = Window(d["window_id"], TableId(*d["table"]), d["low"], d["high"], dict(d["meta"]))
        return cls(
            window,
            check_status(d["status"], WINDOW_STATUSES, "window"),
            d["detail"],
            dict(d["extra"]),
            int(d["created_at_ms"]),
            int(d["updated_at_ms"]),
        )


@dataclass(frozen=True, slots=True)
class CaptureState:
    """A capture (snapshot) request: which tables, how to split/filter them, and its status."""

    capture_id: str
    tables: tuple[TableId, ...]
    spec: Mapping[str, Any] = field(default_factory=dict)
    """Filter / key-column specification, opaque to the store."""
    status: CaptureStatus = "running"
    created_at_ms: int = field(default_factory=lambda: now_ms())
    updated_at_ms: int = field(default_factory=lambda: now_ms())

    def to_json(self) -> Doc:
        return {
            "capture_id": self.capture_id,
            "tables": [[t.database, t.table] for t in self.tables],
            "spec": dict(self.spec),
            "status": self.status,
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaptureState:
        return cls(
            d["capture_id"],
            tuple(TableId(*t) for t in d["tables"]),
            dict(d["spec"]),
            check_status(d["status"], CAPTURE_STATUSES, "capture"),
            int(d["created_at_ms"]),
            int(d["updated_at_ms"]),
        )


@dataclass(frozen=True, slots=True)
class RangeProgress:
    """Progress of one key range ``(lower, upper]`` of a capture (see
    :mod:`dblog.core.chunking`)."""

    table: TableId
    lower: Key | None = None
    upper: Key | None = None
    last_emitted_key: Key | None = None
    chunks_emitted: int = 0
    rows_emitted: int = 0
    rows_dropped: int = 0
    done: bool = False
    rows_deleted: int = 0
    """Mirror rows the chunks proved gone from the source (emitted as deletes)."""

    @property
    def key_range(self) -> KeyRange:
        return KeyRange(self.lower, self.upper)

    def to_json(self) -> Doc:
        return {
            "table": [self.table.database, self.table.table],
            "lower": _key_json(self.lower),
            "upper": _key_json(self.upper),
            "last_emitted_key": _key_json(self.last_emitted_key),
            "chunks_emitted": self.chunks_emitted,
            "rows_emitted": self.rows_emitted,
            "rows_dropped": self.rows_dropped,
            "done": self.done,
            "rows_deleted": self.rows_deleted,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RangeProgress:
        return cls(
            TableId(*d["table"]),
            _key_from(d["lower"]),
            _key_from(d["upper"]),
            _key_from(d["last_emitted_key"]),
            int(d["chunks_emitted"]),
            int(d["rows_emitted"]),
            int(d["rows_dropped"]),
            bool(d["done"]),
            int(d.get("rows_deleted", 0)),
        )


@dataclass(frozen=True, slots=True)
class RangeUpdate:
    """A range-progress write inside :meth:`StateStore.commit_batch`.

    ``expected_version`` is the version last read, or :data:`ABSENT` to create the range.
    """

    capture_id: str
    range_id: str
    progress: RangeProgress
    expected_version: int


@dataclass(frozen=True, slots=True)
class WindowUpdate:
    """A window closed in a batch; ``expected_version`` ``None`` = the version read at commit."""

    window_id: str
    status: WindowStatus
    detail: str | None = None
    expected_version: int | None = None
    extra: Mapping[str, Any] | None = None
    """Keys merged into the window's ``extra`` (e.g. where its low watermark was seen)."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """New znode versions after :meth:`StateStore.commit_batch`."""

    position_version: int
    range_versions: Mapping[tuple[str, str], int]
    window_versions: Mapping[str, int]



def now_ms() -> int:
    """Wall-clock milliseconds, the documents' timestamps."""
    return time.time_ns() // 1_000_000


def check_status(status: str, allowed: frozenset[str], what: str) -> Any:
    """``status`` if it is one of ``allowed``; ValueError otherwise."""
    if status not in allowed:
        raise ValueError(f"unknown {what} status {status!r}; expected one of {sorted(allowed)}")
    return status


def _key_json(key: Key | None) -> list[Any] | None:
    return key_to_json(key)


def _key_from(value: Any) -> Key | None:
    return key_from_json(value)


def encode(value: Mapping[str, Any], path: str) -> bytes:
    """The stored bytes of document ``value`` (``path`` names it in errors)."""
    doc = {**value, "schema": SCHEMA_VERSION}
    try:
        text = json.dumps(doc, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"state document for {path} is not plain JSON: {exc}") from None
    data = text.encode("utf-8")
    if len(data) > MAX_DOC_BYTES:
        raise DblogError(f"state document for {path} is {len(data)} bytes, over ZooKeeper's 1 MB")
    return data


def decode(data: bytes, path: str) -> Doc:
    """The document stored as ``data`` at ``path``, its ``schema`` checked and removed."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise StateSchemaError(f"state at {path} is not a UTF-8 JSON document") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), int):
        raise StateSchemaError(f"state at {path} lacks an integer 'schema' field")
    schema = doc.pop("schema")
    if schema > SCHEMA_VERSION:
        raise StateSchemaError(
            f"state at {path} has schema {schema}, newer than the supported {SCHEMA_VERSION}; "
            "upgrade dblog-delta"
        )
    return cast(Doc, doc)

