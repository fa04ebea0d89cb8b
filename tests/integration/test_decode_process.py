# ruff: noqa: S608 - test SQL is built from quote_table and constants
"""The binlog reader moved into a decoder process: the same transactions, positions and
errors as the reader in the tailer's own process, and a child that dies is an error."""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.decode_process import ProcessLogReader, runs_in_own_process
from pipeline.errors import SourceError
from pipeline.events import TableId
from pipeline.sources.base import LogReader, Transaction
from pipeline.sources.mysql import MySqlDialect
from pipeline.sources.mysql.binlog import MySqlLogReader
from pipeline.sources.mysql.sqltext import quote_table
from tests.integration.helpers import make_settings

if TYPE_CHECKING:
    from pipeline.services import Endpoints

pytestmark = pytest.mark.integration


def execute(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for stmt in statements:
            cur.execute(stmt)


def read_all(reader: LogReader, count: int, per_read: int) -> list[tuple[Transaction, Any]]:
    """``count`` transactions, each with the reader's ``resume`` right after it was read."""
    out: list[tuple[Transaction, Any]] = []
    deadline = time.monotonic() + 30
    while len(out) < count and time.monotonic() < deadline:
        for tx in reader.read(max_transactions=per_read, max_wait_s=0.5):
            out.append((tx, None))
        if out:
            out[-1] = (out[-1][0], getattr(reader, "resume", None))
    assert len(out) == count, f"got {len(out)} of {count} transactions"
    return out


def test_the_decoder_process_reads_what_the_reader_reads(
        dialect: MySqlDialect, sql: Any, db: str) -> None:
    table = TableId(db, "moved")
    t = quote_table(table)
    execute(sql, f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(9,2), "
                 "ts DATETIME(6))")
    dialect.ensure_watermark_table()
    start = dialect.head_position()
    execute(sql, f"INSERT INTO {t} VALUES (1, 'a', 1.50, '2024-01-02 03:04:05.000006')",
            f"INSERT INTO {t} VALUES (2, 'b', NULL, NULL), (3, 'c', 3, NOW(6))")
    dialect.write_watermark(str(uuid.uuid4()))
    execute(sql, f"UPDATE {t} SET v = CONCAT(v, '!'), d = d + 1",
            f"ALTER TABLE {t} ADD COLUMN extra INT DEFAULT 7",
            f"DELETE FROM {t} WHERE id = 2",
            f"INSERT INTO {t} (id, v) VALUES (4, 'after ddl')")
    expected_count = 7  # 2 inserts, watermark, update, DDL, delete, insert

    direct = dialect.open_log(start, [table])
    try:
        want = read_all(direct, expected_count, 1)
    finally:
        direct.close()
    reader = dialect.open_log(start, [table])
    assert runs_in_own_process(reader)
    moved = ProcessLogReader(reader, read_transactions=3, poll_s=0.2)
    try:
        assert moved.resume == start
        got = read_all(moved, expected_count, 2)  # fewer than the child's reads hold
        assert moved.read(max_transactions=10, max_wait_s=0.3) == []
        idle_resume = moved.resume
    finally:
        moved.close()
    assert [tx for tx, _ in got] == [tx for tx, _ in want]
    for tx, resume in got:
        if resume is not None:  # after a read: the resume of its last transaction or later
            assert dialect.to_position(resume) >= tx.position
    assert idle_resume is not None
    assert dialect.to_position(idle_resume) >= dialect.to_position(want[-1][0].resume)
    assert not moved._process.is_alive()


def test_an_error_in_the_decoder_process_is_raised_by_the_read(
        services: Endpoints, dialect: MySqlDialect, db: str) -> None:
    settings = make_settings(services, password="not-" + services.mariadb_password)
    start = dialect.head_position()
    direct = MySqlLogReader(settings, start, [TableId(db, "t")])
    with pytest.raises(SourceError) as want:
        direct.read(max_transactions=1, max_wait_s=0.5)
    moved = ProcessLogReader(MySqlLogReader(settings, start, [TableId(db, "t")]),
                             poll_s=0.2)
    try:
        with pytest.raises(SourceError) as got:
            for _ in range(20):
                moved.read(max_transactions=1, max_wait_s=0.5)
        with pytest.raises(SourceError):  # and again: the reader does not go on silently
            moved.read(max_transactions=1, max_wait_s=0.5)
    finally:
        moved.close()
    assert type(got.value) is type(want.value)
    assert str(got.value) == str(want.value)
    assert services.mariadb_password not in str(got.value)


def test_a_decoder_process_that_dies_stops_the_reader_with_a_clear_error(
        dialect: MySqlDialect, db: str) -> None:
    moved = ProcessLogReader(dialect.open_log(dialect.head_position(), [TableId(db, "t")]),
                             poll_s=0.2)
    try:
        assert moved.read(max_transactions=1, max_wait_s=0.5) == []  # up and idle
        assert moved.pid is not None
        os.kill(moved.pid, signal.SIGKILL)
        with pytest.raises(SourceError, match="decoder process exited unexpectedly"):
            for _ in range(20):
                moved.read(max_transactions=1, max_wait_s=0.5)
    finally:
        moved.close()
