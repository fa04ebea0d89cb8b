"""Asset checks: mirror equals source per key range, changelog positions never go back, tail
lag."""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from assets.naming import TableAssets
from dblog.app.repair import repair_table
from dblog.app.status import collect_status
from dblog.core.ranges import key_ranges
from dblog.lake.audit import audit_position_order
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
                 description=f"Per key range of {table} (the full_state partitions'; "
                             "repair.range_rows where none are planned), one at a time, "
                             "paced by repair.max_rows_per_s: the mirror's row count and "
                             "checksum equal the source's (computed on the database, no rows "
                             "moved); a differing range is compared again before it fails.",
                 blocking=False)
    def mirror_matches_source(context: AssetCheckExecutionContext,
                              dblog: DblogResource) -> AssetCheckResult:
        planned = context.instance.get_dynamic_partitions(names.partitions_name)
        with dblog.runtime(validate=False) as rt:
            # One dry-run pass of the rolling verification: the repair job's own code.
            report = repair_table(rt, table, key_ranges(planned, planned) if planned
                                  else None, dry_run=True)
        differing = report.differing
        firsts = [r.first for r in report.results]
        return AssetCheckResult(
            passed=not differing, severity=AssetCheckSeverity.ERROR,
            description=None if not differing else
            f"{len(differing)} of {report.ranges_checked} key ranges differ: run the table's "
            "repair job (or `dblog repair`)",
            metadata={
                "ranges_compared": report.ranges_checked,
                "ranges_differing": len(differing),
                "source_rows": sum(c.source_rows for c in firsts),
                "mirror_rows": sum(c.mirror_rows for c in firsts),
                "seconds": MetadataValue.float(round(report.seconds, 2)),
                "differing": MetadataValue.md("\n".join(
                    f"- `{c.name}`: source {c.source_rows} rows, mirror {c.mirror_rows} rows"
                    for c in differing[:50]) or "none"),
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
