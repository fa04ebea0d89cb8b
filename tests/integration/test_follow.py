"""A running tailer picks up a table added to the config: no gap and no duplicate for the
table it already served (writers run throughout), the new table captures, all verify; a
config naming a missing table is reported and ignored. Part of the contract suite (on
PostgreSQL the added table joins the publication when the tailer switches to it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from dblog.tail.follow import FollowSummary, tail_following_config
from tests.integration.checks import check_table
from tests.integration.helpers import wait_for
from tests.integration.oracle import verify_table
from tests.integration.sources import KEYS, SourceKit

pytestmark = pytest.mark.integration

def test_a_table_added_to_the_config_is_tailed_without_gap_or_duplicate(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    db = source_kit.create("follow", accounts=300, orders=200, seed=5)
    with source_kit.cleaned(db, "follow") as source:
        _follow(source_kit, spark, tmp_path, db, source)


def _follow(source_kit: SourceKit, spark: Any, tmp_path: Path, db: str, source: str) -> None:
    path = tmp_path / "dblog.yaml"
    data = source_kit.config_data(source=source, db=db, tables=[f"{db}.accounts"],
                                  lake=tmp_path / "lake", chunk_size=400, batch_seconds=0.5)
    path.write_text(yaml.safe_dump(data))
    notices: list[str] = []
    stop = threading.Event()
    outcome: dict[str, Any] = {}
    with open_runtime(load_config(path), spark=spark) as rt:

        def follow() -> None:
            try:
                outcome["summary"] = tail_following_config(
                    rt, lambda: load_config(path).table_ids, stop=stop,
                    on_notice=notices.append, check_every_s=0.5)
            except BaseException as exc:
                outcome["error"] = exc

        def alive() -> None:
            assert "error" not in outcome, outcome

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        workload = source_kit.workload(db, 5, pause_s=0.02)
        try:
            rt.wait_started(alive)
            capturer = rt.capturer()
            capturer.health_check = alive
            first = capturer.run(capturer.plan(CaptureRequest((TableId(db, "accounts"),))))
            assert [r.status for r in first] == ["done"]

            # A table that does not exist: reported, ignored, the tail goes on.
            path.write_text(yaml.safe_dump({**data, "tables": [f"{db}.accounts",
                                                               f"{db}.no_such_table"]}))
            wait_for("the notice about the missing table",
                     lambda: any("no_such_table" in n for n in notices), timeout=120, poll=0.2)
            alive()

            path.write_text(yaml.safe_dump({**data, "tables": [f"{db}.accounts",
                                                               f"{db}.orders"]}))
            wait_for("the switch to two tables",
                     lambda: any("added: " + f"{db}.orders" in n for n in notices),
                     timeout=120, poll=0.2)
            second = capturer.run(capturer.plan(CaptureRequest((TableId(db, "orders"),))))
            assert [r.status for r in second] == ["done"]
            time.sleep(1.0)
        finally:
            workload.stop()
        assert workload.ops > 50
        rt.wait_caught_up(alive)
        stop.set()
        thread.join(120)
        alive()
        summary: FollowSummary = outcome["summary"]
        assert summary.restarts == 1
        assert set(summary.tables) == {TableId(db, "accounts"), TableId(db, "orders")}
        for table in ("accounts", "orders"):
            report = verify_table(rt.dialect, rt.sink, TableId(db, table))
            assert report.ok, report.summary()
            check_table(spark, source_kit.ep, db, table, KEYS[table],
                        rt.layout.changelog(TableId(db, table)),
                        expected_rows=source_kit.rows(db, table))
        rt.state.delete("", recursive=True)
