"""The Spark session dblog builds: settings that must reach the JVM itself."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.spark import C2_THRESHOLDS

pytestmark = pytest.mark.integration


def test_the_driver_jvm_runs_with_dblogs_c2_thresholds(spark: Any) -> None:
    """JVM options take effect only when the JVM starts: the session's driver was started
    with them (a local session's tasks run in the same JVM)."""
    jvm = spark.sparkContext._jvm
    arguments = set(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                    .getInputArguments())
    assert set(C2_THRESHOLDS) <= arguments
    assert any(a.startswith("-Dderby.system.home=") for a in arguments)
