"""The state store's contract (``tests/state_contract.py``) on both backends: the real
local ZooKeeper (``dblog services up``) and the in-memory one, case for case."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from dblog.state import StateStore
from tests.state_contract import *  # noqa: F403 - the contract's cases, once per backend
from tests.state_contract import Cluster, MemoryCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ZK_HOSTS = f"127.0.0.1:{os.environ.get('DBLOG_ZK_PORT', '12181')}"


class ZooKeeperCluster:
    """Stores on their own sessions under a fresh ZooKeeper root (removed afterwards)."""

    def __init__(self) -> None:
        self.chroot = f"dblog-test-{uuid.uuid4().hex[:12]}"
        self.source = f"src-{uuid.uuid4().hex[:8]}"
        self._stores: list[StateStore] = []

    def store(self) -> StateStore:
        store = StateStore.connect(ZK_HOSTS, self.source, chroot=self.chroot, timeout=5)
        self._stores.append(store)
        return store

    def expire(self, store: StateStore) -> None:
        """Close the store's session from another client, as ZooKeeper expires one after
        a long pause or a partition."""
        session_id, session_password = store._zk.client_id
        thief = KazooClient(hosts=ZK_HOSTS, client_id=(session_id, session_password))
        thief.start(timeout=10)
        thief.stop()
        thief.close()
        deadline = time.monotonic() + 60
        while not store.session_interrupted() or store._zk.state != "CONNECTED":
            assert time.monotonic() < deadline, "the session loss was never noticed"
            time.sleep(0.05)

    def close(self) -> None:
        for store in self._stores:
            store.close()
        raw = KazooClient(hosts=ZK_HOSTS, timeout=5)
        raw.start(timeout=5)
        try:
            raw.delete(f"/{self.chroot}", recursive=True)
        finally:
            raw.stop()
            raw.close()


@pytest.fixture(params=["zookeeper", "memory"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if request.param == "memory":
        yield MemoryCluster()
        return
    zookeeper = ZooKeeperCluster()
    try:
        yield zookeeper
    finally:
        zookeeper.close()
