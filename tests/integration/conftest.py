"""Fixtures the integration tests share: the contract suite's source kit (one run per
database), and for the MariaDB source tests a root connection, a scratch database and a
dialect whose watermark table lives in that database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pymysql
import pytest

from dblog.sources.mysql import MySqlDialect
from dblog.sources.mysql.sqltext import quote_ident
from tests.integration.helpers import make_settings
from tests.integration.sources import SourceKit, kit

if TYPE_CHECKING:
    from devtools.services import Endpoints


@pytest.fixture
def sql(services: Endpoints) -> Iterator[Any]:
    """An autocommit connection to the local MariaDB."""
    conn = pymysql.connect(
        host=services.host, port=services.mariadb_port, user=services.user,
        password=services.mariadb_password, autocommit=True, charset="utf8mb4",
    )
    yield conn
    conn.close()


@pytest.fixture
def db(sql: Any) -> Iterator[str]:
    """A fresh database for one test (dropped afterwards)."""
    name = f"t_mysql_{uuid.uuid4().hex[:10]}"
    with sql.cursor() as cur:
        cur.execute(f"CREATE DATABASE {quote_ident(name)}")
    yield name
    with sql.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)}")


@pytest.fixture
def dialect(services: Endpoints, db: str) -> Iterator[MySqlDialect]:
    """A dialect whose watermark table lives in this test's own database."""
    d = MySqlDialect(make_settings(services, watermark_database=db))
    yield d
    d.close()


@pytest.fixture(params=["mariadb", "postgres"])
def source_kit(request: pytest.FixtureRequest, services: Endpoints,
               monkeypatch: pytest.MonkeyPatch) -> SourceKit:
    """The contract suite's source: every test using it runs once per database."""
    found = kit(str(request.param), services)
    monkeypatch.setenv(found.password_env, found.password)
    return found
