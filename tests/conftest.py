"""Shared fixtures: the real local services and one SparkSession per test run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.services import Endpoints


@pytest.fixture(scope="session")
def services() -> Endpoints:
    """Start MariaDB, PostgreSQL and ZooKeeper (idempotent) and return their endpoints.

    Never skips: if a service cannot start, the error says why and the tests fail.
    """
    from pipeline import services as svc

    svc.up()
    return svc.endpoints()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The one SparkSession of the test run (Delta from local jars)."""
    from pipeline.spark import build_spark_session

    session = build_spark_session()
    yield session
    session.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seeds", type=int, default=3,
        help="how many random seeds the randomized concurrent-write tests run (CI: 3)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``seed`` runs once per seed: 1000, 1001, ... (``--seeds N``)."""
    if "seed" in metafunc.fixturenames:
        count = int(metafunc.config.getoption("--seeds"))
        metafunc.parametrize("seed", [1000 + i for i in range(count)])
