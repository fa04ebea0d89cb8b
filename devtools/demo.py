"""``make demo``: a sample schema under concurrent writes, a full capture interleaved with the
tail, then verify; on MariaDB, then on PostgreSQL. Fresh every run (its own database,
ZooKeeper state and lake folder)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import yaml

from dblog.app.config import PipelineConfig, load_config
from dblog.app.paths import dblog_home
from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from dblog.tail.background import BackgroundTailer
from devtools import services
from devtools.sample import TABLES, Workload, create_schema, write_config
from devtools.sample_pg import PgWorkload, create_pg_schema, pg_execute, pg_source_config
from devtools.services import Endpoints

DATABASE = "shop"
ACCOUNTS = int(os.environ.get("DBLOG_DEMO_ACCOUNTS", "20000"))
ORDERS = int(os.environ.get("DBLOG_DEMO_ORDERS", "10000"))


def main(argv: list[str] | None = None) -> int:
    """Run the demo; ``--config-only`` only writes its config and sample schema (what
    ``make dagster`` needs before a first ``make demo``)."""
    args = sys.argv[1:] if argv is None else argv
    began = time.monotonic()
    ep = services.endpoints()
    os.environ.setdefault("DBLOG_MARIADB_PASSWORD", ep.mariadb_password)
    home = dblog_home() / "demo"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    config_path = write_config(home / "dblog.yaml", source="demo", ep=ep, db=DATABASE,
                               lake=home / "lake", chunk_size=2000, batch_seconds=1.0,
                               chunk_max_rows=200_000)
    config = load_config(config_path)
    print(f"demo: config {config_path}; sample schema {DATABASE} "
          f"({ACCOUNTS} accounts, {ORDERS} orders)", flush=True)
    create_schema(ep, DATABASE, ACCOUNTS, ORDERS, seed=7)
    if "--config-only" in args:
        return 0
    ok = _mariadb(config, config_path, ep)
    ok = _postgres(home, ep) and ok
    print(f"demo: total {time.monotonic() - began:.1f}s")
    print("verify: OK" if ok else "verify: MISMATCH")
    return 0 if ok else 1


def _mariadb(config: PipelineConfig, config_path: Path, ep: Endpoints) -> bool:
    with open_runtime(config) as rt:
        rt.state.delete("", recursive=True)  # forget an earlier demo's positions and captures
        tailed = {"events": 0, "batches": 0}

        def on_batch(report: object) -> None:
            if getattr(report, "mirror_only", False):
                return
            tailed["events"] += getattr(report, "events", 0)
            tailed["batches"] += 1

        with BackgroundTailer(rt.tailer(on_batch=on_batch)) as bg:
            rt.wait_started(bg.check)
            workload = Workload(ep, DATABASE, seed=7).start()
            print("demo: writers running; capturing all tables while tailing", flush=True)
            capture_began = time.monotonic()
            capturer = rt.capturer()
            capturer.health_check = bg.check
            capture_id = capturer.plan(CaptureRequest(tuple(TableId(DATABASE, t)
                                                            for t in TABLES)))
            reports = capturer.run(capture_id, on_progress=lambda r: print(
                f"  {r.table}: {r.chunks} chunks, {r.rows_selected} rows selected", flush=True))
            capture_s = time.monotonic() - capture_began
            time.sleep(2)
            workload.stop()
            rt.wait_caught_up(bg.check, timeout=1800)
        captured = sum(r.rows_emitted for r in reports)
        dropped = sum(r.rows_dropped for r in reports)
        print(f"demo: captured {captured} rows ({dropped} dropped by watermark windows) "
              f"in {capture_s:.1f}s; writers committed {workload.ops} statements; "
              f"tailed {tailed['events']} events in {tailed['batches']} batches")
        print(f"demo: equivalent CLI: dblog -c {config_path} capture / tail / status / verify")
        from dblog.app.verify import verify_table

        ok = True
        for table in config.table_ids:
            report = verify_table(rt.dialect, rt.sink, table)
            print("  " + report.summary())
            ok = ok and report.ok
        if ok:
            from assets.demo_state import record_demo

            ranges = record_demo(rt, reports)
            print(f"demo: recorded {ranges} captured key ranges in the Dagster instance "
                  "(`make dagster` shows them)")
    return ok


def _postgres(home: Path, ep: Endpoints) -> bool:
    """The same on PostgreSQL: schema ``shop`` of database ``postgres``, source ``demo-pg``."""
    os.environ.setdefault("DBLOG_PG_PASSWORD", ep.pg_password)
    pg_execute(ep, f'DROP SCHEMA IF EXISTS "{DATABASE}" CASCADE')
    create_pg_schema(ep, DATABASE, accounts=ACCOUNTS, orders=ORDERS, seed=7)
    data = pg_source_config(source="demo-pg", ep=ep, schema=DATABASE, lake=home / "lake",
                            chunk_size=2000, batch_seconds=1.0, chunk_max_rows=200_000)
    config_path = home / "dblog-pg.yaml"
    config_path.write_text(yaml.safe_dump(data))
    config = load_config(config_path)
    print(f"demo: PostgreSQL: config {config_path}; sample schema {DATABASE} "
          f"({ACCOUNTS} accounts, {ORDERS} orders)", flush=True)
    with open_runtime(config) as rt:
        rt.state.delete("", recursive=True)
        with BackgroundTailer(rt.tailer()) as bg:
            rt.wait_started(bg.check)
            workload = PgWorkload(ep, DATABASE, seed=7).start()
            capture_began = time.monotonic()
            capturer = rt.capturer()
            capturer.health_check = bg.check
            reports = capturer.run(capturer.plan(CaptureRequest(config.table_ids)))
            capture_s = time.monotonic() - capture_began
            time.sleep(2)
            workload.stop()
            rt.wait_caught_up(bg.check, timeout=1800)
        print(f"demo: PostgreSQL: captured {sum(r.rows_emitted for r in reports)} rows in "
              f"{capture_s:.1f}s; writers committed {workload.ops} transactions")
        from dblog.app.verify import verify_table

        ok = True
        for table in config.table_ids:
            report = verify_table(rt.dialect, rt.sink, table)
            print("  " + report.summary())
            ok = ok and report.ok
        rt.state.delete("", recursive=True)
    # Nothing tails the demo's source afterwards: its slot would keep WAL forever.
    pg_execute(ep, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                   " WHERE slot_name = 'dblog_demo_pg'",
               'DROP PUBLICATION IF EXISTS "dblog_demo_pg"')
    return ok


if __name__ == "__main__":
    sys.exit(main())
