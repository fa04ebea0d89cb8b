"""The log connection ended by the server (a restart, a network cut, a killed walsender or
binlog dump thread) while large transactions stream: the tailer reconnects at its last
commit by itself, and every change reaches the lake exactly once. Part of the contract
suite: it runs for every source database."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from dblog.tail.background import BackgroundTailer
from tests.integration.oracle import verify_table
from tests.integration.sources import SourceKit

pytestmark = pytest.mark.integration

TRANSACTIONS, ROWS = 8, 2000


def test_a_log_connection_ended_mid_transaction_is_read_again_from_the_last_commit(
        source_kit: SourceKit, spark: Any, tmp_path: Path) -> None:
    db = source_kit.simple_table("logcut", 0)
    table = TableId(db, "t")
    with source_kit.cleaned(db, "logcut") as source:
        cfg = source_kit.config(tmp_path / "c.yaml", source=source, db=db,
                                lake=tmp_path / "lake", tables=[f"{db}.t"])
        with open_runtime(load_config(cfg), spark=spark) as rt:
            ended = 0
            with BackgroundTailer(rt.tailer()) as bg:
                rt.wait_started(bg.check)
                for n in range(TRANSACTIONS):  # each takes a while to stream and decode
                    source_kit.run_sql(
                        db, source_kit.insert_range(db, n * ROWS + 1, (n + 1) * ROWS),
                        f"UPDATE {{t}} SET v = CONCAT(v, 'u') WHERE MOD(id, 7) = {n % 7}")  # noqa: S608
                    for _ in range(3):
                        time.sleep(0.15)
                        ended += source_kit.end_log_streams(source)
                    bg.check()
                rt.wait_caught_up(bg.check, timeout=120)
            assert ended >= 5, ended
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary()
            log = spark.read.format("delta").load(rt.layout.changelog(table))
            created = log.where("op = 'c'").groupBy("after.id").count()
            assert created.count() == TRANSACTIONS * ROWS
            assert created.where("count > 1").count() == 0
            changes = log.where("op = 'u'").select("_dblog_lsn", "_dblog_seq")
            assert changes.count() == changes.distinct().count()
            rt.state.delete("", recursive=True)
