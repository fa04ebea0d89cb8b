"""What a capture and the tailer hand each other about a chunk (:mod:`dblog.state.handoff`
keeps them in ZooKeeper): the chunk's description, the tailer's pin, the capture's files.

Plain values with their JSON; nothing here reads or writes ZooKeeper, so the lake can
take them without depending on the state store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dblog.core.events import Key, TableId, key_from_json, key_to_json
from dblog.sources.base import Column, TableSchema

__all__ = ["ChunkDescription", "ChunkFiles", "ChunkPin", "columns_from_json",
           "columns_to_json"]


@dataclass(frozen=True, slots=True)
class ChunkPin:
    """The tailer's word at a window's high watermark: write the chunk's rows for this.

    Row ``i`` of the chunk in key order (dropped keys counted) takes position
    ``(lsn, seq + 1 + i)``; ``batch`` and ``attempt`` tag the rows as the tailer's own."""

    window_id: str
    batch: int
    attempt: str
    lsn: int
    seq: int
    commit_ts_ms: int | None
    dropped_keys: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class ChunkFiles:
    """A capture's changelog files for one pin: Delta ``add`` actions, uncommitted.

    ``table_id``: the changelog's identity when they were written (a table recreated at the
    path needs them written again); ``rows``: the rows they hold (the chunk minus its
    dropped keys); ``selected``: the rows the chunk select returned (the dropped keys
    included), which the chunk's positions number."""

    window_id: str
    batch: int
    attempt: str
    table_id: str
    actions: tuple[str, ...]
    rows: int
    selected: int

    def for_pin(self, pin: ChunkPin) -> bool:
        """Whether these are the files ``pin`` asked for."""
        return (self.batch, self.attempt) == (pin.batch, pin.attempt)


@dataclass(frozen=True, slots=True)
class ChunkDescription:
    """A capture's word about its chunk, written before the chunk's high watermark
    (``chunks/<window>``): where its range goes on, whether the range ends with it, the key
    range whose mirror rows it proves gone when it did not return them, and the columns it
    was selected with (the tailer makes the lake hold them before it pins the window)."""

    capture_id: str
    range_id: str
    last_key: Key | None
    """Where the range's next chunk starts."""
    final: bool
    """The range ends with this chunk."""
    delete_range: tuple[Key | None, Key | None] | None
    """``(after, through]`` read completely (None: a filtered chunk, which deletes none)."""
    schema: TableSchema | None
    """The chunk's columns and key (None: written by a version without them)."""

    def to_json(self) -> dict[str, object]:
        deletes = self.delete_range
        doc: dict[str, object] = {
            "last_key": key_to_json(self.last_key),
            "final": self.final,
            "capture_id": self.capture_id, "range_id": self.range_id,
            "delete_range": None if deletes is None else {
                "after": key_to_json(deletes[0]), "through": key_to_json(deletes[1]),
            },
        }
        if self.schema is not None:
            doc["columns"] = columns_to_json(self.schema)
            doc["key"] = list(self.schema.key)
        return doc

    @classmethod
    def from_json(cls, table: TableId, doc: Mapping[str, Any]) -> ChunkDescription:
        deletes = doc.get("delete_range")
        return cls(
            capture_id=str(doc.get("capture_id")), range_id=str(doc.get("range_id")),
            last_key=key_from_json(doc.get("last_key")), final=bool(doc.get("final")),
            delete_range=(key_from_json(deletes.get("after")),
                          key_from_json(deletes.get("through")))
            if isinstance(deletes, Mapping) else None,
            schema=columns_from_json(table, doc.get("key") or (), doc.get("columns")),
        )


def columns_to_json(schema: TableSchema) -> list[list[object]]:
    """A chunk's columns for its description (the tailer makes the lake hold them)."""
    return [[c.name, c.spark_type, c.nullable, c.source_type] for c in schema.columns]


def columns_from_json(table: TableId, key: Sequence[str], data: object) -> TableSchema | None:
    """The inverse of :func:`columns_to_json` (None: a description without columns)."""
    if not isinstance(data, list):
        return None
    columns = tuple(Column(str(c[0]), str(c[1]), bool(c[2]), str(c[3])) for c in data)
    return TableSchema(table, columns, tuple(key))
