# ruff: noqa: S608 - test SQL is built from quote_ident/quote_table and constants
"""The MariaDB source against the real local server: validation, schemas, every column type
through the binlog and through chunk selects (and that both agree), hostile identifiers,
transactions, DDL, positions and purged logs."""

from __future__ import annotations

import datetime as dt
import socket
import time
import traceback
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest

from dblog.core.errors import LogPurgedError, SourceError, SourceUnavailable
from dblog.core.events import ChangeEvent, Op, TableId, WatermarkEvent
from dblog.sources.base import ChunkSpec, SchemaChange, Transaction
from dblog.sources.mysql import MySqlDialect
from dblog.sources.mysql.binlog import MySqlLogReader
from dblog.sources.mysql.snapshot import read_chunk, spark_schema
from dblog.sources.mysql.sqltext import quote_ident, quote_table
from tests.integration.helpers import make_settings, run_statements

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from devtools.services import Endpoints


pytestmark = pytest.mark.integration

UTC = dt.UTC


def read_until(reader: MySqlLogReader, count: int, timeout: float = 20.0) -> list[Transaction]:
    """Read until ``count`` transactions arrived (fails on timeout)."""
    out: list[Transaction] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += reader.read(max_transactions=count - len(out), max_wait_s=0.5)
    assert len(out) == count, f"got {len(out)} of {count} transactions: {out}"
    return out


def changes(txns: list[Transaction]) -> list[ChangeEvent]:
    return [i for t in txns for i in t.items if isinstance(i, ChangeEvent)]


# -- validation ----------------------------------------------------------------------------


def logged_changes(dialect: MySqlDialect, start: Any, table: TableId, transactions: int
                   ) -> list[ChangeEvent]:
    """The row changes of ``table`` in the first ``transactions`` transactions from ``start``."""
    reader = dialect.open_log(start, [table])
    try:
        return changes(read_until(reader, transactions))
    finally:
        reader.close()


def test_validate_passes_on_the_local_server(dialect: MySqlDialect) -> None:
    dialect.validate()


def test_validate_refuses_a_user_without_replication_privileges(
    services: Endpoints, sql: Any
) -> None:
    user = f"dblog_ro_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    run_statements(sql, ("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user, password)),
                   ("GRANT SELECT ON *.* TO %s@'127.0.0.1'", (user,)))
    try:
        d = MySqlDialect(make_settings(services, user=user, password=password))
        with pytest.raises(SourceError) as err:
            d.validate()
        message = str(err.value)
        assert "REPLICATION SLAVE" in message and "BINLOG MONITOR" in message
        assert "GRANT REPLICATION SLAVE ON *.* TO" in message
        assert "missing privilege SELECT" not in message
        d.close()
    finally:
        run_statements(sql, ("DROP USER %s@'127.0.0.1'", (user,)))


def test_wrong_password_is_access_denied(services: Endpoints) -> None:
    d = MySqlDialect(make_settings(services, password="not-the-password"))
    with pytest.raises(SourceError) as err:
        d.validate()
    assert not isinstance(err.value, SourceUnavailable)
    assert "access denied for user 'dblog'" in str(err.value)
    assert "not-the-password" not in str(err.value)


def test_unreachable_port_is_source_unavailable(services: Endpoints) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    d = MySqlDialect(make_settings(services, port=port, connect_timeout=3))
    with pytest.raises(SourceUnavailable) as err:
        d.validate()
    assert f"127.0.0.1:{port}" in str(err.value)
    assert err.value.transient


