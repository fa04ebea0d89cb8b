"""Records what ``make demo`` did in the Dagster instance of ``make dagster``, so the UI opens
on a captured state: the tables' key ranges as ``full_state`` partitions, each reported
materialized by the demo's capture, and the changelog and mirror at the tail's position."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from dagster import AssetMaterialization, DagsterInstance

from assets.naming import TableAssets
from dblog.app.paths import PROJECT_ROOT, dblog_home
from dblog.app.runtime import Runtime
from dblog.capture import RangeReport
from dblog.core.ranges import plan_more


def dagster_home() -> Path:
    """``make dagster``'s ``DAGSTER_HOME`` (its ``dagster.yaml`` copied from ``deploy/``)."""
    home = dblog_home() / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    return home


def record_demo(rt: Runtime, reports: Sequence[RangeReport], home: Path | None = None) -> int:
    """Report the demo's capture to the instance; returns the number of partitions."""
    instance = DagsterInstance.from_config(str(home or dagster_home()))
    source = rt.config.source.name
    position = rt.state.get_position()
    lsn = position.value.position.lsn if position is not None else 0
    total = 0
    try:
        for table in rt.config.table_ids:
            names = TableAssets(source, table)
            existing = instance.get_dynamic_partitions(names.partitions_name)
            new = plan_more(existing, partial(rt.dialect.key_after, table),
                            rt.config.capture.range_rows)
            if new:
                instance.add_dynamic_partitions(names.partitions_name, new)
            captured = [r for r in reports if r.table == table and r.status == "done"]
            for key in [*existing, *new]:
                instance.report_runless_asset_event(AssetMaterialization(
                    names.full_state, partition=key, description="captured by make demo",
                    metadata={"capture_id": captured[0].capture_id if captured else ""}))
                total += 1
            for asset_key in (names.changelog, names.mirror):
                instance.report_runless_asset_event(AssetMaterialization(
                    asset_key, description="written by make demo's tailer", metadata={"lsn": lsn}))
    finally:
        instance.dispose()
    return total
