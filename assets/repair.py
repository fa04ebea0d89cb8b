"""Repair dumps: a job and a schedule per table that run one pass of the rolling
verification (``dblog.app.repair``) over the ``full_state`` partitions' ranges: compared one
at a time, paced by ``repair.max_rows_per_s``, and only the ranges that differ captured."""

import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

from dagster import (
    AssetMaterialization,
    Config,
    DagsterExecutionInterruptedError,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    Output,
    ScheduleDefinition,
    job,
    op,
)

from assets.full_state import range_metadata
from assets.naming import TableAssets, pool_name
from dblog.app.config import TableConfig
from dblog.app.repair import repair_table
from dblog.capture.range_capture import tailer_watchdog
from dblog.core.errors import DblogError
from dblog.core.ranges import key_ranges, plan_more
from resources import DblogResource

DEFAULT_CRON = "0 3 * * *"
"""The schedule of a table without ``repair_cron``: defined but off until turned on."""


class RepairConfig(Config):
    """Launch settings of a repair run."""

    capture_all: bool = False
    """Capture every range instead of only the ranges that differ."""


def repair_job(source_name: str, table: TableConfig) -> JobDefinition:
    """The repair job of one table."""
    names = TableAssets(source_name, table.table)

    @op(name=f"repair_{'__'.join(names.prefix[1:])}", pool=pool_name(source_name),
        description=f"Compare {table.table}'s mirror with the source per key range (row "
                    "count and checksum on both sides) and capture the differing ranges.")
    def repair(context: OpExecutionContext, config: RepairConfig,
               dblog: DblogResource) -> Iterator[AssetMaterialization | Output[None]]:
        stop = threading.Event()
        try:
            with dblog.runtime() as rt:
                planned = context.instance.get_dynamic_partitions(names.partitions_name)
                new = plan_more(planned, partial(rt.dialect.key_after, table.table),
                                rt.config.capture.range_rows)
                if new:
                    context.instance.add_dynamic_partitions(names.partitions_name, new)
                    planned = [*planned, *new]
                ranges = key_ranges(planned, planned)
                report = repair_table(
                    rt, table.table, ranges,
                    capture_all=config.capture_all or table.repair_capture_all,
                    capture_id=f"repair-{context.run.run_id[:12]}", stop=stop,
                    health_check=tailer_watchdog(rt))
        except DagsterExecutionInterruptedError:
            stop.set()
            raise
        except DblogError as exc:
            raise Failure(description=f"repair of {table.table} failed: {exc}") from None
        for name in report.repaired:
            yield AssetMaterialization(asset_key=names.full_state, partition=name,
                                       metadata={**range_metadata(report.captures[name]),
                                                 "repair": True})
        unfinished = report.unrepaired
        metadata: dict[str, Any] = {
            "ranges_checked": report.ranges_checked,
            "ranges_differing_first": len(report.suspects),
            "ranges_differing": len(report.differing),
            "ranges_repaired": len(report.repaired),
            "differing": MetadataValue.md("\n".join(
                f"- `{c.name}`: source {c.source_rows} rows, mirror {c.mirror_rows} rows"
                for c in report.differing) or "none"),
            "seconds": MetadataValue.float(round(report.seconds, 2)),
        }
        context.log.info(f"repair of {table.table}: {report.ranges_checked} ranges checked, "
                         f"{len(report.differing)} differing, {len(report.repaired)} "
                         f"repaired in {report.seconds:.1f}s")
        if unfinished:
            raise Failure(description=f"repair captures did not finish, or left ranges "
                                      f"differing: {unfinished}",
                          metadata=metadata)
        yield Output(None, metadata=metadata)

    @job(name=f"repair_{'__'.join(names.prefix)}",
         description=f"Repair dump of {table.table}: capture only the ranges that differ.")
    def _repair() -> None:
        repair()

    return _repair


def repair_schedule(source_name: str, table: TableConfig, job_def: JobDefinition
                    ) -> ScheduleDefinition:
    """On with ``repair_cron`` from the config; else defined (daily) but off."""
    return ScheduleDefinition(
        name=f"{job_def.name}_schedule", job=job_def,
        cron_schedule=table.repair_cron or DEFAULT_CRON,
        default_status=(DefaultScheduleStatus.RUNNING if table.repair_cron
                        else DefaultScheduleStatus.STOPPED),
        description=f"Repair dump of {table.table} ({source_name}).")
