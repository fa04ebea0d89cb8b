"""Bad input through the Dagster layer: each gives a clear message in the run's failure
and writes nothing to Delta (a paused capture, a second tailer, a missing table, ZooKeeper
down)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterInstance, instance_for_test, materialize

from assets.definitions import build_definitions
from assets.naming import TableAssets, tailer_job_name
from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from dblog.core.ranges import range_name
from dblog.state import RangeProgress
from devtools.sample import config_dict, create_schema
from devtools.services import Endpoints

pytestmark = pytest.mark.integration


def failure_text(result: Any) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "the run did not fail"
    return str(failures[0].event_specific_data.error.message)  # type: ignore[union-attr]


@pytest.fixture
def setup(services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[Path, str, dict[str, Any]]:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"bad_{uuid.uuid4().hex[:6]}"
    create_schema(services, db, accounts=50, orders=10, seed=1)
    data = config_dict(source=f"bad-{uuid.uuid4().hex[:6]}", ep=services,
                       tables=[f"{db}.accounts"], lake=tmp_path / "lake")
    data["zookeeper"]["root"] = f"dblog-bad-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "dblog.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, db, data


def run_partition(path: Path, db: str, table: str, instance: DagsterInstance) -> Any:
    defs = build_definitions(path)
    names = TableAssets(load_config(path).source.name, TableId(db, table))
    key = range_name(0, None)
    instance.add_dynamic_partitions(names.partitions_name, [key])
    return materialize([defs.get_assets_def(names.full_state)], instance=instance,
                       resources=defs.resources, partition_key=key, raise_on_error=False)


def test_backfill_while_the_tables_capture_is_paused(
        setup: tuple[Path, str, dict[str, Any]], tmp_path: Path) -> None:
    path, db, _ = setup
    table = TableId(db, "accounts")
    with open_runtime(load_config(path)) as rt:
        found = rt.state.create_capture("paused-one", (table,), {"keys": None, "where": None},
                                        {"r0": RangeProgress(table, None, None)})
        rt.state.set_capture_status("paused-one", "paused", found.version)
    with instance_for_test() as instance:
        result = run_partition(path, db, "accounts", instance)
    assert not result.success
    text = failure_text(result)
    assert "paused" in text and f"dblog resume {table}" in text, text
    assert not (tmp_path / "lake").exists() or not any((tmp_path / "lake").rglob("*.parquet"))


def test_a_table_that_does_not_exist(setup: tuple[Path, str, dict[str, Any]]) -> None:
    path, db, data = setup
    path.write_text(yaml.safe_dump({**data, "tables": [f"{db}.accounts", f"{db}.nope"]}))
    with instance_for_test() as instance:
        result = run_partition(path, db, "nope", instance)
    assert not result.success
    assert "nope" in failure_text(result)


def test_zookeeper_down(setup: tuple[Path, str, dict[str, Any]]) -> None:
    path, db, data = setup
    path.write_text(yaml.safe_dump({**data, "zookeeper": {"hosts": "127.0.0.1:1",
                                                          "root": "x"}}))
    with instance_for_test() as instance:
        result = run_partition(path, db, "accounts", instance)
    assert not result.success
    assert "ZooKeeper at 127.0.0.1:1 unreachable" in failure_text(result)


def test_a_second_tailer_launched_by_hand(setup: tuple[Path, str, dict[str, Any]],
                                          spark: Any) -> None:
    path, _, _ = setup
    defs = build_definitions(path)
    config = load_config(path)
    job = defs.get_job_def(tailer_job_name(config.source.name))
    with open_runtime(config, spark=spark) as rt, rt.state.tailer_lock("a-tailer-elsewhere"):
        with instance_for_test() as instance:
            result = job.execute_in_process(instance=instance, resources=defs.resources,
                                            raise_on_error=False)
    assert not result.success
    text = failure_text(result)
    assert "another tailer runs" in text and "a-tailer-elsewhere" in text, text


def test_the_keep_alive_sensor_replaces_a_dead_tailer_run(
        setup: tuple[Path, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A run Dagster believes started but that holds no lock (its process was killed) is
    failed and a new tailer run requested; a live one (holding the lock) is left alone."""
    from dagster import DagsterRunStatus, SensorResult, build_sensor_context

    import assets.tailer as tailer_module

    path, _, _ = setup
    defs = build_definitions(path)
    config = load_config(path)
    job = defs.get_job_def(tailer_job_name(config.source.name))
    (sensor,) = [s for s in defs.sensors or [] if s.name.endswith("_keep_alive")]
    with instance_for_test() as instance:
        run = instance.create_run_for_job(job, status=DagsterRunStatus.STARTED,
                                          tags=dict(job.tags))
        with build_sensor_context(instance=instance, resources=defs.resources) as context:
            alive = sensor(context)
        assert isinstance(alive, SensorResult) and not alive.run_requests  # just started
        with open_runtime(config) as rt, rt.state.tailer_lock(
                tailer_module.run_lock_identifier(run.run_id)):
            monkeypatch.setattr(tailer_module, "DEAD_AFTER_S", 0.0)
            with build_sensor_context(instance=instance, resources=defs.resources) as context:
                held = sensor(context)
            assert not held.run_requests  # it holds the lock: alive
        with build_sensor_context(instance=instance, resources=defs.resources) as context:
            dead = sensor(context)
        assert len(dead.run_requests) == 1
        failed = instance.get_run_by_id(run.run_id)
        assert failed is not None and failed.status == DagsterRunStatus.FAILURE


def test_a_table_without_a_primary_key(setup: tuple[Path, str, dict[str, Any]],
                                       services: Endpoints) -> None:
    from devtools.sample import connect

    path, db, data = setup
    conn = connect(services, db)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE keyless (a INT, b TEXT)")
    conn.close()
    path.write_text(yaml.safe_dump({**data, "tables": [f"{db}.keyless"]}))
    with instance_for_test() as instance:
        result = run_partition(path, db, "keyless", instance)
    assert not result.success
    text = failure_text(result)
    assert "keyless" in text and "primary key" in text, text
