"""Repair dumps: per-range count + checksum computed on the database and on the mirror agree
for every column type; a damaged mirror (a changed row, a lost row, a row the source no
longer has) is found range by range while writers run, only those ranges are captured, and
the mirror equals the source again. Part of the contract suite: it runs for every source
database."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipeline.background import BackgroundTailer
from pipeline.capture import CaptureRequest
from pipeline.cli import main
from pipeline.config import RepairConfig, load_config
from pipeline.events import TableId
from pipeline.ranges import key_ranges, plan_more
from pipeline.repair import Repairer, repair_table, table_walk
from pipeline.rolling import Place, place_path
from pipeline.runtime import Runtime, open_runtime
from pipeline.services import Endpoints
from pipeline.verify import verify_table
from tests.integration.checks import check_table
from tests.integration.sources import SourceKit, kit

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


# ---- the rolling verification: `dblog repair` -------------------------------------------

def repair_config(source_kit: SourceKit, tmp_path: Path, db: str, source: str,
                  rate: float = 150.0) -> Path:
    path = source_kit.config(tmp_path / "dblog.yaml", source=source, db=db,
                             lake=tmp_path / "lake", chunk_size=200, batch_seconds=0.3,
                             tables=[f"{db}.t"])
    data = yaml.safe_load(path.read_text())
    data["repair"] = {"max_rows_per_s": rate, "range_rows": 100}
    path.write_text(yaml.safe_dump(data))
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def diverge(source_kit: SourceKit, spark: Any, rt: Runtime, db: str) -> None:
    """A changed row in range 0 (ids 1-100), a lost one in range 2 (201-300) and one the
    source does not have in the last range (501-), behind the pipeline's back: on MariaDB
    with the binlog off for the session; PostgreSQL cannot skip the WAL of a logged table,
    so there the mirror's Delta table is changed instead."""
    if source_kit.kind != "postgres":
        source_kit.run_sql(db, "SET sql_log_bin = 0",
                           "UPDATE {t} SET v = 'behind' WHERE id = 10",
                           "DELETE FROM {t} WHERE id = 250",
                           "INSERT INTO {t} VALUES (5000, 'unseen')")
        return
    path = rt.layout.mirror(TableId(db, "t"))
    mirror = DeltaTable.forPath(spark, path)
    mirror.update(F.col("id") == 10, {"v": F.lit("behind")})
    mirror.delete(F.col("id") == 250)
    (spark.read.format("delta").load(path).where(F.col("id") == 1)
     .withColumn("id", F.lit(5000)).write.format("delta").mode("append").save(path))


def outcomes(out: str, db: str) -> dict[str, str]:
    """Range name -> result of each per-range row of a pass's table."""
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == f"{db}.t":
            found[parts[1]] = parts[4]
    return found


