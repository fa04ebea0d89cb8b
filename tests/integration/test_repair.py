"""Repair dumps: per-range count + checksum computed on the database and on the mirror agree
for every column type; a damaged mirror (a changed row, a lost row, a row the source no
longer has) is found range by range while writers run, only those ranges are captured, and
the mirror equals the source again. Part of the contract suite: it runs for every source
database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipeline.background import BackgroundTailer
from pipeline.capture import CaptureRequest
from pipeline.config import load_config
from pipeline.events import TableId
from pipeline.ranges import key_ranges, plan_more
from pipeline.repair import repair_table
from pipeline.runtime import Runtime, open_runtime
from pipeline.verify import verify_table
from tests.integration.checks import check_table
from tests.integration.sources import SourceKit

pytestmark = pytest.mark.integration

def ranges_of(rt: Runtime, table: TableId, rows: int) -> dict[str, Any]:
    names = plan_more([], lambda after, off: rt.dialect.key_after(table, after, off), rows)
    return key_ranges(names, names)


def test_checksums_agree_then_damage_is_found_and_repaired_by_range(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    db = source_kit.create("repair", accounts=600, orders=200, seed=9)
    with source_kit.cleaned(db, "repair") as source:
        typed_name = source_kit.create_typed(db)
        _damage_found_and_repaired(source_kit, spark, tmp_path, db, typed_name, source)


def _damage_found_and_repaired(source_kit: SourceKit, spark: Any, tmp_path: Path, db: str,
                               typed_name: str, source: str) -> None:
    path = source_kit.config(tmp_path / "dblog.yaml", source=source, db=db,
                             lake=tmp_path / "lake", chunk_size=600, batch_seconds=0.5,
                             chunk_max_rows=2000,
                             tables=[f"{db}.accounts", f"{db}.{typed_name}"])
    accounts, typed = TableId(db, "accounts"), TableId(db, typed_name)
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
                     .where(F.col("id") == 1).withColumn("id", F.col("id") + 4999))
            extra.write.format("delta").mode("append").save(rt.layout.mirror(accounts))
            ranges = ranges_of(rt, accounts, 200)
            names = list(ranges)
            assert len(names) == 3  # (start, 200], (200, 400], (400, open)
            workload = source_kit.workload(db, 9, pause_s=0.05, reserve_every=10)
            try:
                report = repair_table(rt, accounts, ranges, health_check=bg.check)
            finally:
                workload.stop()
            assert report.ranges_checked == 3
            differing = {c.name for c in report.differing}
            assert {names[0], names[2]} <= differing, report
            assert set(report.repaired) == differing
            rt.wait_caught_up(bg.check)
            # A repair compares at a log position the tailer must reach: it runs beside one.
            again = repair_table(rt, accounts, ranges_of(rt, accounts, 200),
                                 health_check=bg.check)
            assert not again.differing, again
        assert verify_table(rt.dialect, rt.sink, accounts).ok
        check_table(spark, source_kit.ep, db, "accounts", ("id",),
                    rt.layout.changelog(accounts), expected_rows=source_kit.rows(db, "accounts"))
        rt.state.delete("", recursive=True)
