"""The Spark session dblog builds: settings that must reach the JVM itself."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from dblog.app.spark import C2_THRESHOLDS

pytestmark = pytest.mark.integration


def test_the_driver_jvm_runs_with_dblogs_c2_thresholds(spark: Any) -> None:
    """JVM options take effect only when the JVM starts: the session's driver was started
    with them (a local session's tasks run in the same JVM)."""
    jvm = spark.sparkContext._jvm
    arguments = set(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                    .getInputArguments())
    assert set(C2_THRESHOLDS) <= arguments
    assert any(a.startswith("-Dderby.system.home=") for a in arguments)


def test_a_local_sessions_python_workers_run_with_dblogs_interpreter(spark: Any) -> None:
    """Python code in the session (a user's function, a frame of Python rows) runs in
    workers started with the interpreter dblog runs in, with its packages, not the first
    `python3` on PATH."""
    def interpreter(_: object) -> str:
        import sys as worker_sys
        return worker_sys.executable

    seen = set(spark.sparkContext.parallelize(range(2), 2).map(interpreter).collect())
    assert seen == {sys.executable}
