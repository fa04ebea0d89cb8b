"""The Dagster layer as a user drives it, in-process against the real services: the planner
sensor adds key-range partitions, the tailer job (its own run) writes and reports the
changelog and mirror, a multi-range run of ``full_state`` captures while writers run, and
the asset checks pass; then mirror == source and the changelog replays to the source. Part
of the contract suite: it runs for every source database."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import (
    AssetSelection,
    DagsterInstance,
    Definitions,
    RunsFilter,
    SensorResult,
    SkipReason,
    build_sensor_context,
    define_asset_job,
    instance_for_test,
    materialize,
)
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from assets.definitions import build_definitions
from assets.naming import TAILER_TAG, TableAssets, tailer_job_name
from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from dblog.core.ranges import parse_range_name
from devtools.sample import TABLES
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table
from tests.integration.sources import KEYS, SourceKit

pytestmark = pytest.mark.integration

RANGE_ROWS = 250


def write_config(path: Path, kit: SourceKit, db: str, source: str) -> Path:
    kit.config(path, source=source, db=db, lake=path.parent / "lake", chunk_size=250,
               batch_seconds=1.0, chunk_max_rows=2000)
    data = yaml.safe_load(path.read_text())
    data["capture"]["range_rows"] = RANGE_ROWS
    data["zookeeper"]["root"] = f"dblog-dagster-{uuid.uuid4().hex[:6]}"
    path.write_text(yaml.safe_dump(data))
    return path


def sensor(defs: Definitions, name_part: str) -> Any:
    (found,) = [s for s in defs.sensors or [] if name_part in s.name]
    return found


def plan(defs: Definitions, instance: DagsterInstance) -> dict[str, list[str]]:
    planner = sensor(defs, "range_planner")
    with build_sensor_context(instance=instance, resources=defs.resources) as context:
        result = planner(context)
    if isinstance(result, SkipReason):
        assert result.skip_message == "no new ranges"
        return {}
    assert isinstance(result, SensorResult), result
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name,
                                        list(request.partition_keys))
    return {r.partitions_def_name: list(r.partition_keys)
            for r in result.dynamic_partitions_requests or []}


# The Dagster layer only wires pipeline/, and the PostgreSQL source's captures and tail are
# tested in `make test`: its backfill here (about 50 s) runs in `make test-slow`.
@pytest.mark.parametrize(
    "source_kit", ["mariadb", pytest.param("postgres", marks=pytest.mark.slow)],
    indirect=True)
def test_backfill_ranges_while_the_tailer_job_runs(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    db = source_kit.create("dg", accounts=500, orders=300, seed=11)
    with source_kit.cleaned(db, "dg") as source:
        _backfill_ranges_while_the_tailer_job_runs(source_kit, spark, tmp_path, db, source)


def _backfill_ranges_while_the_tailer_job_runs(
    source_kit: SourceKit, spark: Any, tmp_path: Path, db: str, source: str
) -> None:
    path = write_config(tmp_path / "dblog.yaml", source_kit, db, source)
    defs = build_definitions(path)
    names = {t: TableAssets(source, TableId(db, t)) for t in TABLES}
    (tmp_path / "dagster").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        # The planner: ranges of RANGE_ROWS rows in key order, the last open.
        added = plan(defs, instance)
        accounts = added[names["accounts"].partitions_name]
        assert [parse_range_name(k).index for k in accounts] == [0, 1]
        assert parse_range_name(accounts[1]).lower == (RANGE_ROWS,)
        assert plan(defs, instance) == {}  # nothing new until the table grows

        # The keep-alive sensor asks for a tailer run while none runs.
        keep_alive = sensor(defs, "keep_alive")
        with build_sensor_context(instance=instance, resources=defs.resources) as context:
            wanted = keep_alive(context)
        assert [r.tags for r in wanted.run_requests] == [{TAILER_TAG: source}]

        tailer = defs.get_job_def(tailer_job_name(source))
        outcome: dict[str, Any] = {}

        def run_tailer() -> None:
            outcome["result"] = tailer.execute_in_process(
                instance=instance, resources=defs.resources, raise_on_error=False,
            )

        thread = threading.Thread(target=run_tailer, daemon=True)
        thread.start()
        with open_runtime(load_config(path), spark=spark) as rt:
            deadline = time.monotonic() + 60
            while rt.state.get_position() is None:
                assert thread.is_alive() and time.monotonic() < deadline, outcome
                time.sleep(0.2)
            with build_sensor_context(instance=instance, resources=defs.resources) as context:
                skipped = keep_alive(context)
            assert not skipped.run_requests, "a second tailer was requested"

            workload = source_kit.workload(db, 11, pause_s=0.03, reserve_every=10)
            try:
                # One run captures all of accounts' ranges (as a backfill's multi-range run
                # does), one run a single range of orders, then the rest of orders.
                for table, keys in (("accounts", accounts),
                                    ("orders", added[names["orders"].partitions_name][:1]),
                                    ("orders", added[names["orders"].partitions_name][1:])):
                    asset = defs.get_assets_def(names[table].full_state)
                    result = materialize(
                        [asset], instance=instance, resources=defs.resources,
                        tags={"dagster/asset_partition_range_start": keys[0],
                              "dagster/asset_partition_range_end": keys[-1]})
                    assert result.success
                    done = result.asset_materializations_for_node(asset.node_def.name)
                    assert sorted(m.partition for m in done) == sorted(keys)
                    for m in done:
                        assert m.metadata["chunks"].value >= 1
                        assert m.metadata["rows_selected"].value >= 1
            finally:
                workload.stop()
            rt.wait_caught_up(lambda: None if thread.is_alive() else pytest.fail(
                f"the tailer run ended early: {outcome}"))
            # The asset checks pass while the tailer runs.
            checks = define_asset_job("checks", selection=AssetSelection.checks_for_assets(
                *[n.mirror for n in names.values()], *[n.changelog for n in names.values()]))
            job = Definitions(assets=defs.assets, asset_checks=defs.asset_checks,
                              jobs=[checks], resources=defs.resources).resolve_job_def("checks")
            checked = job.execute_in_process(instance=instance)
            evaluations = [e.asset_check_evaluation_data for e in checked.all_events
                           if e.event_type_value == "ASSET_CHECK_EVALUATION"]
            assert len(evaluations) == 6
            assert all(e.passed for e in evaluations), [
                (e.asset_key, e.check_name, e.metadata) for e in evaluations if not e.passed]

            # A lost mirror row: the repair job finds its range and captures only it.
            DeltaTable.forPath(spark, rt.layout.mirror(TableId(db, "accounts"))).delete(
                F.col("id") == 300)
            # The check runs the rolling verification's dry run: it fails on that range.
            mirror_check = define_asset_job("mirror_check", selection=(
                AssetSelection.checks_for_assets(names["accounts"].mirror)))
            checked = Definitions(
                assets=defs.assets, asset_checks=defs.asset_checks, jobs=[mirror_check],
                resources=defs.resources).resolve_job_def("mirror_check").execute_in_process(
                    instance=instance, raise_on_error=False)
            (failed,) = [e.asset_check_evaluation_data for e in checked.all_events
                         if e.event_type_value == "ASSET_CHECK_EVALUATION"]
            assert failed.check_name == "mirror_matches_source" and not failed.passed
            assert failed.metadata["ranges_differing"].value == 1, failed.metadata
            repair = defs.get_job_def(f"repair_{'__'.join(names['accounts'].prefix)}")
            repaired = repair.execute_in_process(instance=instance, resources=defs.resources)
            assert repaired.success
            (output,) = [e for e in repaired.all_events if e.event_type_value == "STEP_OUTPUT"]
            meta = output.event_specific_data.metadata  # type: ignore[union-attr]
            # The table grew while writers ran: the repair planned its new ranges first.
            planned = instance.get_dynamic_partitions(names["accounts"].partitions_name)
            assert len(planned) > len(accounts)
            assert meta["ranges_checked"].value == len(planned)
            assert meta["ranges_repaired"].value == 1
            rt.wait_caught_up(lambda: None)
            assert verify_table(rt.dialect, rt.sink, TableId(db, "accounts")).ok

            # Terminate the run as the UI does: it stops at a batch boundary.
            (record,) = instance.get_run_records(RunsFilter(job_name=tailer.name))
            instance.report_run_canceling(record.dagster_run)
            thread.join(120)
            assert not thread.is_alive(), "the tailer run did not stop when terminated"
            assert rt.state.lock_holder() is None
            result = outcome["result"]
            assert result.success, result
            for table in TABLES:
                changelog = instance.get_latest_materialization_event(names[table].changelog)
                assert changelog is not None and changelog.asset_materialization is not None
                assert changelog.asset_materialization.metadata["lsn"].value > 0
                assert instance.get_latest_materialization_event(names[table].mirror)
                check_table(spark, source_kit.ep, db, table, KEYS[table],
                            rt.layout.changelog(TableId(db, table)),
                            expected_rows=source_kit.rows(db, table))

        # A rotated tailer run: it ends by itself after max_run_seconds.
        began = time.monotonic()
        rotated = tailer.execute_in_process(
            instance=instance, resources=defs.resources,
            run_config={"ops": {tailer.graph.node_defs[0].name: {
                "config": {"max_run_seconds": 3.0}}}})
        assert rotated.success
        assert time.monotonic() - began < 60
