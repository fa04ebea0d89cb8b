"""The latency and impact benchmarks work (tiny sizes; the impact bench in its own process,
since it pins CPUs): each writes its JSON with sane figures. Timings are never asserted here;
`make bench` measures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.helpers import smoke_result

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from devtools.services import Endpoints

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, out: Path, name: str, *args: str, timeout: float = 240.0
         ) -> dict[str, Any]:
    """``python -m bench.<module> --smoke``; on a timeout it gets SIGTERM first (the impact
    bench restores MariaDB's CPU affinity on the way out)."""
    proc = subprocess.Popen([sys.executable, "-m", f"bench.{module}", "--smoke",
                             "--output", str(out), *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"bench.{module} --smoke took over {timeout:.0f}s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    return smoke_result(out, name)


def _ordered(stats: dict[str, Any], floor: float = 0.0) -> None:
    assert stats["count"] > 0
    assert floor <= stats["p50"] <= stats["p95"] <= stats["p99"] <= stats["max"]


DECODED_FLOOR = -0.01
"""A write's time is taken when its autocommit statement returns; MariaDB sends the binlog
event to the replica connection before the client has read its OK, so on an idle machine the
bare loop decodes many writes a fraction of a millisecond "before" they committed (p50
-0.14 ms seen). Never by more than the statement's own round trip on loopback."""


def test_latency_bench_smoke(services: Endpoints, spark: SparkSession, tmp_path: Path) -> None:
    from bench import bench_latency

    out = tmp_path / "latency.json"
    # with a capture beside the tail (`make bench` runs without one)
    assert bench_latency.main(["--smoke", "--capture", "--output", str(out)]) == 0
    doc = smoke_result(out, "latency")
    base, dblog = doc["results"]["baseline"], doc["results"]["dblog"]
    assert base["commits"] > 0 and base["achieved_tps"] > 0 and base["rows_decoded"] > 0
    _ordered(base["decoded"], DECODED_FLOOR)
    assert base["decoded"]["unseen"] == 0  # the bare loop sees every row before the marker
    assert dblog["commits"] > 0 and dblog["achieved_tps"] > 0
    for path in ("changelog", "mirror"):
        _ordered(dblog[path])
        assert dblog[path]["unseen"] == 0  # every write reached the lake before the timeout
        for p in ("p50", "p99"):
            ratio = doc["results"]["ratio"][f"{path}_{p}"]
            # none against a baseline at or below zero (see DECODED_FLOOR)
            assert ratio > 0 if base["decoded"][p] > 0 else ratio is None
    assert dblog["delta_versions"]["changelog"] > 0 and dblog["tailer_events"] > 0
    assert dblog["capture"]["statuses"] == ["done"] and dblog["capture"]["seconds"] > 0


def test_impact_bench_smoke(services: Endpoints, tmp_path: Path) -> None:
    # Pinned and throttled where it can be (its affinities and the read-rate limit are what
    # can go wrong); pinned alone and unpinned are the same run without them, left to
    # `make bench`.
    placement = "pinned-throttled" if len(os.sched_getaffinity(0)) >= 2 else "unpinned"
    doc = _run("bench_impact", tmp_path / "impact.json", "impact", "--placements", placement)
    rows = {r["placement"]: r for r in doc["results"]}
    assert set(rows) == {placement}
    for row in rows.values():
        for side in ("without", "tailer", "with"):
            _ordered(row[side])
            assert row[side]["achieved_tps"] > 0
        pipeline = row["with"]["pipeline"]
        assert len(pipeline["ramp_seconds"]) == 2 and pipeline["rows_captured"] >= 0
        # A capture ran beside the writer: its first chunk was emitted before the writer
        # began (the rows it captures while the writer runs may be none in 2 s windows).
        assert pipeline["first_chunk_before_writing"] is True
        assert pipeline["rows_captured_in_all"] >= 2000, pipeline
        # The second round begins where the first ended: the capture runs on.
        assert pipeline["ramp_seconds"][0] > 0 and pipeline["ramp_seconds"][1] == 0
        assert row["ratio"]["p50"] > 0 and row["ratio"]["p99"] > 0
        assert row["ratio_tailer"]["p99"] > 0 and row["ratio_capture_over_tailer"]["p99"] > 0
        # Two rounds, the second backwards; each side measured in both.
        assert [list(r) for r in row["rounds"]] == [["without", "tailer", "with"],
                                                    ["with", "tailer", "without"]]
        for r in row["rounds"]:
            for side in ("without", "tailer", "with"):
                assert r[side]["count"] > 0
        assert row["with"]["count"] == sum(r["with"]["count"] for r in row["rounds"])
        for side in ("tailer", "with"):
            assert len(row["p99_ratio_rounds"][side]) == 2
            assert min(row["p99_ratio_rounds"][side]) <= row["p99_ratio_median"][side]
    if "pinned-throttled" in rows:
        pinned = rows["pinned-throttled"]
        assert pinned["max_rows_per_s"] == 3000
        assert pinned["mariadb_cpus"] == [pinned["app_cpus"]]
        assert pinned["with"]["writer_cpus"] == [[pinned["app_cpus"]]]
        placed = pinned["with"]["pipeline"]["pipeline_cpus"]
        assert placed["process"] == [pinned["pipeline_cpus"]]
        assert placed["jvm"] and all(j == [pinned["pipeline_cpus"]] for j in placed["jvm"])
        # MariaDB got its affinity back.
        from bench.bench_impact import mariadb_pid, thread_affinities

        assert pinned["app_cpus"] not in thread_affinities(mariadb_pid())
