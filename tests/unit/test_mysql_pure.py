"""Pure parts of the MariaDB/MySQL source: checks, type mapping, value decoding, SQL text."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblog.core.errors import ConfigError
from dblog.core.events import TableId
from dblog.sources.base import ChunkSpec, Column, TableSchema
from dblog.sources.mysql import MySqlDialect, MySqlSettings
from dblog.sources.mysql.binlog import binlog_file_index, native_position
from dblog.sources.mysql.checks import check_privileges, check_server_variables
from dblog.sources.mysql.snapshot import build_chunk_sql, source_type_of
from dblog.sources.mysql.sqltext import literal, quote_ident
from dblog.sources.mysql.statements import ddl_targets
from dblog.sources.mysql.types import (
    SourceType,
    binlog_converter,
    fix_negative_time2,
    format_time,
)

GOOD = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL"}


def settings(**kw: Any) -> MySqlSettings:
    values: dict[str, Any] = {"name": "m", "host": "db.example", "port": 3306, "user": "u",
                              "password": "s3cret-pw"}
    values.update(kw)
    return MySqlSettings(**values)


# -- checks ---------------------------------------------------------------------------------


def test_good_server_variables_pass() -> None:
    assert check_server_variables(GOOD) == []
    assert check_server_variables(GOOD | {"log_bin": 1, "binlog_format": "row"}) == []


@pytest.mark.parametrize(("name", "value"), [
    ("log_bin", "OFF"), ("binlog_format", "MIXED"), ("binlog_format", "STATEMENT"),
    ("binlog_row_image", "MINIMAL"), ("binlog_row_metadata", "MINIMAL"),
])
def test_misconfigured_variable_is_named_with_its_fix(name: str, value: str) -> None:
    problems = check_server_variables(GOOD | {name: value})
    assert len(problems) == 1
    assert problems[0].startswith(f"{name} is {value}, DBLog needs {GOOD[name]}")
    assert "configuration" in problems[0]


def test_missing_row_metadata_variable_means_old_server() -> None:
    variables = dict(GOOD)
    del variables["binlog_row_metadata"]
    (problem,) = check_server_variables(variables)
    assert "binlog_row_metadata is not available" in problem and "10.5" in problem


def test_privileges() -> None:
    grantee = "'u'@'h'"
    assert check_privileges(["ALL PRIVILEGES"], has_select=False, grantee=grantee) == []
    assert check_privileges(["REPLICATION SLAVE", "BINLOG MONITOR", "SELECT"],
                            has_select=False, grantee=grantee) == []
    assert check_privileges(["REPLICATION SLAVE", "REPLICATION CLIENT"], has_select=True,
                            grantee=grantee) == []
    problems = check_privileges(["SELECT"], has_select=False, grantee=grantee)
    assert len(problems) == 2
    assert "GRANT REPLICATION SLAVE ON *.* TO 'u'@'h'" in problems[0]
    assert "BINLOG MONITOR" in problems[1]
    (problem,) = check_privileges(["REPLICATION SLAVE", "SUPER"], has_select=False,
                                  grantee=grantee)
    assert "SELECT" in problem


# -- settings and positions -----------------------------------------------------------------


def test_password_never_in_repr() -> None:
    s = settings()
    assert "s3cret-pw" not in repr(s)
    assert "s3cret-pw" not in repr(MySqlDialect(s))


def test_jdbc_options() -> None:
    opts = MySqlDialect(settings()).jdbc_options()
    assert opts["driver"] == "org.mariadb.jdbc.Driver"
    assert opts["url"].startswith("jdbc:mysql://db.example:3306/?permitMysqlScheme&")
    assert "tinyInt1isBit=false" in opts["url"] and "connectionTimeZone=UTC" in opts["url"]
    assert "useServerPrepStmts=true" in opts["url"]  # result rows in the binary protocol
    assert "s3cret-pw" not in opts["url"] and opts["password"] == "s3cret-pw"


def test_binlog_positions() -> None:
    assert binlog_file_index("mysql-bin.000042") == 42
    assert binlog_file_index("host-relay.bin.1234567") == 1234567
    d = MySqlDialect(settings())
    pos = d.to_position({"file": "mysql-bin.000003", "pos": 1234})
    assert (pos.binlog_file_index, pos.binlog_offset, pos.seq) == (3, 1234, 0)
    assert d.to_position({"file": "b.000004", "pos": 4}) > pos
    for bad in ({"file": "mysql-bin", "pos": 4}, {"file": "x.00a", "pos": 4},
                {"file": "x.000001", "pos": 2}, {"file": "x.000001", "pos": "4"},
                {"pos": 4}, {"file": "x.000001", "pos": 2**32}):
        with pytest.raises(ConfigError):
            native_position(bad)


# -- types ----------------------------------------------------------------------------------

MAPPING = {
    "tinyint": "TINYINT", "tinyint unsigned": "SMALLINT", "smallint": "SMALLINT",
    "smallint unsigned": "INT", "mediumint": "INT", "mediumint unsigned": "INT", "int": "INT",
    "int unsigned": "BIGINT", "bigint": "BIGINT", "bigint unsigned": "DECIMAL(20,0)",
    "decimal(10,2)": "DECIMAL(10,2)", "decimal(65,30)": "STRING", "float": "FLOAT",
    "double": "DOUBLE", "date": "DATE", "datetime(6)": "TIMESTAMP_NTZ",
    "timestamp(3)": "TIMESTAMP", "time(0)": "STRING", "year": "INT", "char": "STRING",
    "varchar": "STRING", "text": "STRING", "longtext": "STRING", "json": "STRING",
    "enum": "STRING", "set": "STRING", "binary(16)": "BINARY", "varbinary": "BINARY",
    "blob": "BINARY", "tinyblob": "BINARY", "bit(1)": "BIGINT", "bit(64)": "BIGINT",
}


@pytest.mark.parametrize(("source", "spark"), sorted(MAPPING.items()))
def test_type_mapping_round_trips(source: str, spark: str) -> None:
    st_ = source_type_of(source, spark)
    assert st_.name == source and st_.spark_type == spark


def test_information_schema_rows() -> None:
    from dblog.sources.mysql.types import from_information_schema

    def row(data_type: str, column_type: str, **kw: Any) -> dict[str, Any]:
        return {"DATA_TYPE": data_type, "COLUMN_TYPE": column_type} | kw

    assert from_information_schema(row("int", "int(10) unsigned"), "c").name == "int unsigned"
    assert from_information_schema(row("tinyint", "tinyint(1)"), "c").spark_type == "TINYINT"
    assert from_information_schema(
        row("decimal", "decimal(5,2) unsigned", NUMERIC_PRECISION=5, NUMERIC_SCALE=2), "c"
    ).name == "decimal(5,2)"
    assert from_information_schema(
        row("timestamp", "timestamp(6)", DATETIME_PRECISION=6), "c"
    ).spark_type == "TIMESTAMP"
    assert from_information_schema(
        row("binary", "binary(4)", CHARACTER_OCTET_LENGTH=4), "c"
    ).name == "binary(4)"
    with pytest.raises(Exception, match="type point is not supported"):
        from_information_schema(row("point", "point"), "table t column 'g'")


def test_time_formatting_and_negative_time_fix() -> None:
    assert format_time(dt.timedelta(hours=838, minutes=59, seconds=59), 3) == "838:59:59.000"
    assert format_time(dt.timedelta(seconds=1, microseconds=500000), 6) == "00:00:01.500000"
    assert format_time(-dt.timedelta(hours=1, minutes=2, seconds=3), 0) == "-01:02:03"
    # mysql-replication 1.0.17 decodes -12:34:56.789 as -(12:34:57 - 0.789)
    decoded = dt.timedelta(days=-1, seconds=41103, microseconds=789000)
    assert format_time(fix_negative_time2(decoded), 3) == "-12:34:56.789"
    assert fix_negative_time2(-dt.timedelta(seconds=5)) == -dt.timedelta(seconds=5)
    assert fix_negative_time2(dt.timedelta(seconds=5, microseconds=7)) == dt.timedelta(
        seconds=5, microseconds=7)


@given(st.integers(min_value=-(838 * 3600 + 59 * 60 + 59) * 10**6 + 1, max_value=-1))
def test_negative_time_fix_inverts_the_library(micros: int) -> None:
    true = dt.timedelta(microseconds=micros)
    magnitude = -micros
    whole, frac = divmod(magnitude, 10**6)
    if frac:  # what the library computes: -((whole + 1) seconds - frac)
        library = -dt.timedelta(seconds=whole + 1, microseconds=-frac)
    else:
        library = true
    assert fix_negative_time2(library) == true


def test_binlog_converters() -> None:
    def conv(st_: SourceType, value: Any, set_values: tuple[str, ...] = ()) -> Any:
        fn = binlog_converter(st_, set_values)
        return value if fn is None else fn(value)

    assert conv(SourceType("bigint", unsigned=True), 2**64 - 1) == Decimal(2**64 - 1)
    assert conv(SourceType("bit", precision=10), "1000000001") == 513
    assert conv(SourceType("bit", precision=64), "1" * 64) == -1
    assert conv(SourceType("year"), 1900) == 0 and conv(SourceType("year"), 2024) == 2024
    assert conv(SourceType("set"), {"z", "x"}, ("x", "y", "z")) == "x,z"
    assert conv(SourceType("binary", precision=4), b"\x01") == b"\x01\x00\x00\x00"
    assert conv(SourceType("binary", precision=2), "") == b"\x00\x00"
    assert conv(SourceType("varbinary"), "") == b""
    assert conv(SourceType("decimal", precision=50, scale=10), Decimal("-1E-10")) == (
        "-0.0000000001")
    ts = conv(SourceType("timestamp", precision=6), dt.datetime(2024, 1, 2, 3, 4, 5, 6))
    assert ts == dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert conv(SourceType("timestamp"), dt.datetime(1970, 1, 1)) is None  # zero TIMESTAMP
    assert conv(SourceType("json"), {b"a": [1, b"x"]}) == '{"a": [1, "x"]}'
    assert binlog_converter(SourceType("int")) is None


# -- SQL text -------------------------------------------------------------------------------


def test_quote_ident() -> None:
    assert quote_ident("a`b") == "`a``b`"
    assert quote_ident("it's é 中") == "`it's é 中`"
    for bad in ("", "a\x00b"):
        with pytest.raises(ConfigError):
            quote_ident(bad)


def test_literals() -> None:
    assert literal(42) == "42" and literal(-7) == "-7" and literal(True) == "1"
    assert literal(Decimal("-12.50")) == "-12.50"
    assert literal(Decimal("1E+3")) == "1000"
    assert literal(0.1) == "0.1"
    assert literal("a'b") == "_utf8mb4 X'612762'"
    assert literal("😀") == "_utf8mb4 X'f09f9880'"
    assert literal(b"\x00'") == "X'0027'"
    assert literal(dt.date(2024, 2, 29)) == "DATE'2024-02-29'"
    assert literal(dt.datetime(2024, 1, 2, 3, 4, 5)) == "TIMESTAMP'2024-01-02 03:04:05.000000'"
    aware = dt.datetime(2024, 1, 2, 8, 4, 5, 7, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    assert literal(aware) == "TIMESTAMP'2024-01-02 03:04:05.000007'"
    for bad in (None, Decimal("NaN"), float("inf"), object(), [1], "\ud800"):
        with pytest.raises(ConfigError):
            literal(bad)


@given(st.text() | st.binary())
def test_string_literals_are_hex_only(value: str | bytes) -> None:
    try:
        text = literal(value)
    except ConfigError:
        return  # lone surrogates
    assert re.fullmatch(r"(_utf8mb4 )?X'[0-9a-f]*'", text)


def schema_of(table: TableId, *cols: tuple[str, str, str], key: tuple[str, ...]) -> TableSchema:
    return TableSchema(table, tuple(Column(n, s, True, src) for n, s, src in cols), key)


def test_chunk_sql_shape() -> None:
    table = TableId("d`b", "t 1")
    schema = schema_of(table, ("a", "INT", "int"), ("b`", "STRING", "varchar"),
                       ("ts", "TIMESTAMP", "timestamp(6)"), ("x", "BIGINT", "bit(3)"),
                       key=("a", "b`"))
    sql = build_chunk_sql(ChunkSpec(table, 50, after_key=(1, "x'"), upper_key=(9, "z")), schema)
    assert sql.startswith(
        "SELECT `a` AS `_c0`, `b``` AS `_c1`, "
        "CAST(`ts` AS SIGNED) AS `_c2`, MICROSECOND(`ts`) AS `_c3`, "
        "CAST(`x` AS SIGNED) AS `_c4` FROM `d``b`.`t 1` WHERE ")
    assert sql.endswith(" ORDER BY `d``b`.`t 1`.`a`, `d``b`.`t 1`.`b``` LIMIT 50")
    assert "(`a` >= 1 AND ((`a` > 1) OR (`a` = 1 AND `b``` > _utf8mb4 X'7827')))" in sql
    assert "`a` <= 9 AND" in sql and "x'" not in sql.replace("X'", "")
    keyed = build_chunk_sql(ChunkSpec(table, 5, keys=[(1, "p"), (2, "q")], where="a > 0"),
                            schema)
    assert ("WHERE ((`a` = 1 AND `b``` = _utf8mb4 X'70') OR (`a` = 2 AND `b``` = "
            "_utf8mb4 X'71')) AND (\na > 0\n) ORDER BY") in keyed
    assert " WHERE 1 = 0 " in build_chunk_sql(ChunkSpec(table, 5, keys=[]), schema)
    assert " WHERE " not in build_chunk_sql(ChunkSpec(table, 5), schema)


def test_a_planned_chunk_select_has_no_limit() -> None:
    table = TableId("d", "t")
    schema = schema_of(table, ("a", "INT", "int"), ("v", "STRING", "varchar"), key=("a",))
    planned = build_chunk_sql(ChunkSpec(table, None, after_key=(1,), upper_key=(9,)), schema)
    assert planned.endswith(" WHERE ((`a` > 1)) AND ((`a` <= 9)) ORDER BY `d`.`t`.`a`")
    assert "LIMIT" not in planned


def test_chunk_sql_refuses_bad_input() -> None:
    table = TableId("d", "t")
    schema = schema_of(table, ("a", "INT", "int"), key=("a",))
    for spec in (ChunkSpec(table, 0), ChunkSpec(table, 5, after_key=(object(),)),
                 ChunkSpec(table, 5, after_key=(1, 2)), ChunkSpec(table, 5, keys=[(None,)])):
        with pytest.raises(ConfigError):
            build_chunk_sql(spec, schema)
    with pytest.raises(ConfigError):
        MySqlDialect(settings()).chunk_sql(ChunkSpec(TableId("d", "other"), 5), schema)


# -- DDL ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "tables", "dbs"), [
    ("ALTER TABLE t ADD COLUMN c INT", [("d", "t")], []),
    ("alter online ignore table `x`.`we``ird` drop c", [("x", "we`ird")], []),
    ("/* c */ CREATE TABLE IF NOT EXISTS x.t (a INT)", [("x", "t")], []),
    ("CREATE OR REPLACE TABLE t2 LIKE t", [("d", "t2")], []),
    ("DROP TABLE IF EXISTS `a`, b.c /* generated by server */", [("d", "a"), ("b", "c")], []),
    ("TRUNCATE t", [("d", "t")], []),
    ("TRUNCATE TABLE x.t", [("x", "t")], []),
    ("RENAME TABLE a TO b, x.c TO x.d", [("d", "a"), ("d", "b"), ("x", "c"), ("x", "d")], []),
    ("ALTER TABLE a RENAME TO b", [("d", "a"), ("d", "b")], []),
    ("ALTER TABLE a RENAME COLUMN x TO y", [("d", "a")], []),
    ("CREATE UNIQUE INDEX i ON x.t (a)", [("x", "t")], []),
    ("DROP INDEX i ON t", [("d", "t")], []),
    ("DROP DATABASE IF EXISTS `x`", [], ["x"]),
    ("INSERT INTO t VALUES (1)", [], []),
    ("SAVEPOINT s", [], []),
    ("CREATE DATABASE x", [], []),
    ("GRANT SELECT ON t TO u", [], []),
])
def test_ddl_targets(sql: str, tables: list[tuple[str, str]], dbs: list[str]) -> None:
    got_tables, got_dbs = ddl_targets(sql, "d")
    assert got_tables == [TableId(*t) for t in tables]
    assert got_dbs == dbs


def test_a_replica_with_the_same_server_id_is_named_with_its_fix() -> None:
    import pymysql

    from dblog.core.errors import SourceError, SourceUnavailable
    from dblog.sources.mysql.connection import translate

    settings = MySqlSettings("main", "127.0.0.1", 13306, "dblog", "pw", server_id=7001)
    error = translate(pymysql.err.OperationalError(
        4052, "A slave with the same server_uuid/server_id as this slave has connected"),
        settings, "reading the binlog")
    assert isinstance(error, SourceError) and not isinstance(error, SourceUnavailable)
    assert "same server_id (7001)" in str(error) and "source.server_id" in str(error)
