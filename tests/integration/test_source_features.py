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


FK_SCHEMA = (
    "CREATE TABLE {db}.p (id INT PRIMARY KEY, code VARCHAR(5) UNIQUE)",
    "CREATE TABLE {db}.c_del (id INT PRIMARY KEY, pid INT, FOREIGN KEY (pid) REFERENCES"
    " {db}.p (id) ON DELETE CASCADE)",
    "CREATE TABLE {db}.c_null (id INT PRIMARY KEY, pid INT, FOREIGN KEY (pid) REFERENCES"
    " {db}.p (id) ON DELETE SET NULL ON UPDATE SET NULL)",
    "CREATE TABLE {db}.c_upd (id INT PRIMARY KEY, pcode VARCHAR(5), FOREIGN KEY (pcode)"
    " REFERENCES {db}.p (code) ON UPDATE CASCADE)",
    "CREATE TABLE {db}.mid (id INT PRIMARY KEY, pid INT, FOREIGN KEY (pid) REFERENCES"
    " {db}.p (id) ON DELETE CASCADE)",
    "CREATE TABLE {db}.g (id INT PRIMARY KEY, mid_id INT, FOREIGN KEY (mid_id) REFERENCES"
    " {db}.mid (id) ON DELETE CASCADE)",
    "CREATE TABLE {db}.e (id INT PRIMARY KEY, boss INT, FOREIGN KEY (boss) REFERENCES"
    " {db}.e (id) ON DELETE SET NULL)",
    "INSERT INTO {db}.p VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')",
    "INSERT INTO {db}.c_del VALUES (10, 1), (11, 1), (12, 2), (13, 3)",
    "INSERT INTO {db}.c_null VALUES (20, 1), (21, 2), (22, 4)",
    "INSERT INTO {db}.c_upd VALUES (30, 'b'), (31, 'd')",
    "INSERT INTO {db}.mid VALUES (40, 1), (41, 2)",
    "INSERT INTO {db}.g VALUES (50, 40), (51, 41)",
    "INSERT INTO {db}.e VALUES (60, NULL), (61, 60), (62, 61)",
)
FK_TRACKED = ["c_del", "c_null", "c_upd", "g", "e"]


