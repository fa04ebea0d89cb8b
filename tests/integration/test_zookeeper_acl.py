"""ZooKeeper credentials (``zookeeper.auth_env``): every node dblog creates carries a
digest ACL for that identity alone, so a client without them (or with wrong ones) can
neither read nor change the pipeline's state, and the password is not stored in any node."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.errors import ConfigError
from devtools.services import Endpoints
from tests.integration.sources import MariaDbKit
from tests.integration.test_security import zookeeper_dump

pytestmark = pytest.mark.integration


def test_state_nodes_are_closed_to_clients_without_the_credentials(
        services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = MariaDbKit(services)
    monkeypatch.setenv(kit.password_env, kit.password)
    secret = f"zk-{uuid.uuid4().hex}"
    db = kit.simple_table("zkacl", 3)
    root = f"dblog-acl-{uuid.uuid4().hex[:6]}"
    with kit.cleaned(db, "zkacl") as source:
        path = kit.config(tmp_path / "c.yaml", source=source, db=db, lake=tmp_path / "lake",
                          tables=[f"{db}.t"])
        data = yaml.safe_load(path.read_text())
        data["zookeeper"].update(root=root, auth_env="DBLOG_TEST_ZK_AUTH")
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        with pytest.raises(ConfigError, match="DBLOG_TEST_ZK_AUTH"), open_runtime(config):
            pass
        monkeypatch.setenv("DBLOG_TEST_ZK_AUTH", f"dblog:{secret}")
        owner = KazooClient(hosts=services.zk_hosts,
                            auth_data=[("digest", f"dblog:{secret}")])
        owner.start(timeout=10)
        try:
            with open_runtime(config, spark=spark) as rt:
                rt.tailer().run(until_caught_up=True)
                state = f"{rt.state.root}"
                position = rt.state.get_position()
                assert position is not None
            for auth in ([], [("digest", f"dblog:not-{secret}")]):
                other = KazooClient(hosts=services.zk_hosts, auth_data=auth)
                other.start(timeout=10)
                try:
                    for node in (f"/{root}", state, *(f"{state}/{c}" for c in
                                                      owner.get_children(state))):
                        with pytest.raises(NoAuthError):
                            other.get(node)
                        with pytest.raises(NoAuthError):
                            other.set(node, b"tampered")
                finally:
                    other.stop()
                    other.close()
            assert secret not in zookeeper_dump(owner, f"/{root}")
        finally:
            if owner.exists(f"/{root}"):
                owner.delete(f"/{root}", recursive=True)
            owner.stop()
            owner.close()
