"""ADD / DROP / MODIFY COLUMN while the tailer is behind the DDL: events decode with the
columns they were written with, the Delta tables evolve, and mirror and replay match."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import parse_config
from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from dblog.tail.background import BackgroundTailer
from devtools.sample import config_dict, connect, q
from devtools.services import Endpoints
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table

pytestmark = pytest.mark.integration


def test_ddl_while_the_tailer_is_behind(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"ddl_{uuid.uuid4().hex[:8]}"
    conn = connect(services)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {q(db)}")
        cur.execute(f"CREATE TABLE {q(db)}.items (id INT PRIMARY KEY, a INT, b VARCHAR(20))")
    config = parse_config(config_dict(
        source=f"ddl-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.items"],
        lake=tmp_path / "lake", server_id=7301, chunk_size=100,
    ))
    table = TableId(db, "items")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)  # the position starts here, before any row
        with conn.cursor() as cur:
            items = f"{q(db)}.items"
            cur.executemany(f"INSERT INTO {items} VALUES (%s, %s, %s)",  # noqa: S608
                            [(i, i * 10, f"b{i}") for i in range(1, 301)])
            cur.execute(f"ALTER TABLE {items} ADD COLUMN c DECIMAL(10,2) DEFAULT 1.50")
            cur.execute(f"UPDATE {items} SET c = id / 4 WHERE id % 3 = 0")  # noqa: S608
            cur.execute(f"ALTER TABLE {items} DROP COLUMN b")
            cur.executemany(f"INSERT INTO {items} (id, a, c) VALUES (%s, %s, %s)",  # noqa: S608
                            [(i, -i, None) for i in range(301, 351)])
            cur.execute(f"ALTER TABLE {items} MODIFY a BIGINT")
            cur.execute(f"UPDATE {items} SET a = a * 1099511627776 WHERE id % 5 = 0")  # noqa: S608
            cur.execute(f"DELETE FROM {items} WHERE id % 7 = 0")  # noqa: S608
        # The tailer now reads everything above with the columns each event was written with.
        rt.tailer().run(until_caught_up=True)
        lake_types = {c.name: c.spark_type for c in rt.sink.known_columns(table)}
        assert lake_types == {"id": "INT", "a": "BIGINT", "b": "STRING", "c": "DECIMAL(10,2)"}
        # A capture after the DDLs stages chunks in the new shape.
        with BackgroundTailer(rt.tailer()) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            reports = capturer.run(capturer.plan(CaptureRequest((table,))))
        assert [r.status for r in reports] == ["done"]
        assert sum(r.rows_emitted for r in reports) == 350 - 50
        report = verify_table(rt.dialect, rt.sink, table)
        assert report.ok, report.summary()
        frame = check_table(spark, services, db, "items", ("id",), rt.layout.changelog(table))
        early = frame[(frame["op"] == "c")].sort_values("_dblog_lsn").iloc[0]["after"]
        assert early["b"] == "b1" and early["c"] is None  # written before ADD c, after b existed
    conn.close()
