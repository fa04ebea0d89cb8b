# ruff: noqa: S608 - test SQL is built from quote_ident/quote_table and constants
"""Server settings and schemas the MariaDB source refuses, against the real local server."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pymysql
import pytest

from pipeline.errors import SourceError
from pipeline.sources.mysql import MySqlDialect, MySqlSettings
from pipeline.sources.mysql.sqltext import quote_ident

if TYPE_CHECKING:
    from pipeline.services import Endpoints

pytestmark = pytest.mark.integration


def make_settings(ep: Endpoints, **overrides: Any) -> MySqlSettings:
    values: dict[str, Any] = {
        "name": "mariadb", "host": ep.host, "port": ep.mariadb_port, "user": ep.user,
        "password": ep.mariadb_password, "server_id": random.randint(7800, 7899),
    }
    values.update(overrides)
    return MySqlSettings(**values)


@pytest.fixture
def sql(services: Endpoints) -> Iterator[Any]:
    conn = pymysql.connect(
        host=services.host, port=services.mariadb_port, user=services.user,
        password=services.mariadb_password, autocommit=True, charset="utf8mb4",
    )
    yield conn
    conn.close()


@pytest.fixture
def db(sql: Any) -> Iterator[str]:
    name = f"t_settings_{uuid.uuid4().hex[:10]}"
    with sql.cursor() as cur:
        cur.execute(f"CREATE DATABASE {quote_ident(name)}")
    yield name
    with sql.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)}")


@pytest.fixture
def dialect(services: Endpoints, db: str) -> Iterator[MySqlDialect]:
    d = MySqlDialect(make_settings(services, watermark_database=db))
    yield d
    d.close()


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
    if original is None:
        pytest.skip("this server has no log_bin_compress")
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