def test_mariadb_foreign_key_actions_reach_the_tracked_children(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """InnoDB applies ON DELETE/ON UPDATE CASCADE and SET NULL below the SQL layer and logs
    no row events for them: the parent (tracked or not) is watched, and every tracked table
    its actions reach is healed, through an untracked table in between and a table that
    references itself; REPLACE on a parent deletes the row first (a cascade too)."""
    db = new_schema(maria, *FK_SCHEMA)
    with feature_pipeline(maria, tmp_path, spark, db, FK_TRACKED) as rt:
        capture(rt, *(TableId(db, t) for t in FK_TRACKED))
        run(maria, db, "DELETE FROM {db}.p WHERE id = 1",  # c_del, c_null, mid -> g
            "UPDATE {db}.p SET code = 'bb' WHERE id = 2",  # c_upd (code), not c_null (id)
            "UPDATE {db}.p SET id = 44 WHERE id = 4",  # c_null (ON UPDATE SET NULL)
            "REPLACE INTO {db}.p VALUES (3, 'cc')",  # a delete and an insert: c_del
            "DELETE FROM {db}.e WHERE id = 60")  # 61 loses its boss
        tail_until_caught_up(rt)
        assert_lake_is_source(maria, spark, rt, db, {t: ("id",) for t in FK_TRACKED})


def test_mariadb_foreign_keys_added_or_dropped_are_followed(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """A cascading key added while the tailer runs is watched from then on (the reader
    reads the keys again after a DDL and reopens its stream with the new parent); a key
    dropped after a cascade the tailer had not read yet heals the child when the tailer
    reads the DROP (it read the cascade with the keys as they are now, without it)."""
    from pipeline.background import BackgroundTailer
    from tests.integration.helpers import wait_for

    db = new_schema(maria, "CREATE TABLE {db}.p (id INT PRIMARY KEY)",
                    "CREATE TABLE {db}.c (id INT PRIMARY KEY, pid INT)",
                    "INSERT INTO {db}.p VALUES (1), (2), (3)",
                    "INSERT INTO {db}.c VALUES (10, 1), (11, 2), (12, 3)")
    with feature_pipeline(maria, tmp_path, spark, db, ["c"]) as rt:
        capture(rt, TableId(db, "c"))
        with BackgroundTailer(rt.tailer()) as bg:
            rt.wait_caught_up(bg.check)
            run(maria, db, "ALTER TABLE {db}.c ADD CONSTRAINT f FOREIGN KEY (pid) REFERENCES"
                " {db}.p (id) ON DELETE CASCADE", "DELETE FROM {db}.p WHERE id = 1")
            wait_for("the cascade healed", lambda: (bg.check(), not lake_differences(
                maria, spark, rt, db, "c", ("id",)))[1], timeout=300, poll=2.0)
        run(maria, db, "DELETE FROM {db}.p WHERE id = 2",  # read by the next tailer...
            "ALTER TABLE {db}.c DROP FOREIGN KEY f")  # ...which opens without the key
        tail_until_caught_up(rt)
        assert_lake_is_source(maria, spark, rt, db, {"c": ("id",)})


def test_mariadb_on_delete_set_default_is_refused_by_the_server(maria: SourceKit) -> None:
    """MariaDB accepts SET DEFAULT in a table's definition, but InnoDB refuses the parent's
    change (as RESTRICT): no child row changes, nothing to capture."""
    import pymysql

    db = new_schema(maria, "CREATE TABLE {db}.p (id INT PRIMARY KEY)",
                    "CREATE TABLE {db}.c (id INT PRIMARY KEY, pid INT DEFAULT 0, FOREIGN KEY"
                    " (pid) REFERENCES {db}.p (id) ON DELETE SET DEFAULT ON UPDATE SET DEFAULT)",
                    "INSERT INTO {db}.p VALUES (0), (1)", "INSERT INTO {db}.c VALUES (1, 1)")
    try:
        for statement in ("DELETE FROM {db}.p WHERE id = 1", "UPDATE {db}.p SET id = 2"):
            with pytest.raises(pymysql.err.IntegrityError, match="1451"):
                run(maria, db, statement)
        assert maria.rows(db, "c", ("id",)) == {(1,): {"id": 1, "pid": 1}}
    finally:
        maria.drop(db)


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


def test_postgres_stored_generated_columns_are_left_out_and_never_nulled(
    pg: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """pgoutput (PostgreSQL 15) does not send generated columns: the lake leaves them out
    (captured, they became NULL at the row's next change)."""
    db = new_schema(pg, "CREATE TABLE {db}.g (id int PRIMARY KEY, a int,"
                        " b int GENERATED ALWAYS AS (a * 2) STORED, c text)",
                    "ALTER TABLE {db}.g REPLICA IDENTITY FULL",
                    "INSERT INTO {db}.g (id, a, c) VALUES (1, 1, 'x'), (2, 2, 'y')")
    with feature_pipeline(pg, tmp_path, spark, db, ["g"]) as rt:
        table = TableId(db, "g")
        capture(rt, table)
        run(pg, db, "UPDATE {db}.g SET a = 5 WHERE id = 1",
            "INSERT INTO {db}.g (id, a, c) VALUES (3, 3, 'z')")
        tail_until_caught_up(rt)
        assert [c.name for c in rt.sink.known_columns(table)] == ["id", "a", "c"]
        problems = lake_differences(pg, spark, rt, db, "g", ("id",), left_out=frozenset({"b"}))
        assert not problems, problems


PARTITIONED = (
    "CREATE TABLE {db}.m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
    "CREATE TABLE {db}.m1 PARTITION OF {db}.m FOR VALUES FROM (0) TO (100)",
    "CREATE TABLE {db}.m2 PARTITION OF {db}.m FOR VALUES FROM (100) TO (200)",
    "CREATE TABLE {db}.m3 PARTITION OF {db}.m FOR VALUES FROM (200) TO (300)",
    "CREATE TABLE {db}.m4 (id int PRIMARY KEY, v text)",  # attached later, rows and all
    *(f"ALTER TABLE {{db}}.{t} REPLICA IDENTITY FULL" for t in ("m", "m1", "m2", "m3", "m4")),
    "INSERT INTO {db}.m SELECT i, 'v' || i FROM generate_series(1, 250) i",
    "INSERT INTO {db}.m4 SELECT i, 'w' || i FROM generate_series(300, 310) i",
)


def test_postgres_partitioned_tables_are_captured_and_tailed_through_their_root(
    pg: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """Published through the root (publish_via_partition_root), keyed and chunked on it:
    an update that moves a row to another partition is a delete and an insert of the
    root's rows."""
    db = new_schema(pg, *PARTITIONED)
    with feature_pipeline(pg, tmp_path, spark, db, ["m"]) as rt:
        capture(rt, TableId(db, "m"))
        run(pg, db, "UPDATE {db}.m SET v = 'moved', id = id + 250 WHERE id = 5",
            "DELETE FROM {db}.m WHERE id = 120", "INSERT INTO {db}.m VALUES (290, 'new')")
        tail_until_caught_up(rt)
        assert_lake_is_source(pg, spark, rt, db, {"m": ("id",)})


def test_postgres_partition_maintenance_heals_the_table(
    pg: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """ATTACH brings rows, DETACH and DROP of a partition take them away, and a partition's
    TRUNCATE is not sent through the root: none is a logical change. The table's shape
    moves, and the table is healed."""
    db = new_schema(pg, *PARTITIONED)
    with feature_pipeline(pg, tmp_path, spark, db, ["m"]) as rt:
        capture(rt, TableId(db, "m"))
        run(pg, db, "ALTER TABLE {db}.m ATTACH PARTITION {db}.m4 FOR VALUES FROM (300) TO (400)",
            "TRUNCATE {db}.m1", "ALTER TABLE {db}.m DETACH PARTITION {db}.m2",
            "DROP TABLE {db}.m3", "INSERT INTO {db}.m VALUES (7, 'after')")
        tail_until_caught_up(rt)
        assert_lake_is_source(pg, spark, rt, db, {"m": ("id",)})


def test_postgres_ddl_that_fills_or_rewrites_rows_heals_the_table(
    pg: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """A column added with a default (existing rows take it without a row change), an
    identity column (a rewrite), and a type change that rewrites values."""
    db = new_schema(pg, "CREATE TABLE {db}.a (id int PRIMARY KEY, v int)",
                    "ALTER TABLE {db}.a REPLICA IDENTITY FULL",
                    "INSERT INTO {db}.a SELECT i, i FROM generate_series(1, 20) i")
    with feature_pipeline(pg, tmp_path, spark, db, ["a"]) as rt:
        capture(rt, TableId(db, "a"))
        run(pg, db, "ALTER TABLE {db}.a ADD COLUMN f int NOT NULL DEFAULT 7",
            "ALTER TABLE {db}.a ADD COLUMN n int GENERATED BY DEFAULT AS IDENTITY",
            "ALTER TABLE {db}.a ALTER COLUMN v TYPE bigint USING v * 3")
        tail_until_caught_up(rt)
        assert_lake_is_source(pg, spark, rt, db, {"a": ("id",)})

