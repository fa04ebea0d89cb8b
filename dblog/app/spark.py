"""The one place a SparkSession is built: Delta configured from local jar files.

Spark never downloads at session start: ``make setup`` fetches the jars listed in
``jars/pom.xml`` with Maven into :func:`dblog.app.paths.jars_dir`, and the session puts
exactly those files on the driver and executor class paths.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dblog.app.jvm_archive import archive_options
from dblog.app.paths import dblog_home, jars_dir
from dblog.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REQUIRED_JAR_PREFIXES = ("delta-spark_", "delta-storage-", "mariadb-java-client-", "postgresql-")


def local_jars(directory: Path | None = None) -> list[Path]:
    """The jar files Spark needs, or a clear error naming what is missing."""
    directory = directory or jars_dir()
    jars = sorted(directory.glob("*.jar")) if directory.exists() else []
    missing = [p for p in REQUIRED_JAR_PREFIXES if not any(j.name.startswith(p) for j in jars)]
    if missing:
        raise ConfigError(
            f"jars missing in {directory}: {', '.join(missing)}*.jar; run `make setup` "
            "(fetches them with Maven from jars/pom.xml)"
        )
    return jars


C2_THRESHOLDS = (
    "-XX:Tier4InvocationThreshold=15000", "-XX:Tier4MinInvocationThreshold=1800",
    "-XX:Tier4CompileThreshold=45000", "-XX:Tier4BackEdgeThreshold=120000",
)
"""The JVM's C2 compiler takes a method at three times HotSpot's default call and loop
counts. The driver runs Spark's planner (analysis, optimizer, Delta's log code) a few
hundred times a capture: with the defaults C2 kept compiling its lukewarm methods capture
after capture (654 methods compiled for the first time in a third 1M-row capture in one
JVM), 12 CPU-s of a warm capture's ~50 against the plain dump's 2.5. With these, 6-7
CPU-s, and the rows' own loops, called millions of times, still reach C2 early in a run
(the tail's rate did not drop: docs/performance-log.md, 2026-11-26, late night)."""


JAVA_OPTIONS = "spark.driver.extraJavaOptions"
"""dblog's JVM options (the Derby home, :data:`C2_THRESHOLDS`); a configuration's own are
added after them, not instead."""


def spark_conf(
    *, master: str | None = None, extra: Mapping[str, str] | None = None,
    jars: Sequence[str] = (),
) -> dict[str, str]:
    """The Spark configuration dblog uses (Delta extension and catalog, local jars), with
    ``extra`` settings and ``jars`` (a configuration's ``spark.conf`` and ``spark.jars``)."""
    missing = [j for j in jars if not Path(j).is_file()]
    if missing:
        raise ConfigError(f"spark.jars: no such jar file: {', '.join(missing)}")
    jar_list = ",".join([*(str(j) for j in local_jars()), *jars])
    warehouse = dblog_home() / "spark-warehouse"
    conf = {
        "spark.master": master or os.environ.get("DBLOG_SPARK_MASTER", "local[2]"),
        "spark.app.name": "dblog-delta",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.jars": jar_list,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": str(warehouse),
        JAVA_OPTIONS: " ".join(
            [f"-Dderby.system.home={dblog_home() / 'derby'}", *C2_THRESHOLDS,
             *archive_options()]),
        # Micro-batches are small: a few tasks beat Spark's 200 shuffle partitions and Delta's
        # 50 snapshot partitions by far (bench/bench_sink.py measures it).
        "spark.sql.shuffle.partitions": os.environ.get("DBLOG_SHUFFLE_PARTITIONS", "2"),
        "spark.databricks.delta.snapshotPartitions": "2",
        # VACUUM lists a table's directories in this many tasks (Spark's default, 10,000,
        # made one vacuum of a small local table take minutes of task overhead).
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": os.environ.get(
            "DBLOG_LISTING_PARALLELISM", "8"),
        "spark.sql.session.timeZone": "UTC",
        # Generated classes kept for reuse (Spark's default, 100, is fewer than one capture
        # compiles, so a second capture or the tailer's next merges compiled them all again);
        # ~26 KB of source each.
        "spark.sql.codegen.cache.maxEntries": "1000",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "true",
        "spark.sql.ansi.enabled": "false",
        "spark.driver.memory": os.environ.get("DBLOG_SPARK_DRIVER_MEMORY", "2g"),
    }
    for key, value in (extra or {}).items():
        if key == JAVA_OPTIONS:
            # The user's options after dblog's: where both set a flag, the JVM takes the last.
            value = f"{conf[key]} {value.strip()}".strip()
        conf[key] = value
    return conf


def build_spark_session(
    *, master: str | None = None, extra: Mapping[str, str] | None = None,
    jars: Sequence[str] = (),
) -> SparkSession:
    """Get or create the SparkSession with Delta from local jars (``local[2]`` by default)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = spark_conf(master=master, extra=extra, jars=jars)
    if conf["spark.master"].startswith("local"):
        # A local session's Python workers run on this machine: with this interpreter, not
        # whatever `python3` is first on PATH (PySpark's default when PYSPARK_PYTHON is unset;
        # it reads no Spark setting for it outside spark-submit).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("DBLOG_SPARK_LOG_LEVEL", "ERROR"))
    return session
