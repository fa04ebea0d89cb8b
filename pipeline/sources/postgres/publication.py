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
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pipeline.errors import SourceError
from pipeline.events import TableId
from pipeline.sources.postgres.connection import PostgresSettings
from pipeline.sources.postgres.sqltext import quote_ident, quote_table

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
            if found is None:
                listed = ", ".join(quote_table(t) for t in [*tables, *always])
                cur.execute(f"CREATE PUBLICATION {quote_ident(name)} FOR TABLE {listed}")
                cur.execute(f"COMMENT ON PUBLICATION {quote_ident(name)} IS %s", (MANAGED,))
                for table in tables:
                    _record(cur, relations, name, table, current.get(table))
                cur.execute("COMMIT")
                return []
            comment, every_action = found
            cur.execute("SELECT schemaname, tablename FROM pg_publication_tables"
                        " WHERE pubname = %s", (name,))
            have = {TableId(str(s), str(t)) for s, t in cur.fetchall()}
            cur.execute(f"SELECT schema_name, table_name, relid FROM {relations}"  # noqa: S608 - quoted
                        " WHERE publication = %s", (name,))
            recorded = {TableId(str(s), str(t)): (None if r is None else int(r))
                        for s, t, r in cur.fetchall()}
            missing = [t for t in always if t not in have]
            done: list[str] = []
            for table in tables:
                relid = current.get(table)
                if table not in recorded:  # newly configured: its history starts now
                    if relid is not None:
                        if table not in have:
                            missing.append(table)
                        _record(cur, relations, name, table, relid)
                    continue
                before = recorded[table]
                if relid == before and (relid is None or table in have):
                    continue
                reason = _reason(table, before, relid, name)
                if relid is not None and table not in have:
                    missing.append(table)
                cur.execute(f"INSERT INTO {resets} (publication, schema_name, table_name,"  # noqa: S608 - quoted
                            " reason) VALUES (%s, %s, %s, %s)",
                            (name, table.database, table.table, reason))
                _record(cur, relations, name, table, relid)
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


def _publication(cur: Any, name: str) -> tuple[str | None, bool] | None:
    cur.execute("SELECT obj_description(oid, 'pg_publication'), pubinsert AND pubupdate AND"
                " pubdelete AND pubtruncate FROM pg_publication WHERE pubname = %s", (name,))
    row = cur.fetchone()
    return None if row is None else (row[0], bool(row[1]))


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
            relid: int | None) -> None:
    cur.execute(f"INSERT INTO {relations} VALUES (%s, %s, %s, %s)"  # noqa: S608 - quoted
                " ON CONFLICT (publication, schema_name, table_name)"
                " DO UPDATE SET relid = EXCLUDED.relid",
                (publication, table.database, table.table, relid))


def _reason(table: TableId, before: int | None, now: int | None, publication: str) -> str:
    if now is None:
        what = "was dropped"
    elif before is None or before != now:
        what = "was dropped and created again"
    else:
        what = f"was removed from publication {publication!r}"
    return (f"table {table} {what}: its rows are reset in the lake here, and changes made "
            f"before it was published again are in no log; run `dblog capture {table}`")
