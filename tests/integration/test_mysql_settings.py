# ruff: noqa: S608 - test SQL is built from quote_ident/quote_table and constants
"""Server settings and schemas the MariaDB source refuses, against the real local server."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any

import pytest

from dblog.core.errors import SourceError
from dblog.core.events import ChangeEvent, TableId
from dblog.sources.base import ChunkSpec, Column, TableSchema, Transaction
from dblog.sources.mysql import MySqlDialect
from dblog.sources.mysql.snapshot import spark_schema
from dblog.sources.mysql.sqltext import quote_ident, quote_table
from tests.integration.helpers import run_statements

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def global_variable(conn: Any, name: str) -> str | None:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES LIKE %s", (name,))
        row = cur.fetchone()
    return None if row is None else str(row[1])


# -- settings that silently drop changes -----------------------------------------------------


def test_validate_refuses_compressed_binlog_events(dialect: MySqlDialect, sql: Any) -> None:
    """log_bin_compress=ON: compressed events would decode as unknown and be skipped.

    The global is shared with every other test on this server: it is ON only for the few
    milliseconds one validate() takes, and restored in ``finally``.
    """
    original = global_variable(sql, "log_bin_compress")
    assert original is not None, "the project's MariaDB (10.11) has log_bin_compress"
    dialect.validate()  # connected and passing before the change: the window stays short
    with sql.cursor() as cur:
        try:
            cur.execute("SET GLOBAL log_bin_compress = ON")
            with pytest.raises(SourceError) as err:
                dialect.validate()
        finally:
            cur.execute("SET GLOBAL log_bin_compress = %s", (original,))
    assert global_variable(sql, "log_bin_compress") == original
    message = str(err.value)
    assert "log_bin_compress is ON" in message
    assert "SET GLOBAL log_bin_compress=OFF" in message
    dialect.validate()


def test_log_reader_stops_at_a_compressed_event_instead_of_skipping_it(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    """Compression switched on after the tailer started: mysql-replication cannot decode the
    event and would skip it (row 1 lost, row 2 read). The reader must stop there instead."""
    table = TableId(db, "t")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (id INT PRIMARY KEY, v TEXT)")
    start = dialect.head_position()
    original = global_variable(sql, "log_bin_compress")
    with sql.cursor() as cur:
        try:
            cur.execute("SET GLOBAL log_bin_compress = ON")
            cur.execute(f"INSERT INTO {quote_table(table)} VALUES (1, %s)", ("x" * 4000,))
        finally:
            cur.execute("SET GLOBAL log_bin_compress = %s", (original,))
        cur.execute(f"INSERT INTO {quote_table(table)} VALUES (2, 'plain')")
    reader = dialect.open_log(start, [table])
    read: list[Transaction] = []
    try:
        with pytest.raises(SourceError) as err:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                read += reader.read(max_transactions=10, max_wait_s=0.5)
    finally:
        reader.close()
    assert not read, f"read past the compressed event: {read}"
    assert "compressed binlog event" in str(err.value)
    assert "log_bin_compress=OFF" in str(err.value)


# -- zero dates ------------------------------------------------------------------------------


def lax_inserts(conn: Any, *statements: str) -> None:
    """Run inserts in a session whose sql_mode allows zero and invalid dates (any client
    can do this, whatever the server's global sql_mode)."""
    run_statements(conn, "SET SESSION sql_mode = ''", *statements, "SET SESSION sql_mode = DEFAULT")


@pytest.mark.parametrize("key_type", ["DATE", "DATETIME(3)", "TIMESTAMP"])
def test_table_schema_warns_of_a_temporal_key_that_can_hold_zero_dates(
    dialect: MySqlDialect, sql: Any, db: str, key_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    global_mode = execute_scalar(sql, "SELECT @@GLOBAL.sql_mode")
    assert "NO_ZERO_DATE" not in global_mode, "the local server is expected to admit zero dates"
    table = TableId(db, "by_day")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (id INT NOT NULL, d {key_type}"
                        " NOT NULL, PRIMARY KEY (id, d))")
    with caplog.at_level("WARNING", logger="dblog.sources.mysql.schema"):
        assert dialect.table_schema(table).key == ("id", "d")  # capturable; warned once
        dialect.table_schema(table)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    message = messages[0]
    assert f"table {table}: primary key column 'd' is " in message
    assert "NO_ZERO_DATE" in message and "'0000-00-00'" in message
    # a temporal column outside the key is fine
    other = TableId(db, "with_dates")
    run_statements(sql, f"CREATE TABLE {quote_table(other)} (id INT PRIMARY KEY, d {key_type}"
                        " NULL)")
    assert dialect.table_schema(other).key == ("id",)


def execute_scalar(conn: Any, statement: str) -> str:
    with conn.cursor() as cur:
        cur.execute(statement)
        return str(cur.fetchone()[0])


def read_all(dialect: MySqlDialect, start: Any, table: TableId, count: int
             ) -> list[Transaction]:
    reader = dialect.open_log(start, [table])
    out: list[Transaction] = []
    try:
        deadline = time.monotonic() + 20
        while len(out) < count and time.monotonic() < deadline:
            out += reader.read(max_transactions=count - len(out), max_wait_s=0.5)
    finally:
        reader.close()
    return out


def test_log_reader_stops_on_zero_date_keys_instead_of_merging_them(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    """'0000-00-00' and '2020-00-15' both decode as NULL: two rows, one lake key."""
    table = TableId(db, "zero_keys")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (d DATE NOT NULL PRIMARY KEY, v INT)")
    start = dialect.head_position()
    t = quote_table(table)
    run_statements(sql, f"INSERT INTO {t} VALUES ('2020-01-15', 0)")
    lax_inserts(sql, f"INSERT INTO {t} VALUES ('0000-00-00', 1)",
                f"INSERT INTO {t} VALUES ('2020-00-15', 2)")
    good = read_all(dialect, start, table, 1)
    assert [i.key for i in good[0].items if isinstance(i, ChangeEvent)] == [
        (dt.date(2020, 1, 15),)]
    with pytest.raises(SourceError) as err:
        read_all(dialect, good[0].resume, table, 2)
    message = str(err.value)
    assert f"{table}: a change at binlog file " in message
    assert "has NULL in primary key column(s) 'd'" in message
    assert "`dblog tail --from-head`" in message


def test_chunk_read_fails_on_a_zero_date_key_instead_of_merging_it(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    table = TableId(db, "zero_keys")
    t = quote_table(table)
    run_statements(sql, f"CREATE TABLE {t} (d DATETIME NOT NULL, n INT NOT NULL, v INT,"
                        " PRIMARY KEY (d, n))",
                   f"INSERT INTO {t} VALUES ('2020-01-15 10:00:00', 1, 1), ('2021-01-01', 1, 2)")
    # the table_schema refusal is what stops this table first; build the schema by hand
    schema = TableSchema(table, (
        Column("d", "TIMESTAMP_NTZ", False, "datetime(0)"), Column("n", "INT", False, "int"),
        Column("v", "INT", True, "int"),
    ), ("d", "n"))
    rows = dialect.read_chunk(spark, ChunkSpec(table, limit=10), schema).collect()
    assert [tuple(r) for r in rows] == [
        (dt.datetime(2020, 1, 15, 10), 1, 1), (dt.datetime(2021, 1, 1), 1, 2)]
    lax_inserts(sql, f"INSERT INTO {t} VALUES ('0000-00-00 00:00:00', 1, 3)",
                f"INSERT INTO {t} VALUES ('2020-00-15 00:00:00', 1, 4)")
    with pytest.raises(Exception) as err:  # noqa: PT011 - Spark wraps the job's error
        dialect.read_chunk(spark, ChunkSpec(table, limit=10), schema).collect()
    assert "primary key column 'd' holds a value the lake cannot represent" in str(err.value)


def test_unrepresentable_dates_outside_the_key_read_as_null_from_log_and_chunks(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    """Zero, partial zero and year-0 dates: NULL from the log and from chunk selects alike."""
    table = TableId(db, "zero_values")
    t = quote_table(table)
    run_statements(sql, f"CREATE TABLE {t} (id INT PRIMARY KEY, d DATE NULL, dt DATETIME(3) NULL,"
                        " ts TIMESTAMP NULL)")
    start = dialect.head_position()
    values = {
        1: ("0000-00-00", "0000-00-00 00:00:00", "0000-00-00 00:00:00"),
        2: ("2020-00-15", "2020-00-15 10:00:00", "2020-00-15 10:00:00"),
        3: ("2020-05-00", "2020-05-00 10:00:00", "2020-05-00 10:00:00"),
        4: ("0000-01-01", "0000-01-01 10:00:00", "0000-01-01 10:00:00"),
        5: ("0001-01-01", "0001-01-01 00:00:00.5", "1970-01-01 00:00:01"),
    }
    lax_inserts(sql, *(f"INSERT INTO {t} VALUES ({i}, '{d}', '{d_t}', '{ts}')"
                       for i, (d, d_t, ts) in values.items()))
    schema = dialect.table_schema(table)
    txns = read_all(dialect, start, table, len(values))
    from_log = [tuple(i.after[c] for c in schema.names) for x in txns for i in x.items
                if isinstance(i, ChangeEvent) and i.after is not None]
    nulls = [(i, None, None, None) for i in (1, 2, 3, 4)]
    valid = (5, dt.date(1, 1, 1), dt.datetime(1, 1, 1, 0, 0, 0, 500000),
             dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC))
    assert from_log == [*nulls, valid]
    chunk = dialect.read_chunk(spark, ChunkSpec(table, limit=10), schema).collect()
    assert chunk == spark.createDataFrame(from_log, spark_schema(schema)).collect()


def test_invalid_dates_read_as_null_from_chunks_and_leap_days_as_they_are(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    """A day past its month's end, stored under ALLOW_INVALID_DATES ('2020-02-31', which the
    log reader refuses), reads as NULL from a chunk select, not as a day of the next month;
    leap days read as they are, at every fraction."""
    table = TableId(db, "invalid_dates")
    t = quote_table(table)
    run_statements(sql, f"CREATE TABLE {t} (id INT PRIMARY KEY, d DATE NULL, dt DATETIME(6) NULL,"
                        " dt0 DATETIME NULL, ts TIMESTAMP(3) NULL)")
    run_statements(sql, "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'",
                   *(f"INSERT INTO {t} VALUES ({i}, '{d}', '{d} 23:59:59.999999', '{d} 10:00:00',"
                     " NULL)" for i, d in enumerate(["2020-02-31", "2021-02-29", "1900-02-29",
                                                     "2023-04-31", "2023-11-31"], start=1)),
                   f"INSERT INTO {t} VALUES (6, '2000-02-29', '2000-02-29 23:59:59.999999',"
                   " '2024-02-29 00:00:00', '2036-02-29 12:34:56.789')",
                   f"INSERT INTO {t} VALUES (7, '2024-12-31', '1969-12-31 23:59:59.000001',"
                   " '1970-01-01 00:00:00', '2038-01-19 03:14:07.999')",
                   "SET SESSION sql_mode = DEFAULT")
    schema = dialect.table_schema(table)
    chunk = dialect.read_chunk(spark, ChunkSpec(table, limit=10), schema).collect()
    utc = dt.UTC
    expected = [
        *((i, None, None, None, None) for i in range(1, 6)),
        (6, dt.date(2000, 2, 29), dt.datetime(2000, 2, 29, 23, 59, 59, 999999),
         dt.datetime(2024, 2, 29), dt.datetime(2036, 2, 29, 12, 34, 56, 789000, tzinfo=utc)),
        (7, dt.date(2024, 12, 31), dt.datetime(1969, 12, 31, 23, 59, 59, 1),
         dt.datetime(1970, 1, 1), dt.datetime(2038, 1, 19, 3, 14, 7, 999000, tzinfo=utc)),
    ]
    assert chunk == spark.createDataFrame(expected, spark_schema(schema)).collect()


# -- does Spark order keys like the database? -------------------------------------------------

KEY_ORDER_CASES = [
    ("INT", True), ("BIGINT UNSIGNED", True), ("TINYINT UNSIGNED", True),
    ("DECIMAL(12,3)", True), ("DECIMAL(50,0)", False), ("DATE", True), ("DATETIME(6)", True),
    ("TIMESTAMP(3)", True), ("YEAR", True), ("BINARY(4)", True), ("VARBINARY(20)", True),
    ("VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin", True),
    ("VARCHAR(20) CHARACTER SET utf8mb3 COLLATE utf8mb3_nopad_bin", True),
    ("VARCHAR(20) CHARACTER SET ascii COLLATE ascii_nopad_bin", True),
    ("VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", False),
    ("VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci", False),
    ("VARCHAR(20)", False),  # the server's default collation, utf8mb4_unicode_ci
    ("VARCHAR(20) CHARACTER SET latin1 COLLATE latin1_nopad_bin", False),
    ("CHAR(5) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin", False),
    ("ENUM('b','a')", False), ("SET('x','y')", False), ("TIME", False), ("FLOAT", False),
    ("DOUBLE", False), ("BIT(8)", False),
]


def test_spark_orders_keys_like_source_per_key_type(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    for i, (key_type, expected) in enumerate(KEY_ORDER_CASES):
        table = TableId(db, f"k{i}")
        run_statements(sql, f"CREATE TABLE {quote_table(table)} (k {key_type} NOT NULL PRIMARY KEY,"
                            " v INT)")
        assert dialect.spark_orders_keys_like_source(table) is expected, key_type
    # prefix keys on BLOB/TEXT order by the whole value, like Spark
    blob, text = TableId(db, "blob_key"), TableId(db, "text_key")
    run_statements(sql, f"CREATE TABLE {quote_table(blob)} (b BLOB NOT NULL, PRIMARY KEY (b(10)))",
                   f"CREATE TABLE {quote_table(text)} (t TEXT CHARACTER SET utf8mb4 COLLATE"
                   " utf8mb4_nopad_bin NOT NULL, PRIMARY KEY (t(10)))")
    assert dialect.spark_orders_keys_like_source(blob)
    assert dialect.spark_orders_keys_like_source(text)
    # composite: every key column must qualify (and only key columns count)
    good, bad = TableId(db, "good"), TableId(db, "bad")
    run_statements(sql, f"CREATE TABLE {quote_table(good)} (a INT NOT NULL, b DATE NOT NULL,"
                        " c VARCHAR(5) COLLATE utf8mb4_unicode_ci, f FLOAT, PRIMARY KEY (b, a))",
                   f"CREATE TABLE {quote_table(bad)} (a INT NOT NULL, b VARCHAR(5) NOT NULL,"
                   " PRIMARY KEY (a, b))")
    assert dialect.spark_orders_keys_like_source(good)
    assert not dialect.spark_orders_keys_like_source(bad)


def test_spark_orders_keys_like_source_refuses_unknown_and_keyless_tables(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    run_statements(sql, f"CREATE TABLE {quote_ident(db)}.nokey (a INT)")
    with pytest.raises(SourceError, match="has no primary key"):
        dialect.spark_orders_keys_like_source(TableId(db, "nokey"))
    with pytest.raises(SourceError, match="does not exist"):
        dialect.spark_orders_keys_like_source(TableId(db, "missing"))


TRICKY = ["", "a", "a\t", "a\x00", "A", "ab", "b", "Z", "é", "ß", "\ufffd", "中", "😀",
          "a😀", "\U0010fffd"]


@pytest.mark.parametrize(("collation", "same_order"), [
    ("utf8mb4_nopad_bin", True),
    ("utf8mb4_bin", False),  # PAD SPACE: 'a\t' and 'a\x00' sort before 'a'
])
def test_key_order_decision_matches_the_database(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession, collation: str,
    same_order: bool,
) -> None:
    """The database's ORDER BY against Spark's sort of the same canonical values."""
    table = TableId(db, "texts")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (k VARCHAR(10) CHARACTER SET utf8mb4"
                        f" COLLATE {collation} NOT NULL PRIMARY KEY)")
    with sql.cursor() as cur:
        cur.executemany(f"INSERT INTO {quote_table(table)} VALUES (%s)", TRICKY)
        cur.execute(f"SELECT k FROM {quote_table(table)} ORDER BY k")
        db_order = [str(r[0]) for r in cur.fetchall()]
    spark_order = [r[0] for r in spark.createDataFrame([(k,) for k in TRICKY], "k STRING")
                   .orderBy("k").collect()]
    assert sorted(db_order) == sorted(spark_order)
    assert (db_order == spark_order) is same_order
    assert dialect.spark_orders_keys_like_source(table) is same_order
