# ruff: noqa: S608 - test SQL is built from quote_table and constants
"""The log reader's own reading of row transactions (``dblog.sources.mysql.dumpstream``)
against mysql-replication parsing every event, on the same binlog range of the real server.

The range mixes what the raw path reads (single- and multi-row writes, updates, key changes,
deletes, watermarks, tables it filters out) with what it leaves to the library (rows of
types the compiled reader does not read, DDL and the new table ids after it, a rotation,
a transaction over two tables, a COMMIT query of a non-transactional table): both ways give
equal transactions."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import pymysql
import pytest

from dblog.core.events import TableId
from dblog.sources.base import Transaction
from dblog.sources.mysql import MySqlDialect
from dblog.sources.mysql.binlog import MySqlLogReader
from dblog.sources.mysql.dumpstream import DumpStream, RawRows
from dblog.sources.mysql.sqltext import quote_ident, quote_table
from devtools import services as local
from devtools.services import Endpoints
from tests.integration.helpers import make_settings, run_statements

pytestmark = pytest.mark.integration

PLAIN = ("(id BIGINT PRIMARY KEY, amount DECIMAL(12,2), note VARCHAR(40), "
         "at DATETIME(6), n INT UNSIGNED)")
ODD = "(id INT PRIMARY KEY, t TIME(3), b BIT(5), s SET('x','y','z'), j JSON)"


def _read_all(reader: MySqlLogReader, count: int, timeout: float = 60.0) -> list[Transaction]:
    out: list[Transaction] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += reader.read(max_transactions=500, max_wait_s=0.5)
    assert len(out) == count, f"got {len(out)} of {count} transactions"
    return out


def _workload(sql: Any, dialect: MySqlDialect, db: str, rng: random.Random) -> int:
    """Writes the range; returns how many transactions the reader is to give."""
    plain, odd = quote_table(TableId(db, "plain")), quote_table(TableId(db, "odd"))
    ignored = quote_table(TableId(db, "ignored"))
    myisam = quote_table(TableId(db, "flat"))
    expected = 0

    def row(key: int) -> tuple[Any, ...]:
        return (key, f"{rng.uniform(-1e6, 1e6):.2f}", rng.choice(["a", "é😀", "", None]),
                f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} 01:02:03.{rng.randint(0, 999999)}",
                rng.choice([0, 2**32 - 1, None]))

    with sql.cursor() as cur:
        for key in range(1, 41):  # single-row autocommit transactions
            cur.execute(f"INSERT INTO {plain} VALUES (%s, %s, %s, %s, %s)", row(key))
            expected += 1
        cur.executemany(f"INSERT INTO {plain} VALUES (%s, %s, %s, %s, %s)",
                        [row(key) for key in range(41, 141)])  # one multi-row statement
        expected += 1
        cur.execute(f"INSERT INTO {ignored} VALUES (1, 'not tracked')")  # filtered out
        dialect.write_watermark(str(uuid.uuid4()))
        expected += 1
        for key in rng.sample(range(1, 141), 30):
            cur.execute(f"UPDATE {plain} SET amount = amount + 1, note = 'u' WHERE id = %s",
                        (key,))
            expected += 1
        cur.execute(f"UPDATE {plain} SET id = id + 1000 WHERE id BETWEEN 1 AND 5")  # key change
        expected += 1
        cur.execute(f"INSERT INTO {odd} VALUES (1, '12:34:56.789', b'10101', 'x,z', "
                    "'{\"a\": [1, 2]}'), (2, NULL, b'0', '', NULL)")
        cur.execute(f"UPDATE {odd} SET s = 'y', t = '-01:00:00' WHERE id = 1")
        expected += 2
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {plain} VALUES (%s, %s, %s, %s, %s)", row(5000))
        cur.execute(f"DELETE FROM {odd} WHERE id = 2")
        cur.execute(f"DELETE FROM {plain} WHERE id BETWEEN 20 AND 24")
        cur.execute("COMMIT")
        expected += 1
        cur.execute(f"INSERT INTO {myisam} VALUES (1, 'no xid')")  # a COMMIT query
        expected += 1
        cur.execute("FLUSH BINARY LOGS")
        cur.execute(f"INSERT INTO {plain} VALUES (%s, %s, %s, %s, %s)", row(6000))
        expected += 1
        cur.execute(f"ALTER TABLE {plain} ADD COLUMN extra VARCHAR(8) DEFAULT 'd'")
        expected += 1  # the schema change itself
        cur.execute(f"INSERT INTO {plain} VALUES (%s, %s, %s, %s, %s, 'e')", row(7000))
        cur.execute(f"DELETE FROM {plain} WHERE id % 7 = 0")
        expected += 2
        dialect.write_watermark(str(uuid.uuid4()))
        expected += 1
    return expected


def test_raw_reading_gives_the_transactions_the_library_gives(
        dialect: MySqlDialect, sql: Any, db: str) -> None:
    tables = [TableId(db, "plain"), TableId(db, "odd"), TableId(db, "flat")]
    run_statements(sql, f"CREATE TABLE {quote_table(tables[0])} {PLAIN}",
                   f"CREATE TABLE {quote_table(tables[1])} {ODD}",
                   f"CREATE TABLE {quote_table(tables[2])} (id INT PRIMARY KEY, v VARCHAR(9)) "
                   "ENGINE=MyISAM",
                   f"CREATE TABLE {quote_table(TableId(db, 'ignored'))} (id INT PRIMARY KEY, "
                   "v VARCHAR(20))")
    dialect.ensure_watermark_table()
    start = dialect.head_position()
    expected = _workload(sql, dialect, db, random.Random(7))
    raw = MySqlLogReader(dialect.settings, start, tables)
    library = MySqlLogReader(dialect.settings, start, tables, raw_events=False)
    try:
        got_raw = _read_all(raw, expected)
        got_library = _read_all(library, expected)
        assert raw.resume == library.resume
    finally:
        raw.close()
        library.close()
    assert got_raw == got_library  # (that the raw path is taken: the test below)
    assert sum(len(t.items) for t in got_raw) > 200


def test_raw_rows_events_are_read_for_the_common_path(
        dialect: MySqlDialect, sql: Any, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path really is the raw one: rows of compiled tables never go through the
    library's row parsing."""
    table = TableId(db, "plain")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} {PLAIN}")
    start = dialect.head_position()
    with sql.cursor() as cur:
        for key in range(50):
            cur.execute(f"INSERT INTO {quote_table(table)} (id) VALUES (%s)", (key,))
    to_library: list[RawRows] = []
    original = DumpStream.library_event

    def counted(self: DumpStream, raw: RawRows) -> Any:
        to_library.append(raw)
        return original(self, raw)

    monkeypatch.setattr(DumpStream, "library_event", counted)
    reader = MySqlLogReader(dialect.settings, start, [table])
    try:
        got = _read_all(reader, 50)
    finally:
        reader.close()
    assert [t.items[0].key for t in got] == [(k,) for k in range(50)]  # type: ignore[union-attr]
    assert to_library == []


