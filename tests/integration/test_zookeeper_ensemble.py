"""A 3-node ZooKeeper ensemble on loopback (``python -m devtools.services up --zk-nodes 3``):
the node a running ``dblog tail`` is connected to is killed while writers run; the tailer goes on
through the other two (the same session, so the same lock), and the mirror and an
independent replay equal the source."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from dblog.state import TAILER_LOCK, StateUnavailable
from devtools import services as local
from devtools.services import Endpoints
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table
from tests.integration.sources import MariaDbKit
from tests.integration.test_failover import Tail, Writer, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def ensemble(services: Endpoints) -> Iterator[list[local.ZooKeeperNode]]:
    """The ensemble, running; stopped afterwards unless it ran before (then a node the test
    killed starts again): three idle JVMs would stay up for the rest of the suite."""
    ran_before = any(node.running() for node in local.ensemble())
    local.ensemble_up()
    yield local.ensemble()
    if ran_before:
        local.ensemble_up()
    else:
        for node in local.ensemble():
            node.down()


def test_losing_the_ensemble_node_of_a_running_tailer_does_not_stop_it(
        services: Endpoints, ensemble: list[local.ZooKeeperNode], spark: Any,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kit = MariaDbKit(services)
    monkeypatch.setenv(kit.password_env, kit.password)
    db = kit.simple_table("ensemble", 0)
    with kit.cleaned(db, "ensemble") as source:
        path = kit.config(tmp_path / "c.yaml", source=source, db=db, lake=tmp_path / "lake",
                          tables=[f"{db}.t"], batch_seconds=0.3)
        data = yaml.safe_load(path.read_text())
        data["zookeeper"] = {"hosts": local.ensemble_hosts(), "root": f"dblog-ens-{source}",
                             "session_timeout_s": 10}
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        table = TableId(db, "t")
        writer = Writer(kit, db)
        tail: Tail | None = None
        try:
            with open_runtime(config, spark=spark, validate=False) as rt:
                def batch() -> int:
                    try:
                        pos = rt.state.get_position()
                    except StateUnavailable:  # this client's own node may be the lost one
                        return -1
                    return -1 if pos is None else pos.value.batch

                tail = Tail(path, kit.password, tmp_path / "tail.log")
                wait_for("the tail writing", lambda: batch() >= 0, 120, tail)
                writer.start()
                at = batch()
                wait_for("the tail writing", lambda: batch() >= at + 3, 60, tail)

                lock = rt.state._zk.get_children(f"{rt.state.root}/{TAILER_LOCK}")  # noqa: SLF001
                owner = rt.state._zk.exists(  # noqa: SLF001
                    f"{rt.state.root}/{TAILER_LOCK}/{lock[0]}").ephemeralOwner
                (node,) = [n for n in ensemble
                           if re.search(rf"sid=0x0*{owner:x}\b", n.four_letters("cons"))]
                pid = int(node.pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                print(f"\nkilled {node.name}, the tailer's node (session 0x{owner:x})")
                at = max(batch(), at)
                wait_for("the tail writing on two nodes", lambda: batch() >= at + 5, 120, tail)
                writer.halt.set()
                writer.join(10)
                deadline = time.monotonic() + 120
                while True:
                    try:
                        rt.wait_caught_up(lambda: None, timeout=120)
                        break
                    except StateUnavailable:
                        assert time.monotonic() < deadline
                        time.sleep(0.5)
                assert tail.proc.poll() is None, tail.output()[-3000:]
                print("\n".join(line for line in tail.output().splitlines()
                                if line.startswith("tail:")))
                report = verify_table(rt.dialect, rt.sink, table)
                assert report.ok, report.summary()
                frame = check_table(spark, services, db, "t", ("id",),
                                    rt.layout.changelog(table),
                                    expected_rows=kit.rows(db, "t", ("id",)))
                assert len(frame) == writer.written
                rt.state.delete("", recursive=True)
        finally:
            writer.halt.set()
            if tail is not None:
                tail.stop()
