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
import yaml
from pyspark.sql import SparkSession

from dblog.core.errors import SourceError
from dblog.core.events import TableId
from dblog.lake.sink import SchemaEvolutionError
from devtools.services import Endpoints
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


def assert_refused_at_start(k: SourceKit, tmp_path: Path, db: str,
                            refusals: dict[str, str]) -> None:
    """A config naming each of ``refusals`` (a name in ``db``) stops at start with its
    text; ``db`` is dropped after."""
    from dblog.app.config import load_config
    from dblog.app.runtime import open_runtime

    try:
        for name, says in refusals.items():
            data = k.config_data(source=f"refused-{uuid.uuid4().hex[:6]}", db=db,
                                 lake=tmp_path / "lake", tables=[f"{db}.{name}"])
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(data))
            with pytest.raises(SourceError, match=says), open_runtime(load_config(path)):
                pass
    finally:
        k.drop(db)


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
    from dblog.tail.background import BackgroundTailer
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
    from dblog.app.status import collect_status

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


def load_file(rows: list[str]) -> str:
    """A CSV file the MariaDB server can read (``LOAD DATA INFILE`` reads on its host)."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(prefix="dblog-load-", suffix=".csv")
    with os.fdopen(fd, "w") as out:
        out.write("".join(f"{row}\n" for row in rows))
    os.chmod(path, 0o644)
    return path


def test_mariadb_triggers_generated_columns_upserts_and_load_data_are_logged_rows(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """In ROW format, rows a trigger writes, VIRTUAL and STORED generated columns (full
    row images carry their values), REPLACE (a delete and an insert, or an update),
    INSERT ... ON DUPLICATE KEY UPDATE, LOAD DATA (plain and REPLACE) and TRUNCATE are all
    logged as row events (a TRUNCATE as its statement, a table reset): handled exactly."""
    db = new_schema(
        maria,
        "CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE {db}.audit (n INT AUTO_INCREMENT PRIMARY KEY, tid INT, v INT)",
        "CREATE TRIGGER {db}.noted AFTER UPDATE ON {db}.t FOR EACH ROW"
        " INSERT INTO {db}.audit (tid, v) VALUES (NEW.id, NEW.v)",
        "CREATE TABLE {db}.g (id INT PRIMARY KEY, a INT, v INT AS (a * 2) VIRTUAL,"
        " s VARCHAR(20) AS (CONCAT('s', a)) STORED)",
        "CREATE TABLE {db}.u (id INT PRIMARY KEY, v VARCHAR(10), n INT DEFAULT 0)",
        "INSERT INTO {db}.t VALUES (1, 1), (2, 2)",
        "INSERT INTO {db}.g (id, a) VALUES (1, 1), (2, 2), (3, 3)",
        "INSERT INTO {db}.u (id, v) VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')",
    )
    tracked = {"audit": ("n",), "g": ("id",), "u": ("id",)}
    first = load_file(["10,x,1", "11,y,2"])
    again = load_file(["11,yy,3", "12,z,4"])
    try:
        with feature_pipeline(maria, tmp_path, spark, db, list(tracked)) as rt:
            capture(rt, *(TableId(db, t) for t in tracked))
            run(maria, db, "UPDATE {db}.t SET v = v * 10",
                "UPDATE {db}.g SET a = 7 WHERE id = 1", "DELETE FROM {db}.g WHERE id = 2",
                "REPLACE INTO {db}.u (id, v) VALUES (1, 'A'), (5, 'e')",
                "INSERT INTO {db}.u (id, v) VALUES (2, 'B'), (6, 'f')"
                " ON DUPLICATE KEY UPDATE v = VALUES(v), n = n + 1",
                f"LOAD DATA INFILE '{first}' INTO TABLE {{db}}.u FIELDS TERMINATED BY ','",
                f"LOAD DATA INFILE '{again}' REPLACE INTO TABLE {{db}}.u"
                " FIELDS TERMINATED BY ','")
            tail_until_caught_up(rt)
            assert_lake_is_source(maria, spark, rt, db, tracked)
            run(maria, db, "TRUNCATE TABLE {db}.u", "INSERT INTO {db}.u (id, v) VALUES (9, 'i')")
            tail_until_caught_up(rt)
            assert_lake_is_source(maria, spark, rt, db, tracked)
    finally:
        Path(first).unlink()
        Path(again).unlink()


def test_mariadb_partition_maintenance_and_ddl_that_fills_rows_heal_the_table(
    maria: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """TRUNCATE, DROP and EXCHANGE PARTITION change rows without row events (REORGANIZE
    moves them unchanged); ADD COLUMN with a DEFAULT, an AUTO_INCREMENT or a STORED
    generated column fills every row, MODIFY converts values (to a type the lake widens
    to); a LOAD DATA in a STATEMENT session logs its statement. Each heals the table it
    reached. A type change the lake cannot follow stops the tailer with the column, and
    the way on it names leads to a lake equal to the source."""
    db = new_schema(
        maria,
        "CREATE TABLE {db}.m (id INT PRIMARY KEY, v VARCHAR(10)) PARTITION BY RANGE (id) ("
        " PARTITION p0 VALUES LESS THAN (100), PARTITION p1 VALUES LESS THAN (200),"
        " PARTITION p2 VALUES LESS THAN (300), PARTITION p3 VALUES LESS THAN MAXVALUE)",
        "CREATE TABLE {db}.x (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE {db}.a (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE {db}.l (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO {db}.m VALUES (1, 'a'), (2, 'b'), (101, 'c'), (201, 'd'), (301, 'e'),"
        " (401, 'f')",
        "INSERT INTO {db}.x VALUES (250, 'x'), (251, 'y')",
        "INSERT INTO {db}.a VALUES (1, 1), (2, 2), (3, 3)",
        "INSERT INTO {db}.l VALUES (1, 'a')",
    )
    tracked = {"m": ("id",), "x": ("id",), "a": ("id",), "l": ("id",)}
    loaded = load_file(["2,b", "3,c"])
    try:
        with feature_pipeline(maria, tmp_path, spark, db, list(tracked)) as rt:
            capture(rt, *(TableId(db, t) for t in tracked))
            run(maria, db, "ALTER TABLE {db}.m TRUNCATE PARTITION p0",
                "ALTER TABLE {db}.m DROP PARTITION p1",
                "ALTER TABLE {db}.m EXCHANGE PARTITION p2 WITH TABLE {db}.x",
                "ALTER TABLE {db}.m REORGANIZE PARTITION p3 INTO (PARTITION p3 VALUES LESS"
                " THAN (400), PARTITION p4 VALUES LESS THAN MAXVALUE)",
                "ALTER TABLE {db}.a ADD COLUMN d INT DEFAULT 5",
                "ALTER TABLE {db}.a ADD COLUMN seq INT NOT NULL AUTO_INCREMENT UNIQUE",
                "ALTER TABLE {db}.a ADD COLUMN st INT AS (id * 3) STORED",
                "ALTER TABLE {db}.a MODIFY v BIGINT",  # widened in the lake
                "UPDATE {db}.a SET v = v * 10000000000 WHERE id = 1",
                "SET SESSION binlog_format = STATEMENT",
                f"LOAD DATA INFILE '{loaded}' INTO TABLE {{db}}.l FIELDS TERMINATED BY ','")
            tail_until_caught_up(rt)
            assert_lake_is_source(maria, spark, rt, db, tracked)
            # A type change Delta cannot follow stops the tailer before it writes the
            # change, naming the column and both types.
            run(maria, db, "ALTER TABLE {db}.a MODIFY v VARCHAR(30)",
                "UPDATE {db}.a SET v = 'text' WHERE id = 2")
            with pytest.raises(SchemaEvolutionError, match=r"a\.v changed type from BIGINT"
                               " to STRING, which Delta cannot widen"):
                tail_until_caught_up(rt)
            follow_the_way_on(maria, spark, tmp_path, db, TableId(db, "a"), rt)
    finally:
        Path(loaded).unlink()


def follow_the_way_on(k: SourceKit, spark: SparkSession, tmp_path: Path, db: str,
                      table: TableId, rt: Any) -> None:
    """What the stop says to do: tail past the change without the table, move its lake
    tables aside, put it back and capture it."""
    import shutil

    from dblog.app.config import load_config
    from dblog.app.runtime import open_runtime

    data = yaml.safe_load((tmp_path / "dblog.yaml").read_text())
    data["tables"] = [t for t in data["tables"] if t != str(table)]
    (tmp_path / "without.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    with open_runtime(load_config(tmp_path / "without.yaml"), spark=spark) as without:
        tail_until_caught_up(without)
    for path in (rt.layout.changelog(table), rt.layout.mirror(table)):
        shutil.move(path, f"{path}.aside")
    with open_runtime(load_config(tmp_path / "dblog.yaml"), spark=spark) as again:
        capture(again, table)
        tail_until_caught_up(again)
        assert_lake_is_source(k, spark, again, db, {table.table: ("id",)})


def test_mariadb_sequences_and_views_are_refused_at_start(
    maria: SourceKit, tmp_path: Path
) -> None:
    """A sequence's next values and a view's rows are in no row event of their own: a
    config naming one stops at start with what it is."""
    db = new_schema(maria, "CREATE TABLE {db}.t (id INT PRIMARY KEY)",
                    "CREATE SEQUENCE {db}.s", "CREATE VIEW {db}.v AS SELECT id FROM {db}.t")
    assert_refused_at_start(maria, tmp_path, db, {"s": "is a sequence, not a table",
                                                  "v": "is a view, not a table"})


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



def test_postgres_cascades_triggers_truncate_cascade_and_replica_role_are_logged_rows(
    pg: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """PostgreSQL runs foreign-key actions (CASCADE, SET NULL, SET DEFAULT, on delete and
    on update) and triggers as ordinary row changes, each logged, the parent tracked or
    not; TRUNCATE ... CASCADE logs a truncate of every table it empties;
    session_replication_role = replica disables FK actions and triggers, and the log holds
    just what was done. All handled exactly."""
    db = new_schema(
        pg,
        "CREATE TABLE {db}.p (id int PRIMARY KEY, code text UNIQUE)",
        "CREATE TABLE {db}.c (id int PRIMARY KEY,"
        " del int REFERENCES {db}.p (id) ON DELETE CASCADE ON UPDATE CASCADE,"
        " nul int REFERENCES {db}.p (id) ON DELETE SET NULL ON UPDATE SET NULL,"
        " def int DEFAULT 0 REFERENCES {db}.p (id) ON DELETE SET DEFAULT,"
        " code text REFERENCES {db}.p (code) ON UPDATE CASCADE)",
        "CREATE TABLE {db}.audit (n serial PRIMARY KEY, pid int, code text)",
        "CREATE FUNCTION {db}.note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO {db}.audit (pid, code) VALUES (NEW.id, NEW.code); RETURN NEW; END $$",
        "CREATE TRIGGER noted AFTER UPDATE ON {db}.p FOR EACH ROW EXECUTE FUNCTION {db}.note()",
        "CREATE TABLE {db}.tc (id int PRIMARY KEY, pid int REFERENCES {db}.p (id))",
        *(f"ALTER TABLE {{db}}.{t} REPLICA IDENTITY FULL" for t in ("c", "audit", "tc")),
        "INSERT INTO {db}.p VALUES (0, 'z'), (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e')",
        "INSERT INTO {db}.c VALUES (10, 1, 0, 0, 'z'), (11, 3, 3, 0, 'b'), (12, 2, 1, 4, 'z'),"
        " (13, 2, 4, 2, 'b'), (14, 5, 0, 0, 'z')",
        "INSERT INTO {db}.tc VALUES (1, 1), (2, 2)",
    )
    tracked = {"c": ("id",), "audit": ("n",), "tc": ("id",)}
    with feature_pipeline(pg, tmp_path, spark, db, list(tracked)) as rt:
        capture(rt, *(TableId(db, t) for t in tracked))
        run(pg, db, "TRUNCATE {db}.p, {db}.tc CASCADE",  # empties c too
            "INSERT INTO {db}.p VALUES (0, 'z'), (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'),"
            " (5, 'e')",
            "INSERT INTO {db}.c VALUES (10, 1, 0, 0, 'z'), (11, 3, 3, 0, 'b'),"
            " (12, 2, 1, 4, 'z'), (13, 2, 4, 2, 'b'), (14, 5, 0, 0, 'z')",
            "DELETE FROM {db}.p WHERE id = 1",  # 10 deleted, 12's nul set NULL
            "UPDATE {db}.p SET id = 33 WHERE id = 3",  # 11's del follows, its nul NULL
            "UPDATE {db}.p SET code = 'bb' WHERE id = 2",  # 11's and 13's code follow
            "DELETE FROM {db}.p WHERE id = 4",  # 12's def back to 0, 13's nul NULL
            "SET session_replication_role = replica",
            "DELETE FROM {db}.p WHERE id = 5",  # no cascade: 14 keeps its parent
            "UPDATE {db}.p SET code = 'zz' WHERE id = 0",  # no trigger, no cascade
            "RESET session_replication_role")
        tail_until_caught_up(rt)
        rows = pg.rows(db, "c", ("id",))
        assert (10,) not in rows and rows[(14,)]["del"] == 5
        assert len(pg.rows(db, "audit", ("n",))) == 2  # the role really bypassed them
        assert_lake_is_source(pg, spark, rt, db, tracked)


def test_postgres_replica_identity_changed_from_full_heals_the_changed_keys(
    pg: SourceKit, spark: SparkSession, tmp_path: Path
) -> None:
    """Refused at start; changed to DEFAULT while the tailer runs, the log's updates and
    deletes carry no old rows (nor unchanged TOASTed values): their keys are captured again
    (with a notice) until it is FULL again, then rows are read from the log as before."""
    db = new_schema(pg, "CREATE TABLE {db}.r (id int PRIMARY KEY, v int, doc text)",
                    "ALTER TABLE {db}.r ALTER COLUMN doc SET STORAGE EXTERNAL",
                    "ALTER TABLE {db}.r REPLICA IDENTITY FULL",
                    "INSERT INTO {db}.r SELECT i, i, repeat(i::text, 20000)"
                    " FROM generate_series(1, 6) i")
    # doc is TOASTed: an update that leaves it alone logs no value for it
    with feature_pipeline(pg, tmp_path, spark, db, ["r"]) as rt:
        table = TableId(db, "r")
        capture(rt, table)
        run(pg, db, "ALTER TABLE {db}.r REPLICA IDENTITY DEFAULT",
            "UPDATE {db}.r SET v = 10 WHERE id = 1",  # doc unchanged: not in the log
            "DELETE FROM {db}.r WHERE id = 2",  # the key only
            "UPDATE {db}.r SET id = 30 WHERE id = 3",  # old key, new row
            "INSERT INTO {db}.r VALUES (7, 7, repeat('y', 20000))",  # inserts are whole
            "ALTER TABLE {db}.r REPLICA IDENTITY FULL",
            "UPDATE {db}.r SET v = 40 WHERE id = 4")
        tail_until_caught_up(rt)
        assert_lake_is_source(pg, spark, rt, db, {"r": ("id",)})
        with pytest.raises(SourceError, match="REPLICA IDENTITY FULL"):
            run(pg, db, "ALTER TABLE {db}.r REPLICA IDENTITY DEFAULT")
            rt.dialect.table_schema(table)


def test_postgres_sequences_views_and_unlogged_tables_are_refused_at_start(
    pg: SourceKit, tmp_path: Path
) -> None:
    """Their changes are not in the logical log: a config naming one stops at start with
    what it is and what to do."""
    db = new_schema(pg, "CREATE TABLE {db}.t (id int PRIMARY KEY)",
                    "CREATE SEQUENCE {db}.s", "CREATE VIEW {db}.v AS SELECT id FROM {db}.t",
                    "CREATE UNLOGGED TABLE {db}.u (id int PRIMARY KEY)")
    assert_refused_at_start(pg, tmp_path, db, {"s": "is a sequence", "v": "is a view",
                                               "u": "UNLOGGED"})
