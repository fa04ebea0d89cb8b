"""Asset checks: mirror equals source, changelog positions never go back, tail lag."""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from assets.naming import TableAssets
from pipeline.lake.audit import audit_position_order
from pipeline.status import collect_status
from pipeline.verify import verify_table
from resources import DblogResource


def lag_severity(lag_s: float | None, warn_s: float, error_s: float
                 ) -> tuple[bool, AssetCheckSeverity]:
    """Whether a lag passes, and the severity if it does not (unknown lag: a warning)."""
    if lag_s is None:
        return False, AssetCheckSeverity.WARN
    if lag_s > error_s:
        return False, AssetCheckSeverity.ERROR
    return lag_s <= warn_s, AssetCheckSeverity.WARN


def table_checks(names: TableAssets) -> list[AssetChecksDefinition]:
    """The checks of one table's changelog and mirror."""
    table = names.table

    @asset_check(asset=names.mirror, name="mirror_matches_source",
                 description=f"Every row of {table}'s mirror equals the source's, and no row "
                             "is missing or extra (compared inside Spark).", blocking=False)
    def mirror_matches_source(context: AssetCheckExecutionContext,
                              dblog: DblogResource) -> AssetCheckResult:
        with dblog.runtime(validate=False) as rt:
            report = verify_table(rt.dialect, rt.sink, table)
        return AssetCheckResult(
            passed=report.ok, severity=AssetCheckSeverity.ERROR,
            description=None if report.ok else report.summary(),
            metadata={
                "source_rows": report.source_rows, "mirror_rows": report.mirror_rows,
                "differing_rows": report.differing,
                "missing_keys": MetadataValue.text(", ".join(map(str, report.missing_keys[:20]))),
                "extra_keys": MetadataValue.text(", ".join(map(str, report.extra_keys[:20]))),
                "different_keys": MetadataValue.text(
                    ", ".join(map(str, report.different_keys[:20]))),
            })

    @asset_check(asset=names.changelog, name="positions_never_go_back",
                 description=f"Per key of {table}, changelog positions rise in commit order.",
                 blocking=False)
    def positions_never_go_back(context: AssetCheckExecutionContext,
                                dblog: DblogResource) -> AssetCheckResult:
        with dblog.runtime(validate=False) as rt:
            if not rt.sink.known_columns(table):
                return AssetCheckResult(passed=True, metadata={"rows": 0},
                                        description="no changelog yet")
            key = rt.dialect.table_schema(table).key
            audit = audit_position_order(rt.spark, rt.sink.layout.changelog(table), key)
        return AssetCheckResult(
            passed=audit.ok, severity=AssetCheckSeverity.ERROR,
            metadata={"rows": audit.rows, "keys_back_in_position": audit.keys_back,
                      "samples": MetadataValue.text(", ".join(map(str, audit.samples)))})

    @asset_check(asset=names.changelog, name="tail_lag",
                 description="How far the tailer's committed position is behind the source "
                             "(WARN above tail.lag_warn_s, ERROR above tail.lag_error_s).",
                 blocking=False)
    def tail_lag(context: AssetCheckExecutionContext, dblog: DblogResource) -> AssetCheckResult:
        with dblog.runtime(validate=False) as rt:
            status = collect_status(rt)
            tail = rt.config.tail
        passed, severity = lag_severity(status.lag_seconds, tail.lag_warn_s, tail.lag_error_s)
        return AssetCheckResult(
            passed=passed, severity=severity,
            description=None if status.lag_seconds is not None
            else "no committed position yet (is the tailer running?)",
            metadata={
                "lag_seconds": MetadataValue.float(round(status.lag_seconds, 3))
                if status.lag_seconds is not None else MetadataValue.null(),
                "lag_bytes": MetadataValue.int(status.lag_bytes)
                if status.lag_bytes is not None else MetadataValue.null(),
                "tailer": status.tailer or "none",
                "batch": MetadataValue.int(status.batch) if status.batch is not None
                else MetadataValue.null(),
            })

    return [mirror_matches_source, positions_never_go_back, tail_lag]
