"""Foreign-key actions: rows InnoDB changes without logging them.

InnoDB applies ``ON DELETE``/``ON UPDATE`` ``CASCADE`` and ``SET NULL`` below the SQL layer:
the binlog holds the parent's row event and nothing for the child rows it deleted or
updated. The log does not say which child rows those were (they are rows the lake may never
have seen, such as rows inserted before the log's start), so they cannot be derived from it
alone: the binlog reader watches every table whose changes cascade into a tracked table, and
a parent row event that fires a cascading action is an unlogged change of every tracked
table it reaches (the child, and their children in turn), healed by a capture of the table.

``SET DEFAULT`` is accepted in a table's definition but InnoDB refuses the parent change it
would apply to (error 1451, as ``RESTRICT``), and ``RESTRICT`` and ``NO ACTION`` change no
rows: only ``CASCADE`` and ``SET NULL`` cascade.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql.cursors

from dblog.core.events import TableId

CASCADING = frozenset({"CASCADE", "SET NULL"})
"""Referential actions that change child rows."""

_FOREIGN_KEYS_SQL = (
    "SELECT rc.CONSTRAINT_SCHEMA, rc.TABLE_NAME, rc.CONSTRAINT_NAME, rc.UNIQUE_CONSTRAINT_SCHEMA,"
    " rc.REFERENCED_TABLE_NAME, rc.UPDATE_RULE, rc.DELETE_RULE, k.COLUMN_NAME,"
    " k.REFERENCED_COLUMN_NAME"
    " FROM information_schema.REFERENTIAL_CONSTRAINTS rc"
    " JOIN information_schema.KEY_COLUMN_USAGE k ON k.CONSTRAINT_SCHEMA = rc.CONSTRAINT_SCHEMA"
    " AND k.CONSTRAINT_NAME = rc.CONSTRAINT_NAME AND k.TABLE_NAME = rc.TABLE_NAME"
    " AND k.REFERENCED_TABLE_NAME IS NOT NULL"
    " WHERE rc.CONSTRAINT_SCHEMA = %s AND rc.TABLE_NAME = %s"
    " ORDER BY rc.CONSTRAINT_NAME, k.ORDINAL_POSITION"
)


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key of ``child`` referencing ``parent`` (columns in key order)."""

    name: str
    child: TableId
    parent: TableId
    child_columns: tuple[str, ...]
    parent_columns: tuple[str, ...]
    on_delete: str
    on_update: str

    @property
    def cascades(self) -> bool:
        """Whether a parent change can change child rows."""
        return self.on_delete in CASCADING or self.on_update in CASCADING


@dataclass(frozen=True)
class CascadeGraph:
    """The cascading foreign keys that reach tracked tables, by parent."""

    by_parent: Mapping[TableId, tuple[ForeignKey, ...]] = field(default_factory=dict)
    reaches: Mapping[TableId, frozenset[TableId]] = field(default_factory=dict)
    """Per child table: the tracked tables a change of its rows reaches (itself if
    tracked, and every tracked table below it through cascading keys)."""

    @property
    def parents(self) -> frozenset[TableId]:
        """The tables whose row events the binlog reader must watch."""
        return frozenset(self.by_parent)

    def affected(self, parent: TableId, kind: str, images: Sequence[Any]) -> frozenset[TableId]:
        """The tracked tables whose rows a ROWS event of ``parent`` may have changed by a
        cascade: ``kind`` ``d`` (images: the deleted rows), ``u`` ((before, after) pairs),
        ``w`` (inserts cascade nothing). An update cascades when a referenced column
        changed (or its value is not in the image)."""
        out: set[TableId] = set()
        for fk in self.by_parent.get(parent, ()):
            if kind == "d" and fk.on_delete in CASCADING:
                out |= self.reaches.get(fk.child, frozenset())
            elif kind == "u" and fk.on_update in CASCADING and any(
                    before.get(c) != after.get(c) or c not in before or c not in after
                    for before, after in images for c in fk.parent_columns):
                out |= self.reaches.get(fk.child, frozenset())
        return frozenset(out)

    @classmethod
    def build(cls, keys: Iterable[ForeignKey], tracked: Iterable[TableId]) -> CascadeGraph:
        """The graph of the cascading ``keys`` that reach a ``tracked`` table."""
        tracked = frozenset(tracked)
        cascading = [fk for fk in keys if fk.cascades]
        children: dict[TableId, set[TableId]] = {}
        for fk in cascading:
            children.setdefault(fk.parent, set()).add(fk.child)
        def reach(start: TableId) -> frozenset[TableId]:
            found: set[TableId] = set()
            stack, visited = [start], set()
            while stack:
                table = stack.pop()
                if table in visited:
                    continue
                visited.add(table)
                if table in tracked:
                    found.add(table)
                stack.extend(children.get(table, ()))
            return frozenset(found)

        by_parent: dict[TableId, list[ForeignKey]] = {}
        kept_reaches: dict[TableId, frozenset[TableId]] = {}
        for fk in cascading:
            below = reach(fk.child)
            if below:
                by_parent.setdefault(fk.parent, []).append(fk)
                kept_reaches[fk.child] = below
        return cls({p: tuple(fks) for p, fks in by_parent.items()}, kept_reaches)


def load_foreign_keys(conn: Any, tracked: Iterable[TableId]) -> list[ForeignKey]:
    """Every foreign key of the tracked tables and, through cascading keys, of the tables
    above them (a parent's parent whose cascades reach a tracked table in turn)."""
    keys: list[ForeignKey] = []
    seen: set[TableId] = set()
    todo = list(dict.fromkeys(tracked))
    while todo:
        table = todo.pop()
        if table in seen:
            continue
        seen.add(table)
        for fk in _foreign_keys_of(conn, table):
            keys.append(fk)
            if fk.cascades and fk.parent not in seen:
                todo.append(fk.parent)
    return keys


def _foreign_keys_of(conn: Any, child: TableId) -> list[ForeignKey]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(_FOREIGN_KEYS_SQL, (child.database, child.table))
        rows = cur.fetchall()
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(str(row["CONSTRAINT_NAME"]), []).append(row)
    keys = []
    for name, parts in grouped.items():
        first = parts[0]
        keys.append(ForeignKey(
            name, child,
            TableId(str(first["UNIQUE_CONSTRAINT_SCHEMA"]), str(first["REFERENCED_TABLE_NAME"])),
            tuple(str(p["COLUMN_NAME"]) for p in parts),
            tuple(str(p["REFERENCED_COLUMN_NAME"]) for p in parts),
            str(first["DELETE_RULE"]).upper(), str(first["UPDATE_RULE"]).upper()))
    return keys


def cascade_reason(parent: TableId, child_tables: Iterable[TableId], where: str) -> str:
    """What a cascading parent change means, and how to avoid the heal."""
    names = ", ".join(sorted(str(t) for t in child_tables))
    return (f"a change of {parent} at {where} fired a foreign key's ON DELETE/ON UPDATE "
            f"action, which InnoDB applies to {names} without row events; the child rows "
            "are captured again. To keep such changes in the log, have the application (or "
            "a trigger on the parent, whose changes are logged) change the child rows itself")
