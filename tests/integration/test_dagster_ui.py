"""The Dagster layer as a person uses it: the real ``dagster dev`` (webserver and daemon),
the keep-alive sensor starting the tailer run, the planner sensor adding key ranges, a
partition backfill launched over GraphQL exactly as the UI does, and headless Chromium
showing the partitions page and the lineage graph (screenshots kept as test artifacts)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from assets.naming import TableAssets
from dblog.app.config import load_config
from dblog.app.paths import PROJECT_ROOT
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.sample import config_dict, create_schema
from devtools.services import Endpoints
from tests.integration.oracle import verify_table

pytestmark = pytest.mark.integration

ARTIFACTS = PROJECT_ROOT / ".dblog" / "test-artifacts"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1500,950"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Webserver:
    """A ``dagster dev`` in its own process group, stopped by group with a deadline."""

    def __init__(self, home: Path, config: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "DAGSTER_HOME": str(home), "DBLOG_CONFIG": str(config)}
        self.log = log
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-w",
             str(PROJECT_ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=PROJECT_ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            data = json.loads(response.read())
        assert "errors" not in data, data["errors"]
        return data["data"]

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                located = self.graphql("{ workspaceOrError { ... on Workspace { "
                                       "locationEntries { locationOrLoadError { "
                                       "__typename ... on PythonError { message } } } } } }")
                entries = located["workspaceOrError"]["locationEntries"]
                if entries and entries[0]["locationOrLoadError"]:
                    loaded = entries[0]["locationOrLoadError"]
                    assert loaded["__typename"] == "RepositoryLocation", loaded
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, "dagster dev did not come up"
            time.sleep(1)

    def stop(self, deadline_s: float = 30) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(deadline_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        try:  # run workers may outlive the webserver's group when it is killed
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def chromium(url: str, screenshot: Path, budget_ms: int = 20000, *,
             showing: Sequence[str] = (), loads: int = 3) -> str:
    """The page's DOM after its scripts ran, and a screenshot of it. A page that does not
    show every text of ``showing`` yet (on a busy machine the webserver can take longer than
    the time budget to load the code location: "Loading dblog...") is
    loaded again, as a person would, up to ``loads`` times; the last load is returned."""
    browser = shutil.which("chromium")
    assert browser, "chromium is not installed (make setup installs it)"
    dom = ""
    for _ in range(loads):
        profile = screenshot.parent / f"profile-{uuid.uuid4().hex[:6]}"
        common = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                  f"--virtual-time-budget={budget_ms}"]
        # One page load gives both (Chromium writes the screenshot and prints the DOM).
        dom = subprocess.run([*common, f"--screenshot={screenshot}", "--dump-dom", url],
                             check=True, timeout=120, capture_output=True, text=True).stdout
        shutil.rmtree(profile, ignore_errors=True)
        if all(text in dom for text in showing):
            break
    return dom


@pytest.fixture
def dagster_dev(services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                ) -> Iterator[tuple[Webserver, Path, str]]:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"ui_{uuid.uuid4().hex[:6]}"
    create_schema(services, db, accounts=400, orders=200, seed=3)
    data = config_dict(source=f"ui-{uuid.uuid4().hex[:6]}", ep=services,
                       tables=[f"{db}.accounts", f"{db}.orders"], lake=tmp_path / "lake",
                       chunk_size=400, batch_seconds=1.0)
    data["capture"]["range_rows"] = 200
    data["zookeeper"]["root"] = f"dblog-ui-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "dblog.yaml"
    config.write_text(yaml.safe_dump(data))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = Webserver(home, config, ARTIFACTS / "dagster-dev.log")
    try:
        server.wait_ready()
        yield server, config, db
    finally:
        server.stop()


def asset_path(key: Any) -> str:
    return "/".join(key.path)


def test_backfill_from_the_ui_and_what_a_person_sees(
        dagster_dev: tuple[Webserver, Path, str], spark: Any, services: Endpoints) -> None:
    server, config_path, db = dagster_dev
    config = load_config(config_path)
    accounts = TableAssets(config.source.name, TableId(db, "accounts"))

    # The planner sensor (on by default) adds accounts' key ranges: 400 rows, 200 a range.
    query = """query ($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) {
        ... on AssetNode { partitionKeys } } }"""
    deadline = time.monotonic() + 180
    while True:
        node = server.graphql(query, {"key": {"path": accounts.full_state.path}})
        keys = node["assetNodeOrError"].get("partitionKeys") or []
        if len(keys) >= 2:
            break
        assert time.monotonic() < deadline, f"no ranges planned: {keys}"
        time.sleep(0.5)
    assert keys[0].startswith("000000:")

    # The keep-alive sensor (on by default) starts the tailer run.
    with open_runtime(config, spark=spark) as rt:
        deadline = time.monotonic() + 240
        while rt.state.get_position() is None:
            assert time.monotonic() < deadline, "the tailer run did not start"
            time.sleep(0.5)
        holder = rt.state.lock_holder()
        assert holder is not None and holder.startswith("dagster-run-")

        launched = server.graphql("""mutation ($params: LaunchBackfillParams!) {
            launchPartitionBackfill(backfillParams: $params) {
              __typename ... on LaunchBackfillSuccess { backfillId }
              ... on PythonError { message } } }""", {"params": {
            "assetSelection": [{"path": accounts.full_state.path}],
            "partitionNames": keys}})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]
        deadline = time.monotonic() + 600
        while True:
            status = server.graphql("""query ($id: String!) { partitionBackfillOrError(
                backfillId: $id) { ... on PartitionBackfill { status } } }""",
                                    {"id": backfill_id})["partitionBackfillOrError"]["status"]
            if status not in ("REQUESTED", "IN_PROGRESS"):
                break
            assert time.monotonic() < deadline, "the backfill did not finish"
            time.sleep(0.5)
        assert status == "COMPLETED_SUCCESS", (status, server.log.read_text()[-3000:])
        rt.wait_caught_up(lambda: None, timeout=300)
        report = verify_table(rt.dialect, rt.sink, TableId(db, "accounts"))
        assert report.ok, report.summary()

        # Terminate the tailer run as the UI's Terminate button does: the run ends and lets
        # the lock go (its op stops the tailer at a batch boundary).
        run_id = holder.removeprefix("dagster-run-")
        terminated = server.graphql("""mutation ($id: String!) { terminateRun(runId: $id) {
            __typename } }""", {"id": run_id})["terminateRun"]
        assert terminated["__typename"] == "TerminateRunSuccess", terminated
        deadline = time.monotonic() + 180
        while True:
            run_status = server.graphql("""query ($id: ID!) { runOrError(runId: $id) {
                ... on Run { status } } }""", {"id": run_id})["runOrError"]["status"]
            if run_status in ("CANCELED", "FAILURE", "SUCCESS"):
                break
            assert time.monotonic() < deadline, f"the tailer run is still {run_status}"
            time.sleep(0.5)
        assert run_status == "CANCELED", run_status
        assert rt.state.lock_holder() != holder

    # What a person sees: the partitions page and the global lineage graph.
    shot = ARTIFACTS / "full_state-partitions.png"
    dom = chromium(f"{server.url}/assets/{asset_path(accounts.full_state)}?view=partitions",
                   shot, showing=(f"{len(keys)} Partitions", f"Materialized ({len(keys)})"))
    assert shot.stat().st_size > 10_000
    assert "full_state" in dom
    assert f"{len(keys)} Partitions" in dom, dom[-2000:]
    assert f"Materialized ({len(keys)})" in dom, dom[-2000:]
    assert "Failed (0)" in dom
    lineage = ARTIFACTS / "lineage.png"
    orders = TableAssets(config.source.name, TableId(db, "orders"))
    dom = chromium(f"{server.url}/asset-groups", lineage,
                   showing=(accounts.group, orders.group))
    assert lineage.stat().st_size > 10_000
    for group in (accounts.group, orders.group):  # one group per table, with its health
        assert group in dom, group
    table_lineage = ARTIFACTS / "table-lineage.png"
    dom = chromium(f"{server.url}/locations/dblog/asset-groups/"
                   f"{accounts.group}/lineage", table_lineage,
                   showing=("source", "full_state", "changelog", "mirror", "100% filled"))
    for name in ("source", "full_state", "changelog", "mirror"):
        assert name in dom, name
    assert "100% filled" in dom  # partition health on the lineage node
