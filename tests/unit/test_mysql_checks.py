"""Pure checks of the MariaDB/MySQL source: settings under which changes silently go missing,
temporal key columns that zero dates could collapse, and whether Spark orders keys like the
database."""

from __future__ import annotations

import datetime as dt

import pytest

from dblog.core.events import ChangeEvent, Op, Position, TableId
from dblog.sources.base import Column, TableSchema, Transaction
from dblog.sources.mysql.checks import (
    check_server_variables,
    check_temporal_key,
    null_key_problem,
    zero_date_loopholes,
)
from dblog.sources.mysql.types import SourceType, spark_orders_like_source

GOOD = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL"}


# -- settings that silently drop changes -----------------------------------------------------


@pytest.mark.parametrize(("name", "value", "fix"), [
    ("binlog_transaction_compression", "ON", "SET GLOBAL binlog_transaction_compression=OFF"),
    ("binlog_transaction_compression", "1", "SET GLOBAL binlog_transaction_compression=OFF"),
    ("log_bin_compress", "ON", "SET GLOBAL log_bin_compress=OFF"),
    ("log_bin_compress", "on", "SET GLOBAL log_bin_compress=OFF"),
    ("binlog_order_commits", "OFF", "SET GLOBAL binlog_order_commits=ON"),
    ("binlog_order_commits", "0", "SET GLOBAL binlog_order_commits=ON"),
])
def test_setting_that_drops_changes_is_refused_with_its_fix(name: str, value: str, fix: str
                                                             ) -> None:
    problems = check_server_variables(GOOD | {name: value})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{name} is ")
    assert fix in problems[0]
    assert "configuration" in problems[0]


@pytest.mark.parametrize("extra", [
    {},  # MariaDB has no binlog_transaction_compression / binlog_order_commits
    {"log_bin_compress": "OFF"},
    {"binlog_transaction_compression": "OFF", "binlog_order_commits": "ON"},
    {"LOG_BIN_COMPRESS": "0", "Binlog_Order_Commits": "1"},
])
def test_absent_or_safe_settings_pass(extra: dict[str, str]) -> None:
    assert check_server_variables(GOOD | extra) == []


def test_every_problem_is_reported_at_once() -> None:
    problems = check_server_variables(GOOD | {
        "binlog_format": "MIXED", "log_bin_compress": "ON",
        "binlog_transaction_compression": "ON", "binlog_order_commits": "OFF",
    })
    names = [p.split(" ", 1)[0] for p in problems]
    assert names == ["binlog_format", "binlog_transaction_compression", "log_bin_compress",
                     "binlog_order_commits"]


# -- zero dates in key columns ---------------------------------------------------------------

SAFE_MODE = "STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,NO_ENGINE_SUBSTITUTION"
MARIADB_DEFAULT = ("STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,"
                   "NO_ENGINE_SUBSTITUTION")
TABLE = TableId("shop", "days")


@pytest.mark.parametrize(("sql_mode", "loopholes"), [
    (SAFE_MODE, []),
    ("strict_all_tables,no_zero_date,no_zero_in_date", []),
    # what TRADITIONAL expands to in @@sql_mode
    ("STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
     "ERROR_FOR_DIVISION_BY_ZERO,TRADITIONAL,NO_ENGINE_SUBSTITUTION", []),
    (MARIADB_DEFAULT, ["no NO_ZERO_DATE", "no NO_ZERO_IN_DATE"]),
    ("", ["no strict mode (STRICT_TRANS_TABLES)", "no NO_ZERO_DATE", "no NO_ZERO_IN_DATE"]),
    ("NO_ZERO_DATE,NO_ZERO_IN_DATE", ["no strict mode (STRICT_TRANS_TABLES)"]),
    (SAFE_MODE + ",ALLOW_INVALID_DATES", ["ALLOW_INVALID_DATES"]),
])
def test_zero_date_loopholes(sql_mode: str, loopholes: list[str]) -> None:
    assert zero_date_loopholes(sql_mode) == loopholes


@pytest.mark.parametrize("base", ["date", "datetime", "timestamp"])
def test_temporal_key_is_warned_of_when_sql_mode_allows_zero_dates(base: str) -> None:
    problems = check_temporal_key(TABLE, [("id", "int"), ("day", base)], MARIADB_DEFAULT)
    assert len(problems) == 1
    message = problems[0]
    assert message.startswith(
        f"table shop.days: primary key column 'day' is {base.upper()}")
    assert "no NO_ZERO_DATE" in message and "'0000-00-00'" in message
    assert "would stop the tailer and captures of the table" in message
    assert "add STRICT_TRANS_TABLES, NO_ZERO_DATE and NO_ZERO_IN_DATE to sql_mode" in message


