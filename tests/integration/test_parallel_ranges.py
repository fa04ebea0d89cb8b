"""A capture's ranges run a few at a time (``capture.parallel_ranges``) against the real
services: they overlap, every table is captured once, and a range that fails stops the
one beside it, with its error, leaving a capture that a rerun finishes exactly."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dblog.capture import CaptureRequest, RangeReport
from dblog.core.events import TableId
from dblog.state import RangeProgress
from devtools.sample import connect
from devtools.services import Endpoints
from tests.integration.helpers import make_db, run_statements, wait_for
from tests.integration.test_capture_bounds import (
    assert_captured_once,
    assert_mirror_equals_source,
    runtime,
)

pytestmark = pytest.mark.integration

TABLE_DDL = "CREATE TABLE {db}.%s (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL)"


def fill(services: Endpoints, db: str, table: str, rows: int) -> None:
    conn = connect(services, db)
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{table}` VALUES (%s, %s)",  # noqa: S608 - fixed names
                        [(i, f"v{i}") for i in range(1, rows + 1)])
    conn.close()


def test_ranges_run_two_at_a_time_and_each_table_is_captured_once(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    names = ["a", "b", "c"]
    db = make_db(services, prefix="pr", ddl=[TABLE_DDL % name for name in names])
    for name in names:
        fill(services, db, name, 300)
    tables = [TableId(db, name) for name in names]
    spans: dict[str, tuple[float, float]] = {}

    def record(report: RangeReport) -> None:
        if report.status == "done":
            ended = time.monotonic()
            spans[report.range_id] = (ended - report.seconds, ended)

    # 100-row chunks (they do not grow): three windows and a few seconds per range.
    with runtime(services, tmp_path, db, names, server_id=7611, chunk_size=100) as (rt, bg):
        capturer = rt.capturer()
        assert capturer.options.parallel_ranges == 2  # the default
        capturer.health_check = bg.check
        capture_id = capturer.plan(CaptureRequest(tuple(tables)))
        reports = capturer.run(capture_id, on_progress=record)
        rt.wait_caught_up(bg.check)
        assert [r.status for r in reports] == ["done"] * 3, reports
        assert [r.range_id for r in reports] == sorted(rt.state.list_ranges(capture_id))
        found = rt.state.get_capture(capture_id)
        assert found is not None and found.value.status == "done"
        # The first two ranges were under way at the same time.
        (start0, end0), (start1, end1) = (spans[r.range_id] for r in reports[:2])
        assert start1 < end0 and start0 < end1, spans
        for name in names:
            assert_captured_once(rt, services, db, name, ["id"])
            assert_mirror_equals_source(rt, TableId(db, name))


@contextmanager
def user_reading(sql: Any, db: str, tables: list[str]) -> Iterator[tuple[str, str]]:
    """A source user that tails the log and may read only ``tables`` of ``db``."""
    user = f"dblog_pr_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    run_statements(
        sql, ("CREATE USER %s@'127.0.0.1' IDENTIFIED BY %s", (user, password)),
        ("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO %s@'127.0.0.1'", (user,)),
        ("GRANT ALL PRIVILEGES ON `dblog`.* TO %s@'127.0.0.1'", (user,)),
        *[(f"GRANT SELECT ON `{db}`.`{t}` TO %s@'127.0.0.1'", (user,)) for t in tables])
    try:
        yield user, password
    finally:
        run_statements(sql, ("DROP USER %s@'127.0.0.1'", (user,)))


def test_a_failing_range_stops_the_one_beside_it_and_a_rerun_finishes_the_capture(
    services: Endpoints, sql: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline user loses SELECT on one table while both tables' ranges are under
    way: that range fails, the other stops beside it, the error is raised, and once the
    grant is back a rerun finishes both exactly."""
    db = make_db(services, prefix="pr", ddl=[TABLE_DDL % "denied", TABLE_DDL % "big"])
    fill(services, db, "denied", 1000)
    fill(services, db, "big", 1000)
    denied, big = TableId(db, "denied"), TableId(db, "big")
    with user_reading(sql, db, ["denied", "big"]) as (user, password):
        monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", password)
        # 50-row chunks (they do not grow): twenty windows a table.
        with runtime(replace(services, user=user), tmp_path, db, ["denied", "big"],
                     server_id=7612, chunk_size=50) as (rt, bg):
            capturer = rt.capturer()
            capturer.health_check = bg.check
            capture_id = capturer.plan(CaptureRequest((denied, big)))

            def progress() -> dict[TableId, RangeProgress]:
                found = (rt.state.get_range(capture_id, range_id)
                         for range_id in rt.state.list_ranges(capture_id))
                return {f.value.table: f.value for f in found if f is not None}

            failure: list[BaseException] = []

            def run() -> None:
                try:
                    capturer.run(capture_id)
                except Exception as exc:  # checked below
                    failure.append(exc)

            runner = threading.Thread(target=run, name="test-capture", daemon=True)
            runner.start()
            wait_for("both ranges to emit a chunk",
                     lambda: all(p.rows_emitted > 0 for p in progress().values()), 120)
            grant = (f"SELECT ON `{db}`.`denied`", (user,))
            run_statements(sql, (f"REVOKE {grant[0]} FROM %s@'127.0.0.1'", grant[1]))
            runner.join(120)
            assert not runner.is_alive(), "the capture did not stop after its failure"
            assert len(failure) == 1 and "denied" in str(failure[0]), failure
            assert not [t.name for t in threading.enumerate()
                        if t.name.startswith(f"capture-{capture_id}")]
            assert not progress()[big].done, "the big table's range went on after the failure"

            run_statements(sql, (f"GRANT {grant[0]} TO %s@'127.0.0.1'", grant[1]))
            reports = capturer.run(capture_id)
            rt.wait_caught_up(bg.check)
            assert [r.status for r in reports] == ["done", "done"], reports
            for table in (denied, big):
                assert_captured_once(rt, services, db, table.table, ["id"])
                assert_mirror_equals_source(rt, table)
