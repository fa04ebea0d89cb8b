"""Table schemas from information_schema."""

from __future__ import annotations

import logging
from typing import Any

import pymysql.cursors

from dblog.core.errors import SourceError
from dblog.core.events import TableId
from dblog.sources.base import Column, TableSchema
from dblog.sources.mysql.checks import ZERO_DATE_TYPES, check_temporal_key
from dblog.sources.mysql.types import SourceType, from_information_schema

log = logging.getLogger(__name__)
_warned: set[TableId] = set()

_COLUMNS_SQL = (
    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE,"
    " DATETIME_PRECISION, CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS"
    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION"
)
_TABLES_SQL = (
    "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES"
    " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
)
_KEY_SQL = (
    "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s"
    " AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX"
)


_KEY_COLUMNS_SQL = (
    "SELECT c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.IS_NULLABLE, c.NUMERIC_PRECISION,"
    " c.NUMERIC_SCALE, c.DATETIME_PRECISION, c.CHARACTER_OCTET_LENGTH, c.COLLATION_NAME"
    " FROM information_schema.STATISTICS s JOIN information_schema.COLUMNS c"
    " ON c.TABLE_SCHEMA = s.TABLE_SCHEMA AND c.TABLE_NAME = s.TABLE_NAME"
    " AND c.COLUMN_NAME = s.COLUMN_NAME"
    " WHERE s.TABLE_SCHEMA = %s AND s.TABLE_NAME = %s AND s.INDEX_NAME = 'PRIMARY'"
    " ORDER BY s.SEQ_IN_INDEX"
)


def no_primary_key(table: TableId) -> SourceError:
    return SourceError(
        f"table {table} has no primary key; DBLog needs one to chunk and to merge"
    )


def load_table_schema(conn: Any, table: TableId) -> TableSchema:
    """The current schema of ``table`` from information_schema (columns in table order).

    A DATE/DATETIME/TIMESTAMP key column while the server's global sql_mode lets it hold
    zero or invalid dates is logged as a warning once (``checks.check_temporal_key``): such a
    key value, if one ever appears, stops the tailer or the chunk read with a clear error
    rather than merging two keys, so the table can still be captured.
    """
    if any(ord(ch) > 0xFFFF or ch == "\x00" for ch in str(table)):
        raise SourceError(f"table {table} does not exist: not a valid MariaDB identifier")
    args = (table.database, table.table)
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(_TABLES_SQL, args)
        found = [r for r in cur.fetchall() if r["TABLE_NAME"] == table.table]
        if not found:
            raise SourceError(f"table {table} does not exist (or the user cannot see it)")
        if found[0]["TABLE_TYPE"] != "BASE TABLE":
            raise SourceError(
                f"{table} is a {str(found[0]['TABLE_TYPE']).lower()}, not a table: "
                "only base tables have row changes in the binlog"
            )
        cur.execute(_COLUMNS_SQL, args)
        rows = cur.fetchall()
        cur.execute(_KEY_SQL, args)
        key = tuple(str(r["COLUMN_NAME"]) for r in cur.fetchall())
    columns = []
    bases: dict[str, str] = {}
    for row in rows:
        name = str(row["COLUMN_NAME"])
        st = from_information_schema(row, f"table {table} column {name!r}")
        columns.append(Column(name, st.spark_type, row["IS_NULLABLE"] == "YES", st.name))
        bases[name] = st.base
    if not key:
        raise no_primary_key(table)
    key_types = [(k, bases.get(k, "")) for k in key]
    if any(base in ZERO_DATE_TYPES for _, base in key_types):
        with conn.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.sql_mode")
            sql_mode = str(cur.fetchone()[0] or "")
        problems = check_temporal_key(table, key_types, sql_mode)
        if problems and table not in _warned:
            _warned.add(table)
            log.warning("%s", "; ".join(problems))
    return TableSchema(table, tuple(columns), key)


def key_order_columns(conn: Any, table: TableId) -> list[tuple[str, SourceType, str | None]]:
    """The primary-key columns of ``table`` in key order: name, type and collation (None
    for non-text columns); SourceError for an unknown table or one without a primary key."""
    args = (table.database, table.table)
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(_KEY_COLUMNS_SQL, args)
        rows = [r for r in cur.fetchall() if r["COLUMN_NAME"] is not None]
    if not rows:
        load_table_schema(conn, table)  # says why: unknown table, a view, no primary key
        raise no_primary_key(table)
    out = []
    for row in rows:
        name = str(row["COLUMN_NAME"])
        st = from_information_schema(row, f"table {table} column {name!r}")
        collation = row["COLLATION_NAME"]
        out.append((name, st, None if collation is None else str(collation)))
    return out
