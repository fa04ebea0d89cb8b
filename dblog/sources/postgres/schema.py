"""Table definitions from PostgreSQL's catalog, in the engine's canonical form.

Generated columns (``GENERATED ALWAYS AS (...) STORED``) are left out: PostgreSQL 15's
logical replication does not send them, so a lake column for them would hold the captured
value until the row's next change and NULL after it. Readers compute them from the other
columns as the database does."""

from __future__ import annotations

from typing import Any

from dblog.core.errors import SourceError
from dblog.core.events import TableId
from dblog.sources.base import Column, TableSchema, element_type
from dblog.sources.postgres.types import canonical_type, source_type_name

COLUMNS_SQL = """
SELECT c.oid, c.relreplident, a.attname, a.atttypid, a.atttypmod, a.attnotnull,
       COALESCE((SELECT k.ord FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                 WHERE k.attnum = a.attnum), 0) AS key_at,
       CASE WHEN co.collname = 'default' THEN (SELECT datcollate FROM pg_database
            WHERE datname = current_database()) ELSE co.collname END,
       a.attgenerated, c.relpersistence
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
ORDER BY a.attnum
"""


LEAVES_WITHOUT_FULL_IDENTITY_SQL = """
SELECT n.nspname, c.relname FROM pg_partition_tree(%s::regclass) p
JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE p.isleaf AND p.level > 0 AND c.relreplident <> 'f' ORDER BY 1, 2
"""


def table_rows(conn: Any, table: TableId) -> list[tuple[Any, ...]]:
    """The table's columns (generated ones left out, see the module docstring)."""
    with conn.cursor() as cur:
        cur.execute(COLUMNS_SQL, (table.database, table.table))
        return [r for r in cur.fetchall() if not r[8]]


def load_table_schema(conn: Any, table: TableId, *, need_full_identity: bool = True
                      ) -> TableSchema:
    """The table's columns and primary key; SourceError for an unknown table, one without
    a primary key, or (``need_full_identity``) one without ``REPLICA IDENTITY FULL``."""
    rows = table_rows(conn, table)
    if not rows:
        kind = _relation_kind(conn, table)
        if kind is not None:
            raise SourceError(
                f"{table} is a {kind}, not a table: only tables have row changes in the "
                "logical log (track the tables it reads or feeds instead)")
        raise SourceError(f"table {table} not found on the source (schema.table, names are "
                          "case-sensitive)")
    if rows[0][9] != "p":
        raise SourceError(
            f"table {table} is {'UNLOGGED' if rows[0][9] == 'u' else 'TEMPORARY'}: its changes "
            "are not written to the WAL, so logical replication never sees them; run ALTER "
            f"TABLE {_quoted(table)} SET LOGGED")
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
    if need_full_identity:
        refuse_partitions_without_full_identity(conn, table, int(rows[0][0]))
    return TableSchema(table, columns, key)


_KINDS = {"S": "sequence", "v": "view", "m": "materialized view", "f": "foreign table",
          "i": "index", "I": "partitioned index", "c": "composite type", "t": "TOAST table"}


def _relation_kind(conn: Any, table: TableId) -> str | None:
    """What ``table`` names when it is no table (a sequence, a view...), else None."""
    with conn.cursor() as cur:
        cur.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                    (table.database, table.table))
        found = cur.fetchone()
    return None if found is None else _KINDS.get(str(found[0]), f"relation of kind {found[0]}")


def refuse_partitions_without_full_identity(conn: Any, table: TableId, oid: int) -> None:
    """A partitioned table's changes are logged with each partition's own replica
    identity: every partition needs FULL too."""
    with conn.cursor() as cur:
        cur.execute(LEAVES_WITHOUT_FULL_IDENTITY_SQL, (oid,))
        lacking = [TableId(str(s), str(t)) for s, t in cur.fetchall()]
    if lacking:
        fixes = "; ".join(f"ALTER TABLE {_quoted(t)} REPLICA IDENTITY FULL" for t in lacking)
        raise SourceError(
            f"partitions of {table} do not have REPLICA IDENTITY FULL (their changes are "
            f"logged with their own): run {fixes}")


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
    from dblog.sources.postgres.sqltext import quote_table

    return quote_table(table)
