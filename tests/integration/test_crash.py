"""kill -9 in the middle of a capture and of a tail batch, restart: nothing lost, nothing
duplicated, and the same invariants as the concurrent-write test hold, the history check
too: each change the writers committed is in the changelog once, in order per key, across the
kills and replays. Part of the contract suite: it runs for every source database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.sample import TABLES
from devtools.services import Endpoints
from tests.integration.checks import check_history, check_table, check_untouched_captured_once
from tests.integration.helpers import run_dblog
from tests.integration.oracle import verify_table
from tests.integration.sources import KEYS, PostgresKit, SourceKit

pytestmark = pytest.mark.integration

def dblog(config: Path, *args: str, fault: str | None = None, password: str) -> int:
    return run_dblog(config, *args, password=password, fault=fault)[0]


CRASHES = (
    "tail.after_table_write:3",  # mid-batch: one table's Delta commit done, the other not
    "capture.after_hw:2",        # the high watermark is in the log, the process is gone
    "capture.after_select:2",    # chunk selected and held, no high watermark: retried
    "capture.before_files:2",    # pinned, files written, not published: retried
    "tail.after_pin:2",          # a window pinned, its files not yet committed: re-pinned
    "tail.after_delta:2",        # every Delta commit done, ZooKeeper position not moved
)


SMOKE = (CRASHES[0],)
"""What ``make test`` runs: one crash, mid tail batch (one table's commit done, the other's
not), on PostgreSQL, on smaller tables in 150-row chunks (still four windows or more per
table). MariaDB's capture and tailer processes are
killed at random moments by the chaos smoke (test_chaos.py) in ``make test``; ``make
test-slow`` runs every crash point on both databases. ``tail.after_delta`` also has its own
test in test_silent_loss.py (both databases, in ``make test``)."""


@pytest.mark.slow
@pytest.mark.timeout(3600)  # several restarts; this machine's speed varies 3x over a day
def test_kill_and_restart(source_kit: SourceKit, spark: Any, tmp_path: Path) -> None:
    """Every crash point, one after the other, on each source database."""
    db = source_kit.create("crash", accounts=1800, orders=1200, seed=5)
    with source_kit.cleaned(db, "crash") as source:
        _kill_and_restart(source_kit, spark, tmp_path, db, source, CRASHES, 200)


@pytest.mark.timeout(1800)
def test_kill_and_restart_smoke(services: Endpoints, spark: Any, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    source_kit = PostgresKit(services)
    monkeypatch.setenv(source_kit.password_env, source_kit.password)
    db = source_kit.create("crash", accounts=700, orders=600, seed=5)
    with source_kit.cleaned(db, "crash") as source:
        _kill_and_restart(source_kit, spark, tmp_path, db, source, SMOKE, 150)


def _kill_and_restart(source_kit: SourceKit, spark: Any, tmp_path: Path, db: str,
                      source: str, crashes: tuple[str, ...], chunk_size: int) -> None:
    config_path = source_kit.config(
        tmp_path / "dblog.yaml", source=source, db=db,
        lake=tmp_path / "lake", chunk_size=chunk_size, batch_seconds=0.3,
    )
    pw = source_kit.password
    config = load_config(config_path)
    initial = {t: source_kit.rows(db, t) for t in TABLES}
    # The tailer's starting position is taken before the writers start (in this process:
    # only the capture and resume processes are killed).
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
    workload = source_kit.workload(db, seed=11, pause_s=0.3, reserve_every=10)
    try:
        assert dblog(config_path, "capture", fault=crashes[0], password=pw) == -9
        for fault in crashes[1:]:
            assert dblog(config_path, "resume", f"{db}.accounts", fault=fault,
                         password=pw) == -9, f"{fault} was never reached"
        assert dblog(config_path, "resume", f"{db}.accounts", password=pw) == 0
    finally:
        workload.stop()
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        for table in TABLES:
            report = verify_table(rt.dialect, rt.sink, TableId(db, table))
            assert report.ok, report.summary()
            final = source_kit.rows(db, table)
            frame = check_table(spark, source_kit.ep, db, table, KEYS[table],
                                rt.layout.changelog(TableId(db, table)),
                                expected_rows=final)
            windows = frame[frame["op"] == "r"].groupby("_dblog_window_id").size()
            assert len(windows) > 3
            assert check_untouched_captured_once(
                frame, table, KEYS[table], set(initial[table]), workload.touched) > 20
            assert not workload.history.uncertain
            assert check_history(frame, table, KEYS[table], initial[table],
                                 workload.history.of(table), final).changes > 20
        ranges = [r.value for f in rt.state.list_captures()
                  for r in rt.state.list_ranges(f.value.capture_id).values()]
        assert ranges and all(r.done for r in ranges)
        rt.state.delete("", recursive=True)
