"""Chaos, on MariaDB and on PostgreSQL: writers run while a capture and two tailers (three
processes, as on three hosts; on PostgreSQL the active one holds the replication slot) are
killed one at a time at random moments, with ZooKeeper and source database restarts
between; then mirror == source, an independent replay == source, no duplicate, no key back
in position, and no dblog process ended by itself (a tailer or capture that stops with an
error while its services come back fails the run). ``make test`` runs 4 short rounds per
database (each kind of kill once, in a random order); ``make chaos ROUNDS=N`` runs N per
database and writes each record to bench/results/chaos-<database>.json
($DBLOG_CHAOS_RESULTS is the folder)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.sample import TABLES
from devtools.services import Endpoints
from tests.integration.chaos import Chaos
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table
from tests.integration.sources import KEYS, SourceKit

pytestmark = pytest.mark.integration

ROUNDS = int(os.environ.get("DBLOG_CHAOS_ROUNDS", "4"))  # the smoke: each kind of kill once
SESSION_TIMEOUT_S = 4.0


@pytest.mark.timeout(900 + ROUNDS * 30)  # the suite's hang guard is 900 s
def test_chaos(source_kit: SourceKit, services: Endpoints, spark: Any, tmp_path: Path) -> None:
    kit = source_kit
    seed = int(os.environ.get("DBLOG_CHAOS_SEED", random.randrange(10**6)))
    print(f"\nchaos on {kit.kind}: {ROUNDS} rounds, seed {seed}"
          f" (DBLOG_CHAOS_SEED={seed} repeats the choices)")
    smoke = ROUNDS < 10
    db = kit.create("chaos", accounts=700 if smoke else 2000, orders=500 if smoke else 1500,
                    seed=seed)
    tables = [f"{db}.{t}" for t in TABLES]
    with kit.cleaned(db, "chaos") as source:
        path = kit.config(tmp_path / "c.yaml", source=source, db=db, lake=tmp_path / "lake",
                          chunk_size=200, batch_seconds=0.5)
        data = yaml.safe_load(path.read_text())
        data["zookeeper"]["session_timeout_s"] = SESSION_TIMEOUT_S
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        env = dict(os.environ)
        began = time.monotonic()
        with open_runtime(config, spark=spark, validate=False) as rt:
            chaos = Chaos(path, kit.kind, tables, tmp_path, env, random.Random(seed),
                          rt.state.lock_holder, gap_s=(1.0, 3.0) if smoke else (3.0, 9.0))
            workload = kit.workload(db, seed, pause_s=0.05, survive_outages=True)
            try:
                chaos.start()
                for number in range(1, ROUNDS + 1):
                    event = chaos.round(number)
                    print(f"round {number}: {event['detail']} ({event['seconds']}s)", flush=True)
                time.sleep(3)  # writes after the last kill too
                workload.stop()
                chaos.reap()
                chaos.finish_capture(timeout=600)
                rt.wait_caught_up(lambda: None, timeout=300)
                chaos.wait_tails_ready()
                codes = chaos.stop_tails()
            finally:
                workload.stop()
                chaos.kill_all()
            elapsed = time.monotonic() - began
            results = os.environ.get("DBLOG_CHAOS_RESULTS")
            if results:
                chaos.write(Path(results) / f"chaos-{kit.kind}.json", seed=seed,
                            seconds=round(elapsed), writer_ops=workload.ops,
                            writer_outages=workload.outages,
                            date=time.strftime("%Y-%m-%d"), cores=os.cpu_count())
            summary = chaos.summary()
            print(f"chaos: {summary['rounds']} rounds in {elapsed:.0f}s, kills {summary['kills']},"
                  f" {summary['captures_done']} captures done, {workload.ops} writes,"
                  f" {workload.outages} writer reconnects; unexpected exits:")
            for exit_ in summary["unexpected_exits"]:
                print(f"  {exit_['role']} exit {exit_['code']}: {exit_['last']}")
            assert codes == [0, 0], [t.last_lines(10) for t in chaos.tails]
            assert not summary["unexpected_exits"], \
                "a dblog process ended by itself (not killed by the harness): see above"
            for table in TABLES:
                tid = TableId(db, table)
                report = verify_table(rt.dialect, rt.sink, tid)
                assert report.ok, report.summary()
                check_table(spark, services, db, table, KEYS[table], rt.layout.changelog(tid),
                            expected_rows=kit.rows(db, table))
            assert chaos.captures_done >= 1
            rt.state.delete("", recursive=True)
