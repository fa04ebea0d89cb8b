"""The source's tailer as one long-running Dagster job, kept alive by a sensor.

The job's op runs :func:`dblog.tail.follow.tail_following_config` on a thread and yields a
materialization of each touched table's ``changelog`` and ``mirror`` per committed batch
(Dagster publishes an op's events when it yields them). Terminating the run from the UI
interrupts the op; it stops the tailer at a batch boundary before the run ends.

The keep-alive sensor launches the job when no run of it is queued or running and the
ZooKeeper tailer lock is free (a ``dblog tail`` outside Dagster holds it); the run tag's
concurrency limit of 1 in ``dagster.yaml`` is the hard guard, the lock the final one.
"""

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetMaterialization,
    Config,
    DagsterRunStatus,
    DefaultSensorStatus,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    job,
    op,
    sensor,
)

from assets.naming import TAILER_TAG, TableAssets, safe_name, tailer_job_name
from dblog.app.config import load_config
from dblog.core.errors import DblogError, LockHeld
from dblog.core.events import TableId, seconds_since_commit
from dblog.tail import BatchReport
from dblog.tail.follow import tail_following_config
from resources import DblogResource

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
          DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
STOP_TIMEOUT_S = 300.0
STATUS_CHECK_S = 2.0
DEAD_AFTER_S = 120.0
"""A started tailer run that holds no lock after this long is taken for dead."""


def _cancel_requested(context: OpExecutionContext) -> bool:
    """Whether the run was marked for termination (the UI's Terminate also interrupts the
    op; this catches a termination whose interrupt did not reach it)."""
    run = context.instance.get_run_by_id(context.run.run_id)
    return run is not None and run.status == DagsterRunStatus.CANCELING


def batch_materializations(source_name: str, report: BatchReport,
                           now_s: float | None = None) -> list[AssetMaterialization]:
    """The changelog materializations of one committed batch, or the mirror
    materializations of one mirror merge (the mirror follows the changelog)."""
    now_s = time.time() if now_s is None else now_s
    lag = seconds_since_commit(report.commit_ts_ms or None, now_s)
    out = []
    if report.mirror_only:
        for table, rows in sorted(report.mirrors.items(), key=lambda kv: str(kv[0])):
            out.append(AssetMaterialization(
                asset_key=TableAssets(source_name, table).mirror,
                metadata={"merged_through_batch": report.batch, "lsn": report.position.lsn,
                          "changelog_rows_merged": rows,
                          "merge_seconds": MetadataValue.float(round(report.seconds, 3))}))
        return out
    for table, events in sorted(report.table_events.items(), key=lambda kv: str(kv[0])):
        names = TableAssets(source_name, table)
        metadata: dict[str, Any] = {
            "batch": report.batch,
            "lsn": report.position.lsn,
            "events": events,
            "batch_events": report.events,
            "chunks_emitted": len(report.emitted_windows),
            "chunk_rows_emitted": report.rows_emitted,
            "write_seconds": MetadataValue.float(round(report.seconds, 3)),
            "lag_seconds": MetadataValue.float(round(lag, 3)) if lag is not None
            else MetadataValue.null(),
        }
        out.append(AssetMaterialization(asset_key=names.changelog, metadata=metadata))
    return out


def _configured_tables(path: str) -> tuple[TableId, ...]:
    return load_config(path).table_ids


class TailRunConfig(Config):
    """Launch settings of a tailer run."""

    max_run_seconds: float = 0.0
    """End the run cleanly after this long (0: never). The keep-alive sensor starts the next
    one from the committed position, so a deployment can rotate tailer runs (and their event
    logs) daily."""


def run_lock_identifier(run_id: str) -> str:
    """The tailer-lock identifier of a Dagster run (the sensor tells its own runs apart)."""
    return f"dagster-run-{run_id}"