def test_a_divergence_behind_the_pipelines_back_is_found_and_repaired_by_one_paced_pass(
    source_kit: SourceKit, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = source_kit.simple_table("rolling", 600)
    with source_kit.cleaned(db, "rolling") as source:
        path = repair_config(source_kit, tmp_path, db, source)
        table = TableId(db, "t")
        assert cli(capsys, "-c", str(path), "capture")[0] == 0
        code, out = cli(capsys, "-c", str(path), "repair", "--dry-run")
        assert code == 0, out
        assert set(outcomes(out, db).values()) == {"equal"} and len(outcomes(out, db)) == 6
        with open_runtime(load_config(path), spark=spark) as rt:
            diverge(source_kit, spark, rt, db)
            captures = len(rt.state.list_captures())
            mirror_version = DeltaTable.forPath(spark, rt.layout.mirror(table)).history(
                1).collect()[0]["version"]

            # A dry run reports the three ranges and changes nothing.
            code, out = cli(capsys, "-c", str(path), "repair", "--dry-run", f"{db}.t")
            assert code == 1, out
            names = list(outcomes(out, db))
            assert len(names) == 6, out
            differing = {n for n, o in outcomes(out, db).items() if o == "differing"}
            assert differing == {names[0], names[2], names[5]}, out
            assert "(dry run)" in out and "3 differing" in out
            assert len(rt.state.list_captures()) == captures
            assert DeltaTable.forPath(spark, rt.layout.mirror(table)).history(
                1).collect()[0]["version"] == mirror_version
            assert not verify_table(rt.dialect, rt.sink, table).ok

            # One pass finds and repairs them.
            code, out = cli(capsys, "-c", str(path), "repair")
            assert code == 0, out
            repaired = {n for n, o in outcomes(out, db).items() if o == "repaired"}
            assert repaired == differing, out
            assert {o for n, o in outcomes(out, db).items() if n not in repaired} == {"equal"}
            summary = out.strip().splitlines()[-1]
            assert "6 ranges of 1 table(s)" in summary and "3 repaired" in summary, out
            assert len(rt.state.list_captures()) == captures + 3  # one range each
            assert verify_table(rt.dialect, rt.sink, table).ok
        code, out = cli(capsys, "-c", str(path), "repair", "--dry-run")
        assert code == 0 and "0 differing" in out, out
        assert cli(capsys, "-c", str(path), "repair", "--all", "--dry-run")[0] == 2


def test_a_continuous_repair_finds_a_divergence_injected_while_it_runs_and_keeps_its_place(
    services: Endpoints, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mariadb = kit("mariadb", services)
    monkeypatch.setenv(mariadb.password_env, mariadb.password)
    db = mariadb.simple_table("rolling", 600)
    with mariadb.cleaned(db, "rolling") as source:
        path = repair_config(mariadb, tmp_path, db, source, rate=300.0)
        table = TableId(db, "t")
        assert cli(capsys, "-c", str(path), "capture")[0] == 0
        lines: queue.Queue[str] = queue.Queue()
        walk = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "-c", str(path), "repair", "--continuous"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=Path(__file__).resolve().parents[2])
        assert walk.stdout is not None
        reader = threading.Thread(target=lambda: [lines.put(x) for x in walk.stdout or ()],
                                  daemon=True)
        reader.start()
        seen: list[str] = []

        def wait_for(wanted: Callable[[str], bool], timeout: float = 300.0) -> str:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    assert walk.poll() is None, "".join(seen)
                    continue
                seen.append(line)
                if wanted(line):
                    return line
            raise AssertionError(f"not seen within {timeout:.0f}s:\n{''.join(seen)}")

        try:
            wait_for(lambda line: line.startswith(f"pass 1 of {db}.t: 6 ranges"))
            # Range 3 (ids 301-400) changes behind the pipeline's back while the walk runs.
            mariadb.run_sql(db, "SET sql_log_bin = 0",
                            "UPDATE {t} SET v = 'behind' WHERE id = 350")
            wait_for(lambda line: "000003:[300]: differs" in line and "capturing" in line)
            wait_for(lambda line: line.split()[1:2] == ["000003:[300]"]
                     and "repaired" in line)
        finally:
            walk.send_signal(signal.SIGTERM)
            code = walk.wait(120)
        reader.join(10)
        while not lines.empty():
            seen.append(lines.get())
        assert code == 0, "".join(seen)
        assert "(stopped)" in seen[-1] and "1 repaired" in seen[-1], "".join(seen)

        paced = replace(load_config(path), repair=RepairConfig(max_rows_per_s=20.0,
                                                                range_rows=100))
        with open_runtime(paced, spark=spark) as rt:
            assert verify_table(rt.dialect, rt.sink, table).ok
            found = rt.state.get(place_path(table))
            assert found is not None
            place = Place.from_json(found.value)
            assert place.pass_number >= 2 and place.last_pass is not None
            # A walk started again continues at the range the stopped one was to compare.
            expected = place.next.name if place.next is not None else "000000:start"
            names: list[str] = []
            with BackgroundTailer(rt.tailer()) as bg:
                repairer = Repairer(rt, health_check=bg.check,
                                    on_result=lambda r: names.append(r.name))
                repairer.next_range(table, table_walk(rt, table))
                assert names == [expected]
                moved = rt.state.get(place_path(table))
                assert moved is not None and moved.version == found.version + 1
                # The pace holds: unpaced, a pass over the 600 rows takes ~6 s once the
                # tailer runs; at 20 rows/s it takes 30 s at least (a generous upper bound).
                began = time.monotonic()
                report = repairer.one_pass(table)
                seconds = time.monotonic() - began
            assert report.ranges_checked == 6 and report.rows_checked == 600
            assert 600 / 20.0 <= seconds < 600 / 20.0 + 120, seconds
            rt.state.delete("", recursive=True)
