"""``make demo`` leaves a state the Dagster UI can show: the key ranges of its tables as
full_state partitions reported materialized, and the changelog and mirror reported."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets.demo_state import record_demo
from assets.naming import TableAssets
from dblog.app.config import load_config
from dblog.app.paths import PROJECT_ROOT
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.sample import config_dict, create_schema
from devtools.services import Endpoints

pytestmark = pytest.mark.integration


def test_the_demo_records_its_ranges_in_the_dagster_instance(
        services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"demo_{uuid.uuid4().hex[:6]}"
    create_schema(services, db, accounts=250, orders=40, seed=2)
    data = config_dict(source=f"demo-{uuid.uuid4().hex[:6]}", ep=services,
                       tables=[f"{db}.accounts", f"{db}.orders"], lake=tmp_path / "lake")
    data["capture"]["range_rows"] = 100
    path = tmp_path / "dblog.yaml"
    path.write_text(yaml.safe_dump(data))
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    config = load_config(path)
    with open_runtime(config) as rt:
        assert record_demo(rt, [], home) == 3 + 1  # 250 rows: 3 ranges; 40 rows: 1
    instance = DagsterInstance.from_config(str(home))
    try:
        accounts = TableAssets(config.source.name, TableId(db, "accounts"))
        keys = instance.get_dynamic_partitions(accounts.partitions_name)
        assert [k.split(":")[0] for k in keys] == ["000000", "000001", "000002"]
        done = instance.get_materialized_partitions(accounts.full_state)
        assert done == set(keys)
        for key in (accounts.changelog, accounts.mirror):
            assert instance.get_latest_materialization_event(AssetKey(key.path)) is not None
    finally:
        instance.dispose()
