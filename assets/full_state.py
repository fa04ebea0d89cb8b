"""``full_state``: a table's DBLog capture, one dynamic partition per primary-key range.

Materializing partitions runs one capture of their ranges and succeeds once the source's
tailer (its own long-running job) has emitted every chunk. Backfills use
``BackfillPolicy.multi_run``: a run costs a JVM start (~10 s), so a run captures up to
``RANGES_PER_RUN`` consecutive ranges (~1M rows at 100k rows per range) while the source's
pool in ``dagster.yaml`` bounds how many capture runs hit one database at once.
"""

import threading
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    DagsterExecutionInterruptedError,
    DynamicPartitionsDefinition,
    Failure,
    MetadataValue,
    asset,
)

from assets.naming import TableAssets, pool_name
from dblog.capture import RangeReport
from dblog.capture.range_capture import capture_ranges, tailer_watchdog
from dblog.core.errors import DblogError
from dblog.core.ranges import key_ranges
from resources import DblogResource

RANGES_PER_RUN = 10


def range_metadata(report: RangeReport) -> dict[str, Any]:
    """What a person checks on a captured range, as materialization metadata."""
    return {
        "rows_selected": report.rows_selected,
        "rows_emitted": report.rows_emitted,
        "rows_dropped_by_windows": report.rows_dropped,
        "rows_deleted": report.rows_deleted,
        "chunks": report.chunks,
        "chunk_retries": report.retries,
        "first_lsn": MetadataValue.int(report.first_lsn) if report.first_lsn is not None
        else MetadataValue.null(),
        "last_lsn": MetadataValue.int(report.last_lsn) if report.last_lsn is not None
        else MetadataValue.null(),
        "capture_id": report.capture_id,
        "seconds": MetadataValue.float(round(report.seconds, 2)),
    }


def full_state_asset(source_name: str, names: TableAssets) -> AssetsDefinition:
    """The ``full_state`` asset of one table."""
    partitions = DynamicPartitionsDefinition(name=names.partitions_name)
    table = names.table

    @asset(
        key=names.full_state,
        deps=[names.source],
        partitions_def=partitions,
        backfill_policy=BackfillPolicy.multi_run(max_partitions_per_run=RANGES_PER_RUN),
        pool=pool_name(source_name),
        group_name=names.group,
        kinds={"spark", "delta"},
        description=f"Full state of {table} captured with DBLog watermarks, one partition per "
                    "primary-key range; rows reach the changelog and mirror through the tailer.",
        metadata={"table": str(table), "source": source_name},
    )
    def _full_state(context: AssetExecutionContext, dblog: DblogResource) -> None:
        selected = list(context.partition_keys)
        planned = context.instance.get_dynamic_partitions(names.partitions_name)
        stop = threading.Event()
        try:
            with dblog.runtime() as rt:
                ranges = key_ranges(planned, selected)

                def progress(r: RangeReport) -> None:
                    context.log.info(f"{table} range {r.range_id}: {r.chunks} chunks, "
                                     f"{r.rows_selected} rows selected ({r.status})")

                reports = capture_ranges(
                    rt, table, ranges, capture_id=f"dagster-{context.run.run_id[:12]}",
                    stop=stop, health_check=tailer_watchdog(rt), on_progress=progress)
        except DagsterExecutionInterruptedError:
            stop.set()
            raise
        except DblogError as exc:
            raise Failure(description=f"capture of {table} failed: {exc}") from None
        unfinished = [f"{name}: {r.status}" for name, r in reports.items() if r.status != "done"]
        missing = [name for name in selected if name not in reports]
        if unfinished or missing:
            raise Failure(description=f"capture of {table} did not finish: "
                          f"{', '.join(unfinished + [f'{m}: not run' for m in missing])}")
        for name, report in reports.items():
            context.add_asset_metadata(range_metadata(report), partition_key=name)

    return _full_state
