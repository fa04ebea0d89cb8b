"""The benchmarks work (tiny sizes): each writes its JSON with positive figures. Timings are
never asserted here; `make bench` measures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.helpers import smoke_result

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from devtools.services import Endpoints

pytestmark = pytest.mark.integration


def test_capture_bench_smoke(services: Endpoints, spark: SparkSession, tmp_path: Path) -> None:
    from bench import bench_capture

    out = tmp_path / "capture.json"
    # "idle-warm" repeats "idle"'s code in the same JVM; the smoke leaves it to `make bench`.
    assert bench_capture.main(["--smoke", "--no-warm", "--timeline", "--output", str(out)]) == 0
    doc = smoke_result(out, "capture")
    assert [r["variant"] for r in doc["results"]] == ["idle", "writers"]
    for row in doc["results"]:
        for side in ("baseline", "dblog"):
            assert row[side]["rows"] > 0 and row[side]["rows_per_s"] > 0
            # where the CPU went: this process and the Spark JVM at least
            cpu = row[side]["cpu_seconds"]
            assert cpu["total"] > 0 and cpu["python"] >= 0 and "jvm_tasks" in cpu
        assert row["ratio"] > 0
        # the capture's own CPU, and its steps in time by thread
        dblog = row["dblog"]
        assert 0 < dblog["capture_cpu_seconds"]["total"] <= dblog["cpu_seconds"]["total"]
        steps = dblog["timeline"]
        assert {"capture.write_chunk_files", "tail.pin (schema, pin, mirror check)",
                "tail.settle_pinned (wait for files)"} <= {s["step"] for s in steps}
        assert all(0 <= s["start_s"] <= s["end_s"] for s in steps)


def test_tail_bench_smoke(services: Endpoints, spark: SparkSession, tmp_path: Path) -> None:
    from bench import bench_tail

    out = tmp_path / "tail.json"
    # The warm measurements repeat the cold ones' code in the same JVM: left to `make bench`.
    assert bench_tail.main(["--smoke", "--no-warm", "--output", str(out)]) == 0
    doc = smoke_result(out, "tail")
    assert [(r["shape"], r["jvm"]) for r in doc["results"]] == [
        ("single", "cold"), ("batch100", "cold")]
    for row in doc["results"]:
        for side in ("baseline", "dblog"):
            assert row[side]["row_events"] > 0 and row[side]["row_events_per_s"] > 0
        assert row["ratio"] > 0 and 0 < row["merged_ratio"] < row["ratio"]
        assert row["dblog"]["current_state_rows"] > 0
        # the reader alone decodes exactly the range's row events, as the bare loop does
        assert row["reader_alone"]["row_events"] == row["baseline"]["row_events"]
        assert row["reader_ratio"] > 0


def test_current_state_bench_smoke(services: Endpoints, spark: SparkSession,
                                   tmp_path: Path) -> None:
    from bench import bench_current

    out = tmp_path / "current.json"
    assert bench_current.main(["--smoke", "--output", str(out)]) == 0
    doc = smoke_result(out, "current")
    results = doc["results"]
    assert results["unmerged_changelog_rows"] > 0  # the changes are read from the changelog
    assert results["current state"]["rows"] > 0 and results["current_over_mirror"] > 0
    # the mirror lacks the changes (inserts among them): the two reads differ
    assert results["current state"]["rows"] != results["mirror"]["rows"]


def test_startup_bench_smoke(services: Endpoints, tmp_path: Path) -> None:
    from bench import bench_startup

    out = tmp_path / "startup.json"
    # Each child reports whether its JVM mapped the archive; the bench exits if that is not
    # what the child was started with.
    assert bench_startup.main(["--smoke", "--output", str(out)]) == 0
    doc = smoke_result(out, "startup")
    for side in ("with the archive", "without the archive"):
        assert doc["results"][side]["total_s"] > 0
    assert [r["archive_mapped"] for r in doc["results"]["with the archive"]["runs"]] == [True]
    assert doc["archive_bytes"] > 0


def test_repair_bench_smoke(services: Endpoints, spark: SparkSession, tmp_path: Path) -> None:
    from bench import bench_repair

    out = tmp_path / "repair.json"
    assert bench_repair.main(["--smoke", "--output", str(out)]) == 0
    doc = smoke_result(out, "repair")
    assert set(doc["results"]) == {"dump", "transfer compare", "checksum compare: database",
                                   "checksum compare: mirror", "checksum compare"}
    assert all(r["seconds"] > 0 and r["rows_per_s"] > 0 for r in doc["results"].values())
    assert doc["results"]["checksum compare"]["ranges"] == 5


def test_postgres_benches_smoke(services: Endpoints, spark: SparkSession,
                                tmp_path: Path) -> None:
    from bench import bench_pg_capture, bench_pg_tail

    out = tmp_path / "pg-tail.json"
    assert bench_pg_tail.main(["--smoke", "--shapes", "single", "--output", str(out)]) == 0
    doc = smoke_result(out, "pg-tail")
    (row,) = doc["results"]
    for side in ("baseline", "wal2json", "dblog"):
        assert row[side]["row_events"] == 2000 and row[side]["row_events_per_s"] > 0
    out = tmp_path / "pg-capture.json"
    assert bench_pg_capture.main(["--smoke", "--output", str(out)]) == 0
    idle, writers = smoke_result(out, "pg-capture")["results"]
    assert (idle["variant"], writers["variant"]) == ("idle", "writers")
    assert idle["dblog"]["rows"] == 2000 and writers["dblog"]["rows"] >= 2000
    assert writers["dblog"]["writers"]["transactions"] > 0
    for row in (idle, writers):
        assert row["dblog"]["complete"] and row["ratio"] > 0


def test_select_bench_smoke(services: Endpoints, spark: SparkSession, tmp_path: Path) -> None:
    from bench import bench_select

    out = tmp_path / "select.json"
    assert bench_select.main(["--smoke", "--output", str(out)]) == 0
    doc = smoke_result(out, "select")
    for variant in ("LIMIT", "planned"):
        assert doc["results"][variant]["rows"] == 2000
        assert doc["results"][variant]["seconds"] > 0
    assert doc["results"]["planned_over_limit"]["seconds"] > 0


def test_capture_tables_bench_smoke(services: Endpoints, spark: SparkSession,
                                    tmp_path: Path) -> None:
    from bench import bench_capture_tables

    out = tmp_path / "capture-tables.json"
    assert bench_capture_tables.main(["--smoke", "--output", str(out)]) == 0
    doc = smoke_result(out, "capture-tables")
    [row] = doc["results"]
    assert row["baseline"]["rows"] == 400 and row["baseline"]["rows_per_s"] > 0
    for parallel in (1, 2):
        capture = row[f"dblog_p{parallel}"]
        assert capture["parallel_ranges"] == parallel and capture["complete"]
        assert capture["rows"] == 400 and capture["ratio"] > 0
