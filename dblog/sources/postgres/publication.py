"""The publication a PostgreSQL source reads, and what dropping a table does to it.

PostgreSQL removes a dropped table from every publication without a word in the log, and a
table made again under the same name is a new relation that no publication holds. Without
care the mirror would keep the dropped table's rows and miss every change of the new one.

dblog records the relation (OID) of each configured table it publishes
(``<watermark_schema>.published_relation``). :func:`sync_publication` runs when the source
starts and, from the log reader, every few seconds; when a configured table's relation
changed, vanished or left the publication, it adds the table back (a publication dblog
manages) and inserts a row into ``<watermark_schema>.table_reset`` in the same transaction.
That row reaches the log at the exact point from which the table's changes are published
again; the reader turns it into a reset of the table: the lake table is emptied there
(as a MariaDB ``DROP TABLE`` does) and marked for repair, because the rows written between
the drop and that point are in no log. ``dblog capture`` of the table brings them.

Some changes of a table's rows are not logical changes at all: a partition attached
(its rows join the table), detached or dropped (they leave it), a partition truncated
(with ``publish_via_partition_root`` the log does not send a partition's TRUNCATE), a
column added with a default (existing rows take it without a row change), a table
rewritten (ALTER COLUMN ... TYPE). The same check records each table's *shape* (per
partition, or the table itself: its relation, its data file, the columns holding a
default they were added with) and, when it moved, inserts a row of kind ``heal``: the
reader turns it into an unlogged change of the table, which is healed by a capture.

Partitioned tables are published through their root (``publish_via_partition_root``):
their changes arrive as the root's, keyed and chunked on the root.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from dblog.core.errors import SourceError
from dblog.core.events import TableId
from dblog.sources.postgres.connection import PostgresSettings
from dblog.sources.postgres.sqltext import quote_ident, quote_table

log = logging.getLogger(__name__)

MANAGED = "managed by dblog: tables are added as the configuration lists them"
RELATIONS_TABLE = "published_relation"
RESETS_TABLE = "table_reset"


def bookkeeping_ddl(schema: str) -> list[str]:
    """The two bookkeeping tables (idempotent)."""
    qs = quote_ident(schema)
    return [
        f"CREATE TABLE IF NOT EXISTS {qs}.{RELATIONS_TABLE} (publication text NOT NULL,"
        " schema_name text NOT NULL, table_name text NOT NULL, relid oid,"
        " PRIMARY KEY (publication, schema_name, table_name))",
        f"CREATE TABLE IF NOT EXISTS {qs}.{RESETS_TABLE} (id bigserial PRIMARY KEY,"
        " publication text NOT NULL, schema_name text NOT NULL, table_name text NOT NULL,"
        " reason text NOT NULL, found_at timestamptz NOT NULL DEFAULT now())",
        f"ALTER TABLE {qs}.{RELATIONS_TABLE} ADD COLUMN IF NOT EXISTS shape text",
        f"ALTER TABLE {qs}.{RESETS_TABLE} ADD COLUMN IF NOT EXISTS kind text NOT NULL"
        " DEFAULT 'reset'",
    ]


def sync_publication(conn: Any, settings: PostgresSettings, tables: Sequence[TableId],
                     always: Sequence[TableId]) -> list[str]:
    """Create the publication if missing, keep ``tables`` (the configured ones) and
    ``always`` (dblog's own) in it, and write a reset for each configured table whose
    relation changed since it was recorded; returns what was reset, for the log.

    One transaction, serialized by a lock on the relations table, so two processes never
    write two resets for one drop. ``conn`` is an autocommit connection."""
    name = settings.publication_name
    relations = quote_table(TableId(settings.watermark_schema, RELATIONS_TABLE))
    resets = quote_table(TableId(settings.watermark_schema, RESETS_TABLE))
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(f"LOCK TABLE {relations} IN SHARE ROW EXCLUSIVE MODE")
            found = _publication(cur, name)
            current = _relation_ids(cur, [*tables, *always])
            shapes = _shapes(cur, tables)
            if found is None:
                listed = ", ".join(quote_table(t) for t in [*tables, *always])
                cur.execute(f"CREATE PUBLICATION {quote_ident(name)} FOR TABLE {listed}"
                            " WITH (publish_via_partition_root = true)")
                cur.execute(f"COMMENT ON PUBLICATION {quote_ident(name)} IS %s", (MANAGED,))
                for table in tables:
                    _record(cur, relations, name, table, current.get(table), shapes.get(table))
                cur.execute("COMMIT")
                return []
            comment, every_action, via_root = found
            if not via_root and _partitioned(cur, tables):
                if comment != MANAGED:
                    raise SourceError(
                        f"publication {name!r} on {settings.address} publishes partitioned "
                        f"tables through their partitions: run ALTER PUBLICATION "
                        f"{quote_ident(name)} SET (publish_via_partition_root = true)")
                cur.execute(f"ALTER PUBLICATION {quote_ident(name)}"
                            " SET (publish_via_partition_root = true)")
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables"
                        " WHERE pubname = %s", (name,))
            have = {TableId(str(s), str(t)) for s, t in cur.fetchall()}
            cur.execute(f"SELECT schema_name, table_name, relid, shape FROM {relations}"  # noqa: S608 - quoted
                        " WHERE publication = %s", (name,))
            rows = cur.fetchall()
            recorded = {TableId(str(s), str(t)): (None if r is None else int(r))
                        for s, t, r, _ in rows}
            recorded_shapes = {TableId(str(s), str(t)): shape for s, t, _, shape in rows}
            missing = [t for t in always if t not in have]
            done: list[str] = []
            for table in tables:
                relid = current.get(table)
                if table not in recorded:  # newly configured: its history starts now
                    if relid is not None:
                        if table not in have:
                            missing.append(table)
                        _record(cur, relations, name, table, relid, shapes.get(table))
                    continue
                before = recorded[table]
                if relid == before and (relid is None or table in have):
                    was, now = recorded_shapes.get(table), shapes.get(table)
                    if relid is not None and was != now:
                        if was is not None:  # (None: recorded before shapes were)
                            reason = _moved(table, was, now)
                            cur.execute(
                                f"INSERT INTO {resets} (publication, schema_name, table_name,"  # noqa: S608 - quoted
                                " reason, kind) VALUES (%s, %s, %s, %s, 'heal')",
                                (name, table.database, table.table, reason))
                            done.append(reason)
                        _record(cur, relations, name, table, relid, now)
                    continue
                reason = _reason(table, before, relid, name)
                if relid is not None and table not in have:
                    missing.append(table)
                cur.execute(f"INSERT INTO {resets} (publication, schema_name, table_name,"  # noqa: S608 - quoted
                            " reason) VALUES (%s, %s, %s, %s)",
                            (name, table.database, table.table, reason))
                _record(cur, relations, name, table, relid, shapes.get(table))
                done.append(reason)
            if missing and comment != MANAGED:
                raise SourceError(
                    f"publication {name!r} on {settings.address} lacks "
                    f"{', '.join(map(str, missing))}: run ALTER PUBLICATION {quote_ident(name)} "
                    f"ADD TABLE {', '.join(quote_table(t) for t in missing)}")
            if missing:
                cur.execute(f"ALTER PUBLICATION {quote_ident(name)} ADD TABLE "
                            + ", ".join(quote_table(t) for t in missing))
            if not every_action:
                raise SourceError(
                    f"publication {name!r} does not publish every insert, update, delete and "
                    f"truncate: ALTER PUBLICATION {quote_ident(name)} SET (publish = 'insert, "
                    "update, delete, truncate')")
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
    for reason in done:
        log.warning("%s", reason)
    return done


def _publication(cur: Any, name: str) -> tuple[str | None, bool, bool] | None:
    """The publication's comment, whether it publishes every action, and whether it
    publishes partitions through their root."""
    cur.execute("SELECT obj_description(oid, 'pg_publication'), pubinsert AND pubupdate AND"
                " pubdelete AND pubtruncate, pubviaroot FROM pg_publication"
                " WHERE pubname = %s", (name,))
    row = cur.fetchone()
    return None if row is None else (row[0], bool(row[1]), bool(row[2]))


def _partitioned(cur: Any, tables: Sequence[TableId]) -> bool:
    cur.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN unnest(%s::text[], %s::text[]) AS w(s, t) ON w.s = n.nspname AND w.t = c.relname"
        " WHERE c.relkind = 'p'", ([t.database for t in tables], [t.table for t in tables]))
    return bool(cur.fetchone()[0])


_SHAPES_SQL = (
    "SELECT w.s, w.t, string_agg(format('%%s:%%s:%%s', p.relid::bigint, pc.relfilenode,"
    " (SELECT string_agg(a.attnum::text, ',' ORDER BY a.attnum) FROM pg_attribute a"
    " WHERE a.attrelid = p.relid AND a.attnum > 0 AND NOT a.attisdropped"
    " AND a.atthasmissing)), ';' ORDER BY p.relid::bigint)"
    " FROM unnest(%s::text[], %s::text[]) AS w(s, t)"
    " JOIN pg_namespace n ON n.nspname = w.s"
    " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t AND c.relkind IN ('r', 'p')"
    " CROSS JOIN LATERAL (SELECT t.relid FROM pg_partition_tree(c.oid) t WHERE t.isleaf"
    " UNION SELECT c.oid WHERE c.relkind = 'r') p"  # (a plain table has no partition tree)
    " JOIN pg_class pc ON pc.oid = p.relid GROUP BY w.s, w.t"
)


def _shapes(cur: Any, tables: Sequence[TableId]) -> dict[TableId, str]:
    """Per existing table, its shape: for each partition (or the table itself), its
    relation, its data file (a TRUNCATE or rewrite gives it a new one) and the columns that
    hold the default they were added with (``relid:file:attnums;...``)."""
    cur.execute(_SHAPES_SQL, ([t.database for t in tables], [t.table for t in tables]))
    found = {TableId(str(s), str(t)): str(shape or "") for s, t, shape in cur.fetchall()}
    return {t: found.get(t, "") for t in _relation_ids(cur, tables)}


def _moved(table: TableId, was: str, now: str | None) -> str:
    """Why a table's shape moved, in the operator's words."""

    def parts(shape: str | None) -> dict[str, tuple[str, str]]:
        out = {}
        for part in (shape or "").split(";"):
            if part:
                relid, file, filled = (part.split(":") + ["", ""])[:3]
                out[relid] = (file, filled)
        return out

    before, after = parts(was), parts(now)
    what = []
    if before.keys() != after.keys():
        what.append("partitions were attached, detached or dropped")
    if any(before[r][0] != after[r][0] for r in before.keys() & after.keys()):
        what.append("it (or a partition) was truncated or rewritten (TRUNCATE of a "
                    "partition, ALTER COLUMN ... TYPE, VACUUM FULL, CLUSTER)")
    if any(before[r][1] != after[r][1] for r in before.keys() & after.keys()):
        what.append("a column was added with a default that existing rows take")
    return (f"table {table}: {'; '.join(what) or 'its storage changed'}, which changes rows "
            "without logical changes; its rows are captured again")


def _relation_ids(cur: Any, tables: Sequence[TableId]) -> dict[TableId, int]:
    """The relation OID of each table that exists (tables and partitioned tables)."""
    cur.execute(
        "SELECT n.nspname, c.relname, c.oid FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN unnest(%s::text[], %s::text[]) AS w(s, t) ON w.s = n.nspname AND w.t = c.relname"
        " WHERE c.relkind IN ('r', 'p')",
        ([t.database for t in tables], [t.table for t in tables]))
    return {TableId(str(s), str(t)): int(oid) for s, t, oid in cur.fetchall()}


def _record(cur: Any, relations: str, publication: str, table: TableId,
            relid: int | None, shape: str | None) -> None:
    cur.execute(f"INSERT INTO {relations} (publication, schema_name, table_name, relid, shape)"  # noqa: S608 - quoted
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (publication, schema_name, table_name)"
                " DO UPDATE SET relid = EXCLUDED.relid, shape = EXCLUDED.shape",
                (publication, table.database, table.table, relid, shape))


def _reason(table: TableId, before: int | None, now: int | None, publication: str) -> str:
    if now is None:
        what = "was dropped"
    elif before is None or before != now:
        what = "was dropped and created again"
    else:
        what = f"was removed from publication {publication!r}"
    return (f"table {table} {what}: its rows are reset in the lake here, and changes made "
            f"before it was published again are in no log; run `dblog capture {table}`")
