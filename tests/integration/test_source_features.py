"""The source feature matrix (docs/sources.md): every schema feature or setting that changes
captured rows without an ordinary row event is handled exactly, detected and healed (the
table or its keys captured again automatically), or refused at start, never silent.

Each test runs what a user runs: a capture, the change, a tail until caught up; then the
mirror and an independent replay of the changelog must equal the source."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline.events import TableId
from pipeline.services import Endpoints
from tests.integration.features import (
    capture,
    feature_pipeline,
    lake_differences,
    tail_until_caught_up,
)
from tests.integration.sources import SourceKit, kit

pytestmark = pytest.mark.integration


@pytest.fixture
def maria(services: Endpoints, monkeypatch: pytest.MonkeyPatch) -> SourceKit:
    found = kit("mariadb", services)
    monkeypatch.setenv(found.password_env, found.password)
    return found


@pytest.fixture
def pg(services: Endpoints, monkeypatch: pytest.MonkeyPatch) -> SourceKit:
    found = kit("postgres", services)
    monkeypatch.setenv(found.password_env, found.password)
    return found


def new_schema(k: SourceKit, *statements: str) -> str:
    """A new schema (database) holding what ``statements`` create (``{db}``: its name,
    quoted)."""
    db = f"feat_{uuid.uuid4().hex[:8]}"
    quoted = k.qualified(db, "x").rsplit(".", 1)[0]
    first = f"CREATE DATABASE {quoted}" if k.kind == "mariadb" else f"CREATE SCHEMA {quoted}"
    conn = k.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(first)
            for statement in statements:
                cur.execute(statement.format(db=quoted))
    finally:
        conn.close()
    return db


def run(k: SourceKit, db: str, *statements: str) -> None:
    """Statements on one autocommit connection (a session: its settings last)."""
    quoted = k.qualified(db, "x").rsplit(".", 1)[0]
    conn = k.connect()
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement.format(db=quoted))
    finally:
        conn.close()


def assert_lake_is_source(k: SourceKit, spark: SparkSession, rt: Any, db: str,
                          tables: dict[str, tuple[str, ...]]) -> None:
    problems = [p for table, key in tables.items()
                for p in lake_differences(k, spark, rt, db, table, key)]
    assert not problems, "\n".join(problems)


# ---- MariaDB / MySQL -------------------------------------------------------------------


def test_mariadb_add_column_not_null_without_default_fills_existing_rows(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """Existing rows get the type's implicit default (0) without row events."""
    db = new_schema(maria, "CREATE TABLE {db}.a (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO {db}.a VALUES (1, 1), (2, 2), (3, 3)")
    with feature_pipeline(maria, tmp_path, spark, db, ["a"]) as rt:
        capture(rt, TableId(db, "a"))
        run(maria, db, "ALTER TABLE {db}.a ADD COLUMN f INT NOT NULL")
        tail_until_caught_up(rt)
        assert_lake_is_source(maria, spark, rt, db, {"a": ("id",)})


def test_with_heal_notify_a_rewriting_ddl_is_only_noted_until_a_capture(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """``tail.heal: notify``: the tailer captures nothing itself; `dblog status` names the
    table and the statement until a capture of the table is done."""
    from pipeline.status import collect_status

    db = new_schema(maria, "CREATE TABLE {db}.a (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO {db}.a VALUES (1, 1), (2, 2)")
    with feature_pipeline(maria, tmp_path, spark, db, ["a"], tail={"heal": "notify"}) as rt:
        table = TableId(db, "a")
        capture(rt, table)
        run(maria, db, "ALTER TABLE {db}.a ADD COLUMN f INT NOT NULL DEFAULT 7")
        tail_until_caught_up(rt)
        assert lake_differences(maria, spark, rt, db, "a", ("id",))  # not healed
        noted = {ts.table: ts.repair_advised for ts in collect_status(rt).tables}
        assert "ADD COLUMN f INT NOT NULL DEFAULT 7" in str(noted[table])
        capture(rt, table)
        assert_lake_is_source(maria, spark, rt, db, {"a": ("id",)})
        assert collect_status(rt).tables[0].repair_advised is None


def test_mariadb_statement_format_session_changes_are_not_lost(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """A session with binlog_format=STATEMENT logs its DML as query text, not rows."""
    db = new_schema(maria, "CREATE TABLE {db}.a (id INT PRIMARY KEY, v INT)",
                    "INSERT INTO {db}.a VALUES (1, 1), (2, 2), (3, 3)")
    with feature_pipeline(maria, tmp_path, spark, db, ["a"]) as rt:
        capture(rt, TableId(db, "a"))
        run(maria, db, "SET SESSION binlog_format = STATEMENT",
            "UPDATE {db}.a SET v = 10 WHERE id = 1", "DELETE FROM {db}.a WHERE id = 2",
            "INSERT INTO {db}.a VALUES (4, 4)")
        tail_until_caught_up(rt)
        assert_lake_is_source(maria, spark, rt, db, {"a": ("id",)})


def test_mariadb_minimal_row_images_are_not_misread(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """binlog_row_image=MINIMAL logs the key and the changed columns only."""
    db = new_schema(maria, "CREATE TABLE {db}.a (id INT PRIMARY KEY, v INT, w VARCHAR(10))",
                    "INSERT INTO {db}.a VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
    with feature_pipeline(maria, tmp_path, spark, db, ["a"]) as rt:
        capture(rt, TableId(db, "a"))
        run(maria, db, "SET SESSION binlog_row_image = MINIMAL",
            "UPDATE {db}.a SET v = 10 WHERE id = 1", "DELETE FROM {db}.a WHERE id = 2",
            "INSERT INTO {db}.a (id, v) VALUES (4, 4)")
        tail_until_caught_up(rt)
        assert_lake_is_source(maria, spark, rt, db, {"a": ("id",)})


# ---- PostgreSQL --------------------------------------------------------------------------
