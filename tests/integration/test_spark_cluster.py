"""The end-to-end test (writers during capture and tail, then mirror == source and an
independent replay == source, for every source database) against a Spark standalone master
and worker on loopback started from the pyspark distribution's launch classes, not
``local[2]``: nothing may rely on driver-local state that executors cannot reach. Slow
(``make test-slow``): each run starts executors on the cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from devtools import services as local
from devtools.services import Endpoints

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_end_to_end_test_passes_on_a_spark_standalone_cluster(
        services: Endpoints) -> None:
    cluster = local.SparkStandalone()
    cluster.up()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/integration/test_end_to_end.py", "-q",
             "--seeds", "1", "-k", "variant0", "-p", "no:cacheprovider"],
            cwd=ROOT, env={**os.environ, "DBLOG_SPARK_MASTER": cluster.master_url},
            capture_output=True, text=True, timeout=1800, check=False)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert "2 passed" in proc.stdout, proc.stdout[-2000:]
        with urllib.request.urlopen(  # noqa: S310 - the local master's status page
                f"http://127.0.0.1:{cluster.port + 1}/json/", timeout=5) as reply:
            status = json.load(reply)
        ran = [app for app in status["completedapps"] if app["name"] == "dblog-delta"]
        assert ran, "the test's Spark application never ran on the cluster"
    finally:
        cluster.down()