def test_table_ids_reused_by_a_restarted_server_decode_each_table_as_itself(
        services: Endpoints) -> None:
    """Table ids start over when MariaDB restarts, and the dump enters the file a restarted
    server began with a fake rotation. The first user table opened after each start tends
    to get the same id: table ``a`` after one restart, table ``b`` after the next. A reader
    from before ``a``'s write meets ``b``'s table map under ``a``'s id; it must decode ``b``'s
    row as ``b``'s, not skip the map as known (before, ``b``'s row came out as a change of
    ``a``, on both paths)."""
    db = f"t_ids_{uuid.uuid4().hex[:8]}"
    a, b = TableId(db, "a"), TableId(db, "b")
    server = local.MariaDB(local.dblog_home(), local.endpoints())

    def connect() -> Any:
        return pymysql.connect(host=services.host, port=services.mariadb_port,
                               user=services.user, password=services.mariadb_password,
                               autocommit=True)

    with connect() as conn:
        run_statements(conn, f"CREATE DATABASE {quote_ident(db)}",
                       f"CREATE TABLE {quote_table(a)} (id INT PRIMARY KEY, v INT)",
                       f"CREATE TABLE {quote_table(b)} (id INT PRIMARY KEY, w INT)")
    dialect = MySqlDialect(make_settings(services, watermark_database=db))
    try:
        server.down()
        server.up()
        start = dialect.head_position()
        with connect() as conn:
            run_statements(conn, f"INSERT INTO {quote_table(a)} VALUES (1, 10)")
        server.down()
        server.up()
        with connect() as conn:
            run_statements(conn, f"INSERT INTO {quote_table(b)} VALUES (2, 20)")
        for raw in (True, False):
            reader = MySqlLogReader(dialect.settings, start, [a, b], raw_events=raw)
            try:
                got = [item for t in _read_all(reader, 2) for item in t.items]
            finally:
                reader.close()
            assert [(i.table, i.after) for i in got] == [  # type: ignore[union-attr]
                (a, {"id": 1, "v": 10}), (b, {"id": 2, "w": 20})], f"raw_events={raw}"
    finally:
        dialect.close()
        with connect() as conn:
            run_statements(conn, f"DROP DATABASE IF EXISTS {quote_ident(db)}")
