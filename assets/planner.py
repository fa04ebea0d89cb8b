"""The range planner: adds ``full_state`` partitions (key ranges) as tables grow."""

from collections.abc import Sequence
from functools import partial

from dagster import (
    AddDynamicPartitionsRequest,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.naming import TableAssets, safe_name
from dblog.app.runtime import Runtime
from dblog.core.errors import DblogError
from dblog.core.ranges import plan_more
from resources import DblogResource

PLAN_MOST_PER_TICK = 2000
"""New ranges per table and tick (a tick must end within Dagster's 60 s)."""


def plan_requests(rt: Runtime, source_name: str, existing: dict[str, Sequence[str]]
                  ) -> tuple[list[AddDynamicPartitionsRequest], list[str]]:
    """Requests adding each table's new ranges, and one message per table that failed."""
    requests, errors = [], []
    range_rows = rt.config.capture.range_rows
    for table in rt.config.table_ids:
        names = TableAssets(source_name, table)
        try:
            new = plan_more(existing.get(names.partitions_name, ()),
                            partial(rt.dialect.key_after, table), range_rows,
                            most=PLAN_MOST_PER_TICK)
        except DblogError as exc:
            errors.append(f"{table}: {exc}")
            continue
        if new:
            requests.append(AddDynamicPartitionsRequest(names.partitions_name, new))
    return requests, errors


def planner_sensor(source_name: str, tables: Sequence[TableAssets]) -> SensorDefinition:
    """Every minute, plan ranges of ``capture.range_rows`` rows above each table's last."""

    @sensor(name=f"dblog_range_planner_{safe_name(source_name)}",
            default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=60,
            description=f"Adds key-range partitions of {source_name}'s tables as they grow.")
    def _planner(context: SensorEvaluationContext, dblog: DblogResource
                 ) -> SensorResult | SkipReason:
        existing = {t.partitions_name: context.instance.get_dynamic_partitions(t.partitions_name)
                    for t in tables}
        try:
            with dblog.runtime(validate=False) as rt:
                requests, errors = plan_requests(rt, source_name, existing)
        except DblogError as exc:
            return SkipReason(f"cannot plan ranges: {exc}")
        for text in errors:
            context.log.error(f"cannot plan ranges of {text}")
        if not requests:
            return SkipReason("no new ranges" + (f"; errors: {'; '.join(errors)}"
                                                 if errors else ""))
        return SensorResult(dynamic_partitions_requests=requests)

    return _planner