def test_unknown_table_and_table_without_primary_key(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    run_statements(sql, f"CREATE TABLE {quote_ident(db)}.nokey (a INT, b TEXT)")
    with pytest.raises(SourceError, match=f"table {db}.nokey has no primary key; DBLog needs "
                       "one to chunk and to merge"):
        dialect.table_schema(TableId(db, "nokey"))
    with pytest.raises(SourceError, match=f"{db}.missing does not exist"):
        dialect.table_schema(TableId(db, "missing"))


# -- every type ------------------------------------------------------------------------------

ALL_TYPES_DDL = """(
 id INT NOT NULL PRIMARY KEY,
 ti TINYINT, tiu TINYINT UNSIGNED, b BOOL, si SMALLINT, siu SMALLINT UNSIGNED,
 mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT,
 biu BIGINT UNSIGNED NOT NULL DEFAULT 0,
 d DECIMAL(12,4), d0 DECIMAL(5,5), dbig DECIMAL(50,10), fl FLOAT, db DOUBLE,
 dt DATE, dtt DATETIME(6), dt0 DATETIME, ts TIMESTAMP(6) NULL, tm TIME(3), tm6 TIME(6), yr YEAR,
 c CHAR(5), vc VARCHAR(300), tx TEXT, mtx MEDIUMTEXT, bl BLOB, bn BINARY(6), vb VARBINARY(10),
 js JSON, en ENUM('a','b','c'), st SET('x','y','z'), bt BIT(10), bt64 BIT(64)
)"""

COLUMNS = [
    "id", "ti", "tiu", "b", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu", "d", "d0", "dbig",
    "fl", "db", "dt", "dtt", "dt0", "ts", "tm", "tm6", "yr", "c", "vc", "tx", "mtx", "bl", "bn",
    "vb", "js", "en", "st", "bt", "bt64",
]
MAX_ROW = [
    1, 127, 255, 1, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295,
    9223372036854775807, 18446744073709551615, "99999999.9999", "0.99999",
    "1234567890123456789012345678901234567890.0123456789", 0.1234567, 0.1 + 0.2,
    "9999-12-31", "2024-01-02 03:04:05.123456", "2024-02-29 23:59:59",
    "2024-06-30 12:00:00.654321", "838:59:59.000", "-00:00:00.000001", 2155,
    "ab  ", "x😀y  ", "tëxt 😀", "m" * 70000, b"\x00\xff\x00", b"\x01\x02", b"\x00",
    '{"a": [1, 2], "é": "😀"}', "c", "z,x", 0b1000000001, 2**64 - 1,
]
MIN_ROW = [
    2, -128, 0, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
    "-99999999.9999", "-0.00001", "-0.0000000001", -1.5, -1e-300,
    "1000-01-01", "1000-01-01 00:00:00.000000", "1000-01-01 00:00:00",
    "1970-01-01 05:00:01", "-838:59:59.000", "-12:34:56.789012", 1901,
    "", "", "", "", b"", b"", b"", "[]", "a", "", 0, 1,
]
MAX_EXPECTED: dict[str, Any] = {
    "id": 1, "ti": 127, "tiu": 255, "b": 1, "si": 32767, "siu": 65535, "mi": 8388607,
    "miu": 16777215, "i": 2147483647, "iu": 4294967295, "bi": 9223372036854775807,
    "biu": Decimal("18446744073709551615"), "d": Decimal("99999999.9999"),
    "d0": Decimal("0.99999"), "dbig": "1234567890123456789012345678901234567890.0123456789",
    "fl": 0.12345670163631439, "db": 0.30000000000000004,
    "dt": dt.date(9999, 12, 31), "dtt": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
    "dt0": dt.datetime(2024, 2, 29, 23, 59, 59),
    # inserted in a +05:00 session: the log and the chunk give UTC
    "ts": dt.datetime(2024, 6, 30, 7, 0, 0, 654321, tzinfo=UTC),
    "tm": "838:59:59.000", "tm6": "-00:00:00.000001", "yr": 2155,
    "c": "ab", "vc": "x😀y  ", "tx": "tëxt 😀", "mtx": "m" * 70000, "bl": b"\x00\xff\x00",
    "bn": b"\x01\x02\x00\x00\x00\x00", "vb": b"\x00", "js": '{"a": [1, 2], "é": "😀"}',
    "en": "c", "st": "x,z", "bt": 513, "bt64": -1,
}
MIN_EXPECTED: dict[str, Any] = {
    "id": 2, "ti": -128, "tiu": 0, "b": 0, "si": -32768, "siu": 0, "mi": -8388608, "miu": 0,
    "i": -2147483648, "iu": 0, "bi": -9223372036854775808, "biu": Decimal(0),
    "d": Decimal("-99999999.9999"), "d0": Decimal("-0.00001"), "dbig": "-0.0000000001",
    "fl": -1.5, "db": -1e-300, "dt": dt.date(1000, 1, 1),
    "dtt": dt.datetime(1000, 1, 1), "dt0": dt.datetime(1000, 1, 1),
    "ts": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
    "tm": "-838:59:59.000", "tm6": "-12:34:56.789012", "yr": 1901,
    "c": "", "vc": "", "tx": "", "mtx": "", "bl": b"", "bn": b"\x00" * 6, "vb": b"",
    "js": "[]", "en": "a", "st": "", "bt": 0, "bt64": 1,
}
NULL_EXPECTED: dict[str, Any] = {c: None for c in COLUMNS} | {"id": 3, "biu": Decimal(0)}
# zero dates and the invalid ENUM value '' (non-strict sql_mode): NULL, NULL, NULL, 0, ''
ZERO_EXPECTED: dict[str, Any] = NULL_EXPECTED | {
    "id": 4, "dt": None, "dtt": None, "ts": None, "yr": 0, "en": "",
}


def create_all_types(sql: Any, table: TableId) -> None:
    marks = ", ".join(["%s"] * len(COLUMNS))
    names = ", ".join(COLUMNS)
    insert = f"INSERT INTO {quote_table(table)} ({names}) VALUES ({marks})"
    run_statements(
        sql,
        f"CREATE TABLE {quote_table(table)} {ALL_TYPES_DDL}",
        "SET time_zone = '+05:00'",
        (insert, MAX_ROW),
        (insert, MIN_ROW),
        f"INSERT INTO {quote_table(table)} (id) VALUES (3)",
        "SET sql_mode = ''",
        f"INSERT INTO {quote_table(table)} (id, dt, dtt, ts, yr, en) VALUES "
        "(4, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', 0, 'nope')",
        "SET sql_mode = DEFAULT",
        "SET time_zone = '+00:00'",
    )


def test_every_type_decodes_exactly_from_the_log(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    table = TableId(db, "all_types")
    start = dialect.head_position()
    create_all_types(sql, table)
    run_statements(
        sql,
        f"UPDATE {quote_table(table)} SET vc = 'ü😀', tm6 = '00:00:01.5', bt64 = 0 WHERE id = 1",
        f"DELETE FROM {quote_table(table)} WHERE id = 2",
    )
    schema = dialect.table_schema(table)
    reader = dialect.open_log(start, [table])
    try:
        txns = read_until(reader, 7)  # CREATE TABLE (DDL) + 4 inserts + update + delete
    finally:
        reader.close()
    assert isinstance(txns[0].items[0], SchemaChange)
    events = changes(txns)
    assert [e.op for e in events] == [Op.CREATE] * 4 + [Op.UPDATE, Op.DELETE]
    inserted = {e.key: e.after for e in events[:4]}
    assert inserted[(1,)] == MAX_EXPECTED
    assert inserted[(2,)] == MIN_EXPECTED
    assert inserted[(3,)] == NULL_EXPECTED
    assert inserted[(4,)] == ZERO_EXPECTED
    update, delete = events[4], events[5]
    assert update.before == MAX_EXPECTED
    assert update.after == MAX_EXPECTED | {"vc": "ü😀", "tm6": "00:00:01.500000", "bt64": 0}
    assert delete.key == (2,) and delete.before == MIN_EXPECTED and delete.after is None
    for txn in txns[1:]:
        assert txn.schemas == {table: schema}  # the log's own metadata == information_schema
    types = {c.name: c.spark_type for c in schema.columns}
    assert types == {
        "id": "INT", "ti": "TINYINT", "tiu": "SMALLINT", "b": "TINYINT", "si": "SMALLINT",
        "siu": "INT", "mi": "INT", "miu": "INT", "i": "INT", "iu": "BIGINT", "bi": "BIGINT",
        "biu": "DECIMAL(20,0)", "d": "DECIMAL(12,4)", "d0": "DECIMAL(5,5)", "dbig": "STRING",
        "fl": "FLOAT", "db": "DOUBLE", "dt": "DATE", "dtt": "TIMESTAMP_NTZ",
        "dt0": "TIMESTAMP_NTZ", "ts": "TIMESTAMP", "tm": "STRING", "tm6": "STRING",
        "yr": "INT", "c": "STRING", "vc": "STRING", "tx": "STRING", "mtx": "STRING",
        "bl": "BINARY", "bn": "BINARY", "vb": "BINARY", "js": "STRING", "en": "STRING",
        "st": "STRING", "bt": "BIGINT", "bt64": "BIGINT",
    }
    assert schema.key == ("id",) and not schema.column("id").nullable


def test_log_rows_and_chunk_rows_agree(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    table = TableId(db, "all_types")
    start = dialect.head_position()
    create_all_types(sql, table)
    run_statements(sql, f"UPDATE {quote_table(table)} SET d = -0.5, st = 'y' WHERE id = 2")
    schema = dialect.table_schema(table)
    latest: dict[Any, Any] = {}
    for event in logged_changes(dialect, start, table, 6):
        latest[event.key] = event.after
    log_rows = [latest[k] for k in sorted(latest)]
    from_log = spark.createDataFrame(
        [tuple(r[c] for c in schema.names) for r in log_rows], spark_schema(schema)
    ).collect()
    chunk = read_chunk(spark, dialect, ChunkSpec(table, limit=100), schema)
    assert [(f.name, f.dataType) for f in chunk.schema] == [
        (f.name, f.dataType) for f in spark_schema(schema)
    ]
    from_chunk = chunk.collect()
    assert len(from_log) == 4
    assert from_chunk == from_log


def test_columns_a_chunk_selects_bare_read_as_the_log_decodes_them(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    """Integers and variable-length text are selected without a server-side CAST (each
    CAST cost the server CPU on every row): zero-filled and unsigned integers, text in
    another character set and every TEXT size still read exactly as the log gives them."""
    table = TableId(db, "bare")
    run_statements(
        sql,
        f"CREATE TABLE {quote_table(table)} (id BIGINT UNSIGNED ZEROFILL NOT NULL PRIMARY KEY,"
        " zf INT(6) UNSIGNED ZEROFILL, ti TINYINT(1), tiu TINYINT UNSIGNED,"
        " mi MEDIUMINT UNSIGNED, l1 VARCHAR(20) CHARACTER SET latin1,"
        " vb VARCHAR(10) COLLATE utf8mb4_bin, tt TINYTEXT, lt LONGTEXT CHARACTER SET latin1)",
    )
    start = dialect.head_position()
    rows = [
        (18446744073709551615, 42, -128, 255, 16777215, "Grüße ½", "a  ", "t", "ÿ" * 5000),
        (7, 999999, 1, 0, 0, "", "", "", ""),
        (8, None, None, None, None, None, None, None, None),
    ]
    with sql.cursor() as cur:
        cur.executemany(f"INSERT INTO {quote_table(table)} VALUES "
                        "(%s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)
    schema = dialect.table_schema(table)
    events = logged_changes(dialect, start, table, 1)
    assert len(events) == 3
    from_log = spark.createDataFrame(
        [tuple(e.after[c] for c in schema.names) for e in sorted(events, key=lambda e: e.key)],
        spark_schema(schema),
    ).collect()
    chunk = read_chunk(spark, dialect, ChunkSpec(table, limit=100), schema)
    assert chunk.collect() == from_log
    assert from_log[2]["id"] == Decimal(18446744073709551615)
    assert from_log[2]["l1"] == "Grüße ½" and from_log[2]["vb"] == "a  "


# -- chunks ---------------------------------------------------------------------------------


def test_composite_key_chunks_walk_the_table_once_in_order(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    table = TableId(db, "composite")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (a INT NOT NULL, b VARCHAR(20)"
                        " NOT NULL, v INT, PRIMARY KEY (a, b))")
    names = ["x", "Y", "é", "中", "a b", "it's", "`q`", "z😀"]
    rows = [(a, n, a * 100 + i) for a in range(1, 6) for i, n in enumerate(names)]
    with sql.cursor() as cur:
        cur.executemany(f"INSERT INTO {quote_table(table)} VALUES (%s, %s, %s)", rows)
        cur.execute(f"SELECT a, b FROM {quote_table(table)} ORDER BY a, b")
        db_order = [tuple(r) for r in cur.fetchall()]
    schema = dialect.table_schema(table)
    assert schema.key == ("a", "b")
    seen: list[tuple[Any, ...]] = []
    after = None
    while True:
        chunk = read_chunk(spark, dialect, ChunkSpec(table, 7, after_key=after), schema)
        keys = [(r["a"], r["b"]) for r in chunk.collect()]
        if not keys:
            break
        assert len(keys) <= 7
        seen += keys
        after = keys[-1]
    assert seen == db_order and len(set(seen)) == len(rows)
    bounded = read_chunk(
        spark, dialect, ChunkSpec(table, 100, after_key=db_order[3], upper_key=db_order[20]),
        schema,
    )
    assert [(r["a"], r["b"]) for r in bounded.collect()] == db_order[4:21]


def test_a_planned_chunk_is_streamed_in_key_order_not_materialized(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    """A chunk bounded by planned keys has no LIMIT, so MariaDB merges the subquery Spark's
    JDBC reader wraps it in (one with a LIMIT is materialized whole in a temporary table
    before the first row is sent), and its rows still come in the database's key order."""
    table = TableId(db, "planned")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (a INT NOT NULL, b VARCHAR(20)"
                        " NOT NULL, v INT, PRIMARY KEY (a, b))")
    names = ["x", "Y", "é", "中", "a b", "it's", "z😀"]
    with sql.cursor() as cur:
        cur.executemany(f"INSERT INTO {quote_table(table)} VALUES (%s, %s, %s)",
                        [(a, n, a) for a in range(1, 6) for n in names])
        cur.execute(f"SELECT a, b FROM {quote_table(table)} ORDER BY a, b")
        db_order = [tuple(r) for r in cur.fetchall()]
    schema = dialect.table_schema(table)

    def select_types(spec: ChunkSpec) -> set[str]:
        with sql.cursor() as cur:
            cur.execute(f"EXPLAIN SELECT * FROM ({dialect.chunk_sql(spec, schema)}) "
                        "SPARK_GEN_SUBQ_0")
            return {str(row[1]) for row in cur.fetchall()}

    planned = ChunkSpec(table, None, after_key=db_order[3], upper_key=db_order[30])
    assert select_types(planned) == {"SIMPLE"}
    assert "DERIVED" in select_types(ChunkSpec(table, 27, after_key=db_order[3]))
    got = read_chunk(spark, dialect, planned, schema).collect()
    assert [(r["a"], r["b"]) for r in got] == db_order[4:31]


def test_chunk_keys_list_and_where_filter(
    dialect: MySqlDialect, sql: Any, db: str, spark: SparkSession
) -> None:
    table = TableId(db, "filtered")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (a INT NOT NULL, b CHAR(3) NOT NULL,"
                        " v INT, PRIMARY KEY (a, b))")
    with sql.cursor() as cur:
        cur.executemany(f"INSERT INTO {quote_table(table)} VALUES (%s, %s, %s)",
                        [(a, b, a) for a in range(10) for b in ("p", "q")])
    schema = dialect.table_schema(table)
    wanted = [(1, "q"), (3, "p"), (7, "q"), (42, "x")]
    got = read_chunk(spark, dialect, ChunkSpec(table, 10, keys=wanted), schema).collect()
    assert [(r["a"], r["b"]) for r in got] == [(1, "q"), (3, "p"), (7, "q")]
    got = read_chunk(spark, dialect, ChunkSpec(table, 10, after_key=(2, "p"), where="v % 2 = 1"
                                               " -- odd values only"), schema).collect()
    assert [(r["a"], r["b"]) for r in got] == [
        (3, "p"), (3, "q"), (5, "p"), (5, "q"), (7, "p"), (7, "q"), (9, "p"), (9, "q")
    ]
    got = read_chunk(spark, dialect, ChunkSpec(table, 10, keys=[]), schema).collect()
    assert got == []


def test_hostile_identifiers_round_trip(
    services: Endpoints, sql: Any, spark: SparkSession
) -> None:
    database = f"db `q' é 中 {uuid.uuid4().hex[:6]}"
    table = TableId(database, "t `x' \"ü\" 表")
    key_col, val_col = "`id` 'k'", "va lue `é` \"q\""
    run_statements(sql, f"CREATE DATABASE {quote_ident(database)}")
    d = MySqlDialect(make_settings(services, watermark_database=database))
    try:
        start = d.head_position()
        run_statements(
            sql,
            f"CREATE TABLE {quote_table(table)} ({quote_ident(key_col)} VARCHAR(20) NOT NULL"
            f" PRIMARY KEY, {quote_ident(val_col)} TEXT)",
            (f"INSERT INTO {quote_table(table)} VALUES (%s, %s), (%s, %s)",
             ("k'1`", "v😀", "k 2", "'; DROP TABLE x; --")),
        )
        schema = d.table_schema(table)
        assert schema.names == (key_col, val_col) and schema.key == (key_col,)
        reader = d.open_log(start, [table])
        try:
            txns = read_until(reader, 2)
        finally:
            reader.close()
        events = changes(txns)
        assert [e.table for e in events] == [table, table]
        assert [e.key for e in events] == [("k'1`",), ("k 2",)]
        assert events[1].after == {key_col: "k 2", val_col: "'; DROP TABLE x; --"}
        assert txns[1].schemas[table] == schema
        with sql.cursor() as cur:
            cur.execute(f"SELECT * FROM {quote_table(table)} ORDER BY {quote_ident(key_col)}")
            in_order = [tuple(r) for r in cur.fetchall()]
        rows = read_chunk(spark, d, ChunkSpec(table, 10), schema).collect()
        assert [tuple(r) for r in rows] == in_order
        assert list(rows[0].asDict()) == [key_col, val_col]
        rows = read_chunk(spark, d, ChunkSpec(table, 10, after_key=in_order[0][:1]),
                          schema).collect()
        assert [tuple(r) for r in rows] == in_order[1:]
        rows = read_chunk(spark, d, ChunkSpec(table, 10, keys=[("k 2",)]), schema).collect()
        assert [tuple(r) for r in rows] == [("k 2", "'; DROP TABLE x; --")]
    finally:
        d.close()
        run_statements(sql, f"DROP DATABASE {quote_ident(database)}")


# -- transactions and positions ---------------------------------------------------------------


def test_multi_row_transaction_and_primary_key_update(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    table = TableId(db, "tx")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (id INT PRIMARY KEY, v VARCHAR(10))")
    start = dialect.head_position()
    t = quote_table(table)
    run_statements(
        sql, "BEGIN", f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        f"UPDATE {t} SET v = 'bb' WHERE id = 2", f"UPDATE {t} SET id = 10 WHERE id = 1",
        f"DELETE FROM {t} WHERE id = 3", "COMMIT",
        "BEGIN", f"INSERT INTO {t} VALUES (99, 'gone')", "ROLLBACK",
        f"UPDATE {t} SET id = id + 100",
    )
    reader = dialect.open_log(start, [table])
    try:
        first, second = read_until(reader, 2)
        assert reader.read(max_transactions=5, max_wait_s=0.3) == []
    finally:
        reader.close()
    ops = [(e.op, e.key) for e in changes([first])]
    assert ops == [
        (Op.CREATE, (1,)), (Op.CREATE, (2,)), (Op.CREATE, (3,)), (Op.UPDATE, (2,)),
        (Op.DELETE, (1,)), (Op.CREATE, (10,)), (Op.DELETE, (3,)),
    ]
    positions = [i.position for i in first.items]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    delete, create = first.items[4], first.items[5]
    assert isinstance(delete, ChangeEvent) and isinstance(create, ChangeEvent)
    assert delete.position.lsn == create.position.lsn
    assert create.position.seq == delete.position.seq + 1
    assert delete.before == {"id": 1, "v": "a"} and create.after == {"id": 10, "v": "a"}
    assert first.position == dialect.to_position(first.resume) > positions[-1]
    assert set(first.resume) == {"file", "pos"}
    assert first.commit_ts_ms is not None and all(
        isinstance(i, ChangeEvent) and i.commit_ts_ms == first.commit_ts_ms for i in first.items
    )
    # the multi-row PK update: every row becomes DELETE + CREATE
    assert sorted((e.op.value, e.key) for e in changes([second])) == sorted(
        [("d", (2,)), ("c", (102,)), ("d", (10,)), ("c", (110,))]
    )
    assert second.position > first.position


def test_reads_resume_without_loss_and_watermarks_are_events(
    dialect: MySqlDialect, sql: Any, db: str
) -> None:
    table = TableId(db, "wm")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (id INT PRIMARY KEY)")
    dialect.ensure_watermark_table()
    dialect.ensure_watermark_table()  # idempotent
    start = dialect.head_position()
    low, high = str(uuid.uuid4()), str(uuid.uuid4())
    dialect.write_watermark(low)
    run_statements(sql, f"INSERT INTO {quote_table(table)} VALUES (1)")
    dialect.write_watermark(high)
    run_statements(sql, f"INSERT INTO {quote_table(table)} VALUES (2)")
    reader = dialect.open_log(start, [table])
    got: list[Transaction] = []
    try:
        t0 = time.monotonic()
        while len(got) < 4 and time.monotonic() - t0 < 20:
            got += reader.read(max_transactions=1, max_wait_s=0.5)
        started = time.monotonic()
        assert reader.read(max_transactions=10, max_wait_s=0.5) == []
        assert time.monotonic() - started < 10, "an idle read did not return after its wait"
    finally:
        reader.close()
    assert [type(t.items[0]).__name__ for t in got] == [
        "WatermarkEvent", "ChangeEvent", "WatermarkEvent", "ChangeEvent"
    ]
    wm = got[0].items[0]
    assert isinstance(wm, WatermarkEvent) and wm.value == low and len(got[0].items) == 1
    assert isinstance(got[2].items[0], WatermarkEvent) and got[2].items[0].value == high
    # a new reader from a transaction's resume continues with the next one
    again = dialect.open_log(got[1].resume, [table])
    try:
        rest = read_until(again, 2)
    finally:
        again.close()
    assert [t.position for t in rest] == [got[2].position, got[3].position]


def test_schema_change_between_writes(dialect: MySqlDialect, sql: Any, db: str) -> None:
    table = TableId(db, "evolving")
    t = quote_table(table)
    run_statements(sql, f"CREATE TABLE {t} (id INT PRIMARY KEY, old_col VARCHAR(5),"
                        " e ENUM('a','b'))")
    start = dialect.head_position()
    run_statements(
        sql, f"INSERT INTO {t} VALUES (1, 'one', 'b')",
        f"ALTER TABLE {t} ADD COLUMN new_col DECIMAL(6,2) NOT NULL DEFAULT 1.5",
        f"INSERT INTO {t} VALUES (2, 'two', 'a', 2.25)",
        f"ALTER TABLE {t} DROP COLUMN old_col",
        f"ALTER TABLE {t} MODIFY e ENUM('a','b','c'), ALGORITHM=INSTANT",
        f"INSERT INTO {t} VALUES (3, 'c', 3.75)",
    )
    reader = dialect.open_log(start, [table])
    try:
        txns = read_until(reader, 6)
    finally:
        reader.close()
    kinds = [type(t.items[0]).__name__ for t in txns]
    assert kinds == ["ChangeEvent", "SchemaChange", "ChangeEvent", "SchemaChange",
                     "SchemaChange", "ChangeEvent"]
    ddl = txns[1].items[0]
    assert isinstance(ddl, SchemaChange) and ddl.table == table and "ADD COLUMN" in ddl.statement
    assert [e.after for e in changes(txns)] == [
        {"id": 1, "old_col": "one", "e": "b"},
        {"id": 2, "old_col": "two", "e": "a", "new_col": Decimal("2.25")},
        {"id": 3, "e": "c", "new_col": Decimal("3.75")},
    ]
    assert txns[0].schemas[table].names == ("id", "old_col", "e")
    assert txns[2].schemas[table].names == ("id", "old_col", "e", "new_col")
    assert txns[5].schemas[table] == dialect.table_schema(table)


def test_reader_reconnects_without_loss(dialect: MySqlDialect, sql: Any, db: str) -> None:
    table = TableId(db, "reconnect")
    t = quote_table(table)
    run_statements(sql, f"CREATE TABLE {t} (id INT PRIMARY KEY)")
    start = dialect.head_position()
    run_statements(sql, f"INSERT INTO {t} VALUES (1)", f"INSERT INTO {t} VALUES (2)",
                   "BEGIN", f"INSERT INTO {t} VALUES (3)", f"INSERT INTO {t} VALUES (4)", "COMMIT")
    reader = dialect.open_log(start, [table])
    try:
        (first,) = read_until(reader, 1)
        # drop the binlog connection under the reader (as a network failure would)
        reader._stream._stream_connection._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        rest = read_until(reader, 2)
        assert reader.read(max_transactions=5, max_wait_s=0.3) == []
    finally:
        reader.close()
    assert [[e.key for e in changes([x])] for x in [first, *rest]] == [[(1,)], [(2,)], [(3,), (4,)]]


def test_the_log_connection_keeps_the_gil_between_packets(
    dialect: MySqlDialect, sql: Any, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyMySQL sets its socket's timeout before every packet it reads, and CPython gives up
    the GIL for that call: a reader in its own thread then waited for the GIL at every
    packet while another thread of the process ran Python (the tailer's writer), 14 times
    slower in a measurement. The binlog connection sets the timeout only when it changes."""
    table = TableId(db, "steady")
    t = quote_table(table)
    run_statements(sql, f"CREATE TABLE {t} (id INT PRIMARY KEY)")
    start = dialect.head_position()
    with sql.cursor() as cur:
        for i in range(300):
            cur.execute(f"INSERT INTO {t} VALUES (%s)", (i,))
    calls: list[float | None] = []
    settimeout = socket.socket.settimeout

    def counted(sock: socket.socket, value: float | None) -> None:
        if any("pymysqlreplication" in f.filename for f in traceback.extract_stack()):
            calls.append(value)  # by the binlog connections (the dialect has its own)
        settimeout(sock, value)

    monkeypatch.setattr(socket.socket, "settimeout", counted)
    reader = dialect.open_log(start, [table])
    try:
        got = read_until(reader, 1)  # connected: each connection set its timeouts
        calls.clear()
        got += read_until(reader, 299)
    finally:
        reader.close()
    assert [e.key for e in changes(got)] == [(i,) for i in range(300)]
    assert len(calls) <= 2, f"{len(calls)} socket timeouts set for 299 transactions"


def test_rotation_changes_the_file(dialect: MySqlDialect, sql: Any, db: str) -> None:
    table = TableId(db, "rot")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (id INT PRIMARY KEY)")
    start = dialect.head_position()
    run_statements(sql, f"INSERT INTO {quote_table(table)} VALUES (1)", "FLUSH BINARY LOGS",
                   f"INSERT INTO {quote_table(table)} VALUES (2)")
    reader = dialect.open_log(start, [table])
    try:
        first, second = read_until(reader, 2)
    finally:
        reader.close()
    assert first.resume["file"] == start["file"]
    assert second.resume["file"] != start["file"]
    assert dialect.to_position(second.resume) > dialect.to_position(first.resume)
    assert second.items[0].position.binlog_file_index > first.position.binlog_file_index


def test_purged_or_unknown_positions_are_refused(dialect: MySqlDialect) -> None:
    with pytest.raises(LogPurgedError, match="dblog capture"):
        dialect.open_log({"file": "mysql-bin.000000", "pos": 4}, [])
    head = dialect.head_position()
    with pytest.raises(LogPurgedError, match="dblog capture"):
        dialect.open_log({"file": head["file"], "pos": head["pos"] + 10**9}, [])
    with pytest.raises(LogPurgedError):
        dialect.open_log({"file": "mysql-bin.999999", "pos": 4}, [])
