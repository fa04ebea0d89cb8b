"""Pure checks of the MariaDB/MySQL source: settings under which changes silently go missing,
temporal key columns that zero dates could collapse, and whether Spark orders keys like the
database."""

from __future__ import annotations

import pytest

from pipeline.sources.mysql.checks import check_server_variables

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
