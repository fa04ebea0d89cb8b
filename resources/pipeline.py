"""The pipeline's parts as Dagster resources: source, ZooKeeper, lake, Spark, and the runtime
that joins them. Definitions build them from the same YAML config the CLI reads; the source's
password comes from Dagster's ``EnvVar`` (never stored in the config or the run's logs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource
from pyspark.sql import SparkSession

from dblog.app.config import PipelineConfig, load_config
from dblog.app.runtime import Runtime, open_runtime


class DblogConfigResource(ConfigurableResource):  # type: ignore[type-arg]
    """Points at the ``dblog`` YAML config; secrets stay in the environment it names."""

    config_path: str = "dblog.yaml"

    def load(self) -> PipelineConfig:
        return load_config(self.config_path)


class SourceResource(ConfigurableResource):  # type: ignore[type-arg]
    """The source database (MariaDB/MySQL or PostgreSQL); ``password`` is set from an
    ``EnvVar``. ``database``, ``slot`` and ``publication`` are PostgreSQL's."""

    name: str
    kind: str
    host: str
    port: int
    user: str
    password: str
    server_id: int = 5401
    watermark_database: str = "dblog"
    database: str = ""
    slot: str = ""
    publication: str = ""


class ZooKeeperResource(ConfigurableResource):  # type: ignore[type-arg]
    """Where positions, capture progress and the tailer lock live."""

    hosts: str
    root: str = "dblog"


class LakeResource(ConfigurableResource):  # type: ignore[type-arg]
    """The Delta lake's root: a local path or a URI (``s3a://bucket/lake``)."""

    path: str


class DblogResource(ConfigurableResource):  # type: ignore[type-arg]
    """Opens the engine's :class:`~dblog.app.runtime.Runtime` for an op, sensor or check.

    Tables, tail and capture settings come from the YAML config at ``config_path``; the
    connections from the nested resources. Spark starts only when a step needs it."""

    config_path: str
    source: SourceResource
    zookeeper: ZooKeeperResource
    lake: LakeResource
    spark: LazyPySparkResource

    def pipeline_config(self) -> PipelineConfig:
        config = load_config(self.config_path)
        src = self.source
        return replace(
            config,
            source=replace(config.source, name=src.name, kind=src.kind, host=src.host,
                           port=src.port, user=src.user, server_id=src.server_id,
                           watermark_database=src.watermark_database, database=src.database,
                           slot=src.slot, publication=src.publication, secret=src.password),
            zookeeper_hosts=self.zookeeper.hosts,
            zookeeper_root=self.zookeeper.root,
            lake=self.lake.path,
        )

    def _spark_session(self) -> SparkSession:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        session: SparkSession = self.spark.spark_session
        session.sparkContext.setLogLevel(os.environ.get("DBLOG_SPARK_LOG_LEVEL", "ERROR"))
        return session

    @contextmanager
    def runtime(self, *, validate: bool = True) -> Iterator[Runtime]:
        """A connected runtime (closed on exit; the Spark session stays for the process)."""
        with open_runtime(self.pipeline_config(), validate=validate,
                          spark_factory=self._spark_session) as rt:
            yield rt
