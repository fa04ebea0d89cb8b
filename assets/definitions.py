"""Builds the code location from the ``dblog`` YAML config: every configured table gets its
assets (source table -> full_state -> changelog -> mirror), checks and range planning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dagster import AssetSpec, Definitions, EnvVar, MetadataValue
from dagster_pyspark import LazyPySparkResource

from assets.checks import table_checks
from assets.full_state import full_state_asset
from assets.naming import TableAssets
from assets.planner import planner_sensor
from assets.repair import repair_job, repair_schedule
from assets.tailer import keep_alive_sensor, tailer_job
from dblog.app.config import PipelineConfig, load_config
from dblog.app.spark import spark_conf
from dblog.lake.layout import LakeLayout
from resources import DblogResource, LakeResource, SourceResource, ZooKeeperResource


def dblog_resource(config: PipelineConfig, config_path: str) -> DblogResource:
    """The runtime resource of a config; the password stays an ``EnvVar``."""
    src = config.source
    return DblogResource(
        config_path=config_path,
        source=SourceResource(name=src.name, kind=src.kind, host=src.host, port=src.port,
                              user=src.user, password=EnvVar(src.password_env),
                              server_id=src.server_id,
                              watermark_database=src.watermark_database,
                              database=src.database, slot=src.slot,
                              publication=src.publication),
        zookeeper=ZooKeeperResource(hosts=config.zookeeper_hosts, root=config.zookeeper_root),
        lake=LakeResource(path=str(config.lake)),
        spark=LazyPySparkResource(spark_config=spark_conf(
            master=config.spark_master, extra=config.spark_conf, jars=config.spark_jars)),
    )


def table_specs(config: PipelineConfig, names: TableAssets) -> list[AssetSpec]:
    """The source table and the tailer-written changelog and mirror (not materializable by
    hand: only the tailer writes them)."""
    layout = LakeLayout(config.lake, config.source.name)
    table = names.table
    common: dict[str, Any] = {"group_name": names.group}
    return [
        AssetSpec(names.source, kinds={config.source.kind}, **common,
                  description=f"{table} in {config.source.kind} source {config.source.name}",
                  metadata={"table": str(table),
                            "address": f"{config.source.host}:{config.source.port}"}),
        AssetSpec(names.changelog, deps=[names.full_state], kinds={"delta"}, **common,
                  description=f"Every change of {table} in log order (append-only), written "
                              "by the tailer.",
                  metadata={"path": MetadataValue.path(layout.changelog(table))}),
        AssetSpec(names.mirror, deps=[names.changelog], kinds={"delta"}, **common,
                  description=f"The current rows of {table}, one per key, written by the "
                              "tailer.",
                  metadata={"path": MetadataValue.path(layout.mirror(table))}),
    ]


def build_definitions(config_path: str | Path) -> Definitions:
    """The Definitions of one config file (one source)."""
    path = str(Path(config_path).resolve())
    config = load_config(path)
    source = config.source.name
    tables = [TableAssets(source, t) for t in config.table_ids]
    assets: list[Any] = []
    checks: list[Any] = []
    for names in tables:
        assets.extend(table_specs(config, names))
        assets.append(full_state_asset(source, names))
        checks.extend(table_checks(names))
    job = tailer_job(source)
    repairs = [repair_job(source, t) for t in config.tables]
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[job, *repairs],
        schedules=[repair_schedule(source, t, j) for t, j in zip(config.tables, repairs,
                                                                  strict=True)],
        sensors=[keep_alive_sensor(source, job), planner_sensor(source, tables)],
        resources={"dblog": dblog_resource(config, path)},
    )
