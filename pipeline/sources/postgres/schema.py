"""Table definitions from PostgreSQL's catalog, in the engine's canonical form."""

from __future__ import annotations

from typing import Any

from pipeline.errors import SourceError
from pipeline.events import TableId
from pipeline.sources.base import Column, TableSchema, element_type
from pipeline.sources.postgres.types import canonical_type, source_type_name

COLUMNS_SQL = """
SELECT c.oid, c.relreplident, a.attname, a.atttypid, a.atttypmod, a.attnotnull,
       COALESCE((SELECT k.ord FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                 WHERE k.attnum = a.attnum), 0) AS key_at,
       CASE WHEN co.collname = 'default' THEN (SELECT datcollate FROM pg_database
            WHERE datname = current_database()) ELSE co.collname END
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
ORDER BY a.attnum
"""


def table_rows(conn: Any, table: TableId) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(COLUMNS_SQL, (table.database, table.table))
        return list(cur.fetchall())


def load_table_schema(conn: Any, table: TableId, *, need_full_identity: bool = True
                      ) -> TableSchema:
    """The table's columns and primary key; SourceError for an unknown table, one without
    a primary key, or (``need_full_identity``) one without ``REPLICA IDENTITY FULL``."""
    rows = table_rows(conn, table)
    if not rows:
        raise SourceError(f"table {table} not found on the source (schema.table, names are "
                          "case-sensitive)")
    columns = tuple(
        Column(str(r[2]), canonical_type(int(r[3]), int(r[4])), not r[5],
               source_type_name(int(r[3]), int(r[4])))
        for r in rows
    )
    key = tuple(str(r[2]) for r in sorted((r for r in rows if r[6]), key=lambda r: r[6]))
    if not key:
        raise SourceError(f"table {table} has no primary key: dblog needs one to capture it "
                          "(add a primary key)")
    refuse_array_keys(table, columns, key)
    if need_full_identity and rows[0][1] != "f":
        raise SourceError(
            f"table {table} does not have REPLICA IDENTITY FULL: dblog needs full before "
            "images and unchanged TOASTed values from the log; run ALTER TABLE "
            f"{_quoted(table)} REPLICA IDENTITY FULL")
    return TableSchema(table, columns, key)


def refuse_array_keys(table: TableId, columns: tuple[Column, ...], key: tuple[str, ...]
                      ) -> None:
    """SourceError when a primary key column is an array (the lake orders keys as scalars)."""
    arrays = [c.name for c in columns if c.name in key and element_type(c.spark_type)]
    if arrays:
        raise SourceError(f"table {table} has array columns {arrays} in its primary key: "
                          "dblog captures scalar keys only (key the table on other columns)")


def key_columns(conn: Any, table: TableId) -> list[tuple[str, int, int, str | None]]:
    """Per key column (in key order): name, type OID, type modifier, collation."""
    rows = table_rows(conn, table)
    keyed = sorted((r for r in rows if r[6]), key=lambda r: r[6])
    return [(str(r[2]), int(r[3]), int(r[4]), r[7]) for r in keyed]


def _quoted(table: TableId) -> str:
    from pipeline.sources.postgres.sqltext import quote_table

    return quote_table(table)
