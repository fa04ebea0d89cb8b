"""Shared fixtures: the real local services and one SparkSession per test run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

# Every property test has a deadline: 2 s an example unless a test gives its own (real work,
# such as threads or Arrow, gets 10 s), well above an example's time on a loaded CI machine
# and far below a hang's. HYPOTHESIS_PROFILE=dev keeps Hypothesis's 200 ms.
settings.register_profile("dblog", deadline=timedelta(seconds=2))
settings.register_profile("dev", deadline=timedelta(milliseconds=200))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dblog"))

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from devtools.services import Endpoints


@pytest.fixture(scope="session")
def services() -> Endpoints:
    """Start MariaDB, PostgreSQL and ZooKeeper (idempotent) and return their endpoints.

    Never skips: if a service cannot start, the error says why and the tests fail.
    """
    import os

    from devtools import services as svc

    svc.up()
    endpoints = svc.endpoints()
    if not os.environ.get("DBLOG_SHARED_SERVICES"):
        _drop_abandoned_slots(endpoints)
    return endpoints


def _drop_abandoned_slots(ep: Endpoints) -> None:
    """Replication slots that killed test runs left on the local PostgreSQL keep its WAL
    forever: drop the inactive ``dblog_`` ones (not the demo's) before a run. Only one
    test run uses the local services at a time, unless ``DBLOG_SHARED_SERVICES`` is set
    (several checkouts testing against one set of services): then none is dropped, since
    another run's slot is inactive between its tailer runs."""
    import warnings

    from devtools.sample_pg import pg_connect

    conn = pg_connect(ep)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT slot_name, pg_drop_replication_slot(slot_name)"
                        " FROM pg_replication_slots WHERE NOT active"
                        r" AND slot_name LIKE 'dblog\_%' AND slot_name NOT LIKE 'dblog\_demo%'")
            dropped = [row[0] for row in cur.fetchall()]
    finally:
        conn.close()
    if dropped:
        warnings.warn(f"dropped replication slots abandoned by earlier runs: {dropped}",
                      stacklevel=1)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The one SparkSession of the test run (Delta from local jars)."""
    from dblog.app.spark import build_spark_session

    session = build_spark_session()
    yield session
    session.stop()


SEED_BASE = pytest.StashKey[int]()
SEEDED = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seeds", type=int, default=3,
        help="how many random seeds the randomized concurrent-write tests run (CI: 3)",
    )
    parser.addoption(
        "--seed-base", type=int, default=None,
        help="the first of those seeds (default: $DBLOG_SEED_BASE, else drawn at random and "
             "printed), to repeat a run",
    )


def pytest_configure(config: pytest.Config) -> None:
    import os
    import random

    given = config.getoption("--seed-base")
    if given is None and os.environ.get("DBLOG_SEED_BASE"):
        given = int(os.environ["DBLOG_SEED_BASE"])
    config.stash[SEED_BASE] = random.randrange(10**6) if given is None else int(given)


def _seed_line(config: pytest.Config) -> str:
    base = config.stash[SEED_BASE]
    return (f"randomized tests: seed base {base} (--seed-base {base} or DBLOG_SEED_BASE={base}"
            " repeats their seeds)")


def pytest_report_header(config: pytest.Config) -> str:
    return _seed_line(config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    if config.stash.get(SEEDED, False):
        terminalreporter.write_line(_seed_line(config))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``seed`` runs once per seed: base, base + 1, ... (``--seeds N``,
    ``--seed-base``). One that also takes ``variant`` (its module's ``VARIANTS`` kinds of
    run) runs variant ``i % VARIANTS`` with the i-th seed, and at least once each: fewer
    seeds than variants still run every variant (seed base + i for variant i)."""
    if "seed" not in metafunc.fixturenames:
        return
    metafunc.config.stash[SEEDED] = True
    base = metafunc.config.stash[SEED_BASE]
    count = int(metafunc.config.getoption("--seeds"))
    if "variant" not in metafunc.fixturenames:
        metafunc.parametrize("seed", [base + i for i in range(count)])
        return
    variants = int(metafunc.module.VARIANTS)
    runs = [(base + i, i % variants) for i in range(max(count, variants))]
    metafunc.parametrize(("seed", "variant"), runs,
                         ids=[f"variant{v}-seed{s}" for s, v in runs])
