"""The code location builds from the YAML config: every configured table gets its assets,
lineage, checks and range partitions; secrets stay EnvVars."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster import AssetCheckSeverity, AssetKey, Definitions, DynamicPartitionsDefinition

from assets.checks import lag_severity
from assets.definitions import build_definitions
from assets.naming import TableAssets, safe_name
from assets.tailer import batch_materializations
from dblog.core.errors import ConfigError
from dblog.core.events import Position, TableId
from dblog.tail import BatchReport

CONFIG = {
    "source": {"name": "shop-main", "kind": "mariadb", "host": "127.0.0.1", "port": 13306,
               "user": "dblog", "password_env": "DBLOG_TEST_SECRET"},
    "tables": ["shop.accounts", "shop.order-lines"],
    "lake": "lake",
}


def write(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "dblog.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, **changes}))
    return path


def test_every_configured_table_gets_its_assets_and_lineage(tmp_path: Path) -> None:
    defs = build_definitions(write(tmp_path))
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    for table in (TableId("shop", "accounts"), TableId("shop", "order-lines")):
        names = TableAssets("shop-main", table)
        assert graph.get(names.full_state).parent_keys == {names.source}
        assert graph.get(names.changelog).parent_keys == {names.full_state}
        assert graph.get(names.mirror).parent_keys == {names.changelog}
        assert graph.get(names.full_state).is_materializable
        assert not graph.get(names.changelog).is_materializable  # only the tailer writes
        assert not graph.get(names.mirror).is_materializable
        partitions = graph.get(names.full_state).partitions_def
        assert isinstance(partitions, DynamicPartitionsDefinition)
        assert partitions.name == names.partitions_name
        checks = {k.name for k in graph.asset_check_keys if k.asset_key in (
            names.changelog, names.mirror)}
        assert checks == {"mirror_matches_source", "positions_never_go_back", "tail_lag"}
    assert TableAssets("shop-main", TableId("shop", "order-lines")).full_state == AssetKey(
        ["shop_main_" + safe_name("shop-main").rsplit("_", 1)[1], "shop",
         safe_name("order-lines"), "full_state"])
    assert {s.name for s in defs.sensors or []} == {
        "dblog_tailer_shop_main_" + safe_name("shop-main").rsplit("_", 1)[1] + "_keep_alive",
        "dblog_range_planner_" + safe_name("shop-main")}


def test_adding_a_table_to_the_config_adds_its_assets(tmp_path: Path) -> None:
    before = build_definitions(write(tmp_path)).resolve_asset_graph().get_all_asset_keys()
    after = build_definitions(write(tmp_path, tables=[*CONFIG["tables"], "shop.refunds"])
                              ).resolve_asset_graph().get_all_asset_keys()
    names = TableAssets("shop-main", TableId("shop", "refunds"))
    assert after - before == {names.source, names.full_state, names.changelog, names.mirror}


def test_the_password_stays_an_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOG_TEST_SECRET", "s3cret-value")
    defs = build_definitions(write(tmp_path))
    resource = defs.resources["dblog"]
    assert "s3cret-value" not in repr(resource)
    assert "DBLOG_TEST_SECRET" in repr(resource.source.password)  # type: ignore[attr-defined]


def test_a_malformed_config_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tables"):
        build_definitions(write(tmp_path, tables=[]))


def test_safe_names_never_collide_and_are_valid() -> None:
    assert safe_name("accounts") == "accounts"
    odd = [safe_name(n) for n in ("order-lines", "order_lines-", "order lines", "1st", "ü")]
    assert len(set(odd)) == len(odd)
    assert all(n.replace("_", "a").isalnum() and not n[0].isdigit() for n in odd)


def test_batch_materializations_report_each_touched_table() -> None:
    report = BatchReport(7, Position(1234, 0), events=30, commit_ts_ms=1_000_000,
                         table_events={TableId("shop", "b"): 20, TableId("shop", "a"): 10})
    events = batch_materializations("main", report, now_s=1003.5)
    assert [e.asset_key.path[-2:] for e in events] == [["a", "changelog"], ["b", "changelog"]]
    assert events[0].metadata["events"].value == 10
    assert events[0].metadata["lag_seconds"].value == 3.5
    assert events[0].metadata["batch"].value == 7


def test_a_mirror_merge_materializes_the_mirrors_it_merged() -> None:
    report = BatchReport(9, Position(1234, 0), events=0, seconds=1.25, mirror_only=True,
                         mirrors={TableId("shop", "b"): 40, TableId("shop", "a"): 5})
    events = batch_materializations("main", report, now_s=1003.5)
    assert [e.asset_key.path[-2:] for e in events] == [["a", "mirror"], ["b", "mirror"]]
    assert events[0].metadata["changelog_rows_merged"].value == 5
    assert events[1].metadata["merged_through_batch"].value == 9


def test_lag_severity() -> None:
    assert lag_severity(1.0, 60, 600) == (True, AssetCheckSeverity.WARN)
    assert lag_severity(61.0, 60, 600) == (False, AssetCheckSeverity.WARN)
    assert lag_severity(601.0, 60, 600) == (False, AssetCheckSeverity.ERROR)
    assert lag_severity(None, 60, 600) == (False, AssetCheckSeverity.WARN)
