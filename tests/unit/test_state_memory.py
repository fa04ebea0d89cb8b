"""The state store's contract (``tests/state_contract.py``) on the in-memory backend, and
what only that backend can be made to do: no services, a few seconds."""

from __future__ import annotations

import pytest

from dblog.core.errors import LeadershipLost
from dblog.core.events import Position
from dblog.state import PositionState, StateStore, StateUnavailable
from dblog.state.memory import MemoryBackend, MemoryServer
from tests.state_contract import *  # noqa: F403 - the contract's cases run here too
from tests.state_contract import MemoryCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster()


def test_an_outage_makes_every_call_unavailable_and_the_session_survives_it() -> None:
    server = MemoryServer()
    store = StateStore(server.session(), "src")
    store.put("misc/doc", {"a": 1}, None)
    with store.tailer_lock("tailer"):
        with server.outage():
            with pytest.raises(StateUnavailable, match="during get misc/doc: ConnectionLoss"):
                store.get("misc/doc")
            with pytest.raises(StateUnavailable, match="during commit batch"):
                store.commit_batch(_position(), None, clear_intent=False)
        store.check_leader()
    assert store.get("misc/doc") is not None


def test_a_suspended_connection_stops_writes_but_keeps_the_lock() -> None:
    store = StateStore(MemoryServer().session(), "src")
    with store.tailer_lock("tailer"):
        assert isinstance(store.backend, MemoryBackend)
        store.backend.suspend()
        assert store.session_interrupted()
        with pytest.raises(LeadershipLost, match="suspended or lost"):
            store.check_leader()
        assert store.lock_holder() == "tailer"  # the session, and its lock node, survived
    assert store.lock_holder() is None


def test_a_closed_session_is_unavailable() -> None:
    store = StateStore(MemoryServer().session(), "src")
    store.close()
    assert store.session_interrupted()  # kazoo reports a stopped client as LOST
    with pytest.raises(StateUnavailable, match="ConnectionClosedError"):
        store.get_position()


def _position() -> PositionState:
    return PositionState(Position(10), {"lsn": 10}, 1)