def test_temporal_key_passes_under_a_strict_sql_mode_and_other_keys_always() -> None:
    assert check_temporal_key(TABLE, [("day", "date"), ("at", "datetime")], SAFE_MODE) == []
    assert check_temporal_key(TABLE, [("id", "int"), ("name", "varchar")], "") == []
    assert check_temporal_key(TABLE, [("id", "year")], "") == []  # YEAR 0 is the int 0
    assert len(check_temporal_key(TABLE, [("a", "date"), ("b", "timestamp")], "")) == 2


def _txn(*keys: tuple[object, ...]) -> Transaction:
    schema = TableSchema(
        TABLE, (Column("id", "INT", False, "int"), Column("day", "DATE", False, "date")),
        ("id", "day"),
    )
    items = tuple(
        ChangeEvent(TABLE, Op.CREATE, key, Position.from_binlog(3, 1000 + i, 0),
                    after={"id": key[0], "day": key[1]})
        for i, key in enumerate(keys)
    )
    return Transaction(items, {"file": "mysql-bin.000003", "pos": 2000},
                       Position.from_binlog(3, 2000), schemas={TABLE: schema})


def test_null_key_value_in_the_log_is_a_problem() -> None:
    assert null_key_problem(_txn((1, dt.date(2020, 1, 15)))) is None
    problem = null_key_problem(_txn((1, dt.date(2020, 1, 15)), (2, None)))
    assert problem is not None
    assert problem.startswith("shop.days: a change at binlog file 3 offset 1001 has NULL in "
                              "primary key column(s) 'day'")
    assert "`dblog tail --from-head`" in problem


@pytest.mark.parametrize("base", ["date", "datetime"])
def test_year_zero_reads_as_null_in_chunk_selects(base: str) -> None:
    projection = SourceType(base).projection("`d`")
    assert projection.startswith("CASE WHEN YEAR(`d`) > 0 THEN DATE_FORMAT(`d`, ")
    assert projection.endswith(" END")


# -- does Spark order keys like the database? -------------------------------------------------


@pytest.mark.parametrize(("base", "kw", "collation"), [
    ("tinyint", {}, None), ("tinyint", {"unsigned": True}, None),
    ("smallint", {}, None), ("mediumint", {"unsigned": True}, None), ("int", {}, None),
    ("int", {"unsigned": True}, None), ("bigint", {}, None),
    ("bigint", {"unsigned": True}, None),  # DECIMAL(20,0) in the lake: still numeric
    ("decimal", {"precision": 38, "scale": 10}, None),
    ("date", {}, None), ("datetime", {"precision": 6}, None), ("timestamp", {}, None),
    ("year", {}, None),
    ("binary", {"precision": 8}, None), ("varbinary", {}, None), ("blob", {}, None),
    ("longblob", {}, None),
    ("varchar", {}, "utf8mb4_nopad_bin"), ("varchar", {}, "UTF8MB3_NOPAD_BIN"),
    ("text", {}, "utf8mb4_nopad_bin"), ("varchar", {}, "ascii_nopad_bin"),
    ("varchar", {}, "utf8mb4_0900_bin"),  # MySQL 8: NO PAD, code-point order
])
def test_spark_orders_like_source(base: str, kw: dict[str, object], collation: str | None
                                  ) -> None:
    assert spark_orders_like_source(SourceType(base, **kw), collation)  # type: ignore[arg-type]


@pytest.mark.parametrize(("base", "kw", "collation"), [
    ("decimal", {"precision": 39, "scale": 0}, None),  # a STRING in the lake
    ("varchar", {}, "utf8mb4_bin"),  # PAD SPACE: 'a\t' < 'a' in the database
    ("varchar", {}, "utf8mb3_bin"), ("text", {}, "utf8mb4_bin"),
    ("varchar", {}, "utf8mb4_general_ci"), ("varchar", {}, "utf8mb4_unicode_ci"),
    ("varchar", {}, "utf8mb4_0900_ai_ci"),
    ("varchar", {}, "latin1_nopad_bin"),  # cp1252: byte order is not code-point order
    ("varchar", {}, None), ("varchar", {}, ""),
    ("char", {}, "utf8mb4_nopad_bin"),  # trailing spaces dropped on the way to the lake
    ("enum", {}, "utf8mb4_nopad_bin"), ("set", {}, "utf8mb4_nopad_bin"),
    ("time", {"precision": 3}, None), ("float", {}, None), ("double", {}, None),
    ("bit", {"precision": 8}, None), ("bit", {"precision": 64}, None),
    ("json", {}, "utf8mb4_bin"),
])
def test_spark_does_not_order_like_source(base: str, kw: dict[str, object],
                                          collation: str | None) -> None:
    assert not spark_orders_like_source(SourceType(base, **kw), collation)  # type: ignore[arg-type]
