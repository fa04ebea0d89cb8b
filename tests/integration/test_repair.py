"""Repair dumps: per-range count + checksum computed on the database and on the mirror agree
for every column type; a damaged mirror (a changed row, a lost row, a row the source no
longer has) is found range by range while writers run, only those ranges are captured, and
the mirror equals the source again."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipeline.background import BackgroundTailer
from pipeline.capture import CaptureRequest
from pipeline.config import load_config
from pipeline.events import TableId
from pipeline.ranges import key_ranges, plan_more
from pipeline.repair import repair_table
from pipeline.runtime import Runtime, open_runtime
from pipeline.sample import Workload, config_dict, connect, create_schema
from pipeline.services import Endpoints
from pipeline.verify import verify_table
from tests.integration.checks import check_table

pytestmark = pytest.mark.integration

TYPED = """CREATE TABLE {db}.typed (
  id INT PRIMARY KEY, d DATE, dt DATETIME(6), ts TIMESTAMP(3) NULL, b VARBINARY(16),
  tiny DECIMAL(10,8), big DECIMAL(40,10), l1 VARCHAR(20) CHARACTER SET latin1,
  t TIME(2), y YEAR, bits BIT(10), e ENUM('x','y'), s SET('a','b'), j JSON, f FLOAT,
  u BIGINT UNSIGNED, n TINYINT
) ENGINE=InnoDB"""


def ranges_of(rt: Runtime, table: TableId, rows: int) -> dict[str, Any]:
    names = plan_more([], lambda after, off: rt.dialect.key_after(table, after, off), rows)
    return key_ranges(names, names)


def test_checksums_agree_then_damage_is_found_and_repaired_by_range(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"repair_{uuid.uuid4().hex[:6]}"
    create_schema(services, db, accounts=600, orders=200, seed=9)
    conn = connect(services, db)
    with conn.cursor() as cur:
        cur.execute(TYPED.format(db=f"`{db}`"))
        cur.executemany(
            "INSERT INTO typed VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
            [(1, "2024-02-29", "2024-02-29 23:59:59.000001", "2038-01-19 03:14:07.999",
              b"\x00\xff|:", "0.00000001", "-12345678901234567890.0000000001", "café",
              "-838:59:59.99", 2155, 1023, "y", "a,b", '{"k": [1, "é"]}', 1.5,
              2**64 - 1, -128),
             (2, None, None, None, None, None, None, None, None, None, None, None, None,
              None, None, None, None),
             (3, "1000-01-01", "1000-01-01 00:00:00", "1970-01-01 00:00:01", b"",
              "0", "0", "", "00:00:00", 1901, 0, "x", "", "[]", -0.0, 0, 0),
             (4, "2024-01-01", "2024-01-01 12:00:00", "2024-01-01 12:00:00", b"a",
              "1.5", "1e20", "N", "1:2:3", 2000, 5, "x", "b", '"V1:x|"', 3.0, 7, 1)])
    conn.close()
    data = config_dict(source=f"repair-{uuid.uuid4().hex[:6]}", ep=services,
                       tables=[f"{db}.accounts", f"{db}.orders", f"{db}.typed"],
                       lake=tmp_path / "lake", chunk_size=600, batch_seconds=0.5,
                       chunk_max_rows=2000)
    path = tmp_path / "dblog.yaml"
    path.write_text(yaml.safe_dump(data))
    accounts, typed = TableId(db, "accounts"), TableId(db, "typed")
    with open_runtime(load_config(path), spark=spark) as rt:
        with BackgroundTailer(rt.tailer()) as bg:
            rt.wait_started(bg.check)
            capturer = rt.capturer()
            capturer.health_check = bg.check
            done = capturer.run(capturer.plan(CaptureRequest((accounts, typed))))
            assert [r.status for r in done] == ["done", "done"]
            rt.wait_caught_up(bg.check)

            # Every column type renders the same on both sides: nothing differs.
            clean = repair_table(rt, typed, ranges_of(rt, typed, 2))
            assert clean.ranges_checked == 2 and not clean.suspects, clean

            # Damage the mirror behind the tailer's back, in ranges 0, 2 and 4 of 200 rows.
            mirror = DeltaTable.forPath(spark, rt.layout.mirror(accounts))
            mirror.update(F.col("id") == 10, {"name": F.lit("tampered")})
            mirror.delete(F.col("id") == 450)
            extra = (spark.read.format("delta").load(rt.layout.mirror(accounts))
                     .where(F.col("id") == 1).withColumn("id", F.lit(5000)))
            extra.write.format("delta").mode("append").save(rt.layout.mirror(accounts))
            ranges = ranges_of(rt, accounts, 200)
            names = list(ranges)
            assert len(names) == 3  # (start, 200], (200, 400], (400, open)
            workload = Workload(services, db, 9, pause_s=0.05, reserve_every=10).start()
            try:
                report = repair_table(rt, accounts, ranges, health_check=bg.check)
            finally:
                workload.stop()
            assert report.ranges_checked == 3
            differing = {c.name for c in report.differing}
            assert {names[0], names[2]} <= differing, report
            assert set(report.repaired) == differing
            rt.wait_caught_up(bg.check)
        assert verify_table(rt.dialect, rt.sink, accounts).ok
        again = repair_table(rt, accounts, ranges_of(rt, accounts, 200))
        assert not again.differing, again
        check_table(spark, services, db, "accounts", ("id",), rt.layout.changelog(accounts))