def tailer_job(source_name: str) -> JobDefinition:
    """The long-running tailer job of one source."""

    @op(name=f"tail_{safe_name(source_name)}", out={},
        description=f"Tail {source_name}'s log into the changelog and mirror tables.")
    def tail(context: OpExecutionContext, config: TailRunConfig,
             dblog: DblogResource) -> Iterator[AssetMaterialization]:
        reports: queue.Queue[BatchReport] = queue.Queue()
        notices: queue.Queue[str] = queue.Queue()
        stop = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            try:
                with dblog.runtime() as rt:
                    tail_following_config(
                        rt, lambda: _configured_tables(dblog.config_path), stop=stop,
                        on_batch=reports.put, on_notice=notices.put,
                        identifier=run_lock_identifier(context.run.run_id))
            except BaseException as exc:  # surfaced in the op below
                failure.append(exc)

        thread = threading.Thread(target=main, name="dblog-tailer", daemon=True)
        thread.start()
        ends = time.monotonic() + config.max_run_seconds if config.max_run_seconds > 0 else None
        next_status_check = 0.0
        try:
            while thread.is_alive() or not reports.empty():
                if ends is not None and time.monotonic() >= ends and not stop.is_set():
                    context.log.info(f"max_run_seconds reached: stopping the tailer of "
                                     f"{source_name} at a batch boundary")
                    stop.set()
                if time.monotonic() >= next_status_check and not stop.is_set():
                    next_status_check = time.monotonic() + STATUS_CHECK_S
                    if _cancel_requested(context):
                        context.log.info(f"run termination requested: stopping the tailer "
                                         f"of {source_name} at a batch boundary")
                        stop.set()
                while not notices.empty():
                    context.log.warning(notices.get())
                try:
                    report = reports.get(timeout=1.0)
                except queue.Empty:
                    continue
                yield from batch_materializations(source_name, report)
        finally:
            stop.set()
            thread.join(STOP_TIMEOUT_S)
        if failure:
            exc = failure[0]
            if isinstance(exc, LockHeld):
                raise Failure(description=f"another tailer runs for {source_name}: {exc}. "
                              "Only one tailer may write a source; stop the other one first.")
            if isinstance(exc, DblogError):
                raise Failure(description=f"the tailer of {source_name} stopped: {exc}")
            raise exc

    @job(name=tailer_job_name(source_name), tags={TAILER_TAG: source_name},
         description=f"The one tailer of {source_name} (kept alive by its sensor).")
    def _tailer() -> None:
        tail()

    return _tailer


def keep_alive_sensor(source_name: str, job_def: JobDefinition) -> SensorDefinition:
    """Launches the tailer job whenever none runs; its cursor is the committed position."""

    @sensor(name=f"{job_def.name}_keep_alive", job=job_def,
            default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=30,
            description=f"Keeps exactly one tailer of {source_name} running.")
    def _keep_alive(context: SensorEvaluationContext,
                    dblog: DblogResource) -> SensorResult | SkipReason:
        records = context.instance.get_run_records(
            RunsFilter(job_name=job_def.name, tags={TAILER_TAG: source_name}, statuses=ACTIVE),
            limit=1)
        try:
            with dblog.runtime(validate=False) as rt:
                holder = rt.state.lock_holder()
                found = rt.state.get_position()
        except DblogError as exc:
            return SkipReason(f"cannot read the tailer's state: {exc}")
        cursor = None
        if found is not None:
            native = ",".join(f"{k}={v}" for k, v in sorted(found.value.source_position.items()))
            cursor = f"batch {found.value.batch} at {native}"
        if records:
            record = records[0]
            run = record.dagster_run
            started = record.start_time or record.create_timestamp.timestamp()
            if (run.status == DagsterRunStatus.STARTED and holder is None
                    and time.time() - started > DEAD_AFTER_S):
                # Started long ago yet holds no lock: its process died without telling
                # Dagster (killed, host lost). Mark it failed and start the next tailer.
                context.instance.report_run_failed(
                    run, f"the tailer of {source_name} holds no lock: its process is gone")
                return SensorResult(run_requests=[RunRequest(tags={TAILER_TAG: source_name})],
                                    cursor=cursor)
            return SensorResult(skip_reason=f"tailer run {run.run_id[:8]} is "
                                f"{run.status.value.lower()}", cursor=cursor)
        if holder is not None:
            return SensorResult(skip_reason=f"the tailer lock is held by {holder} (a tailer "
                                "outside Dagster?)", cursor=cursor)
        return SensorResult(run_requests=[RunRequest(tags={TAILER_TAG: source_name})],
                            cursor=cursor)

    return _keep_alive
