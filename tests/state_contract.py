"""The state store's contract: cases every storage backend must pass the same way.

``tests/integration/test_state_contract.py`` runs them against the real ZooKeeper and the
in-memory backend, ``tests/unit/test_state_memory.py`` against the memory backend alone
(no services, a few seconds). Each importing module provides a ``cluster`` fixture, a
:class:`Cluster`: stores of one source, each on its own session, and a way to end a
session from outside as a long pause or a partition would.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import pytest

from dblog.core.errors import DblogError, LeadershipLost, LockHeld, StateConflict
from dblog.core.events import Position, TableId, Window
from dblog.state import (
    ABSENT,
    BatchIntent,
    ChangeSignal,
    Lookout,
    PositionState,
    RangeProgress,
    RangeUpdate,
    StateSchemaError,
    StateStore,
    WindowUpdate,
)
from dblog.state.backend import Create, Inconsistent, NodeExists, RolledBack
from dblog.state.memory import MemoryBackend, MemoryServer

ORDERS = TableId("shop", "orders")


class Cluster(Protocol):
    """Stores of one source on one backend (a ZooKeeper root, or a memory server)."""

    def store(self) -> StateStore:
        """A new store of the source, on its own session (closed at the test's end)."""

    def expire(self, store: StateStore) -> None:
        """End ``store``'s session from outside; return once the store has noticed and
        its client carries on with a new session."""


class MemoryCluster:
    """Stores on sessions of one :class:`~dblog.state.memory.MemoryServer`."""

    def __init__(self) -> None:
        self.server = MemoryServer()

    def store(self) -> StateStore:
        return StateStore(self.server.session(), "src", chroot="dblog-test")

    def expire(self, store: StateStore) -> None:
        assert isinstance(store.backend, MemoryBackend)
        store.backend.expire()


# ---- documents and compare-and-set -----------------------------------------------------


def test_put_get_versions_and_cas_conflicts(cluster: Cluster) -> None:
    store = cluster.store()
    assert store.get("misc/doc") is None
    value = {"name": "Zürich ☃ 東京", "nested": {"k": [1, "two", None, 3.5, True]}}
    assert store.put("misc/doc", value, None) == 0  # creates, with parents
    got = store.get("misc/doc")
    assert got is not None and got.value == value and got.version == 0
    assert store.put("misc/doc", {"a": 1}, None) == 1  # overwrites
    assert store.put("misc/doc", {"a": 2}, 1) == 2  # compare-and-set
    with pytest.raises(StateConflict, match="changed concurrently.*expected version 1"):
        store.put("misc/doc", {"a": 3}, 1)
    with pytest.raises(StateConflict, match="already exists"):
        store.put("misc/doc", {"a": 3}, ABSENT)
    with pytest.raises(StateConflict, match="does not exist"):
        store.put("misc/missing", {"a": 3}, 0)
    with pytest.raises(StateConflict, match="changed concurrently"):
        store.delete("misc/doc", expected_version=0)
    assert store.delete("misc/doc", expected_version=2) is True
    with pytest.raises(StateConflict, match="already deleted"):
        store.delete("misc/doc", expected_version=2)
    assert store.delete("misc/doc") is False
    assert store.get("misc/doc") is None


def test_documents_are_stored_as_sorted_utf8_json_with_schema(cluster: Cluster) -> None:
    store = cluster.store()
    store.put("misc/doc", {"b": "ä", "a": 1}, None)
    data, version = store.backend.get(f"{store.root}/misc/doc")
    assert data == '{"a": 1, "b": "ä", "schema": 1}'.encode() and version == 0


def test_corrupt_or_newer_documents_raise(cluster: Cluster) -> None:
    store = cluster.store()
    raw = store.backend
    raw.create(f"{store.root}/position", b'{"schema": 2, "batch": 1}', makepath=True)
    with pytest.raises(StateSchemaError, match="schema 2.*upgrade"):
        store.get_position()
    raw.create(f"{store.root}/misc/garbage", b"\xff not json", makepath=True)
    with pytest.raises(StateSchemaError, match="not a UTF-8 JSON"):
        store.get("misc/garbage")
    raw.create(f"{store.root}/windows/bad", b'{"schema": 1, "window_id": "bad"}', makepath=True)
    with pytest.raises(StateSchemaError, match="corrupt state document"):
        store.get_window("bad")


def test_children_are_sorted_and_absent_parents_have_none(cluster: Cluster) -> None:
    store = cluster.store()
    for name in ("b", "a", "c-1", "Ω"):
        store.put(f"misc/{name}", {}, ABSENT)
    assert store.children("misc") == ["a", "b", "c-1", "Ω"]
    assert store.children("nowhere") == []
    assert "misc" in store.children()
    store.create_capture("cap", [ORDERS], {}, {"r2": RangeProgress(ORDERS, (5,)),
                                                "r1": RangeProgress(ORDERS, None, (5,))})
    assert list(store.list_ranges("cap")) == ["r1", "r2"]
    with pytest.raises(DblogError, match="has children"):
        store.delete("misc")
    assert store.remove_capture("cap") is True
    assert store.list_ranges("cap") == {} and store.children("captures") == []


def test_a_cas_race_between_two_sessions_has_exactly_one_winner(cluster: Cluster) -> None:
    stores = {"a": cluster.store(), "b": cluster.store()}
    stores["a"].put("race/doc", {"by": None}, ABSENT)
    for _ in range(10):
        current = stores["a"].get("race/doc")
        assert current is not None
        outcomes = _race(stores, "race/doc", current.version)
        winners = [n for n, o in outcomes.items() if isinstance(o, int)]
        assert len(winners) == 1 and len(outcomes) == 2, outcomes
        final = stores["b"].get("race/doc")
        assert final is not None and final.value["by"] == winners[0]
        assert final.version == current.version + 1


# ---- transactions -------------------------------------------------------------------


def test_a_transaction_that_fails_anywhere_changes_nothing(cluster: Cluster) -> None:
    store = cluster.store()
    store.put("tx/taken", {}, ABSENT)
    ops = [Create(f"{store.root}/tx/{name}") for name in ("first", "taken", "last")]
    results = store.backend.transaction(ops)
    assert [type(r) for r in results] == [RolledBack, NodeExists, Inconsistent]
    assert store.children("tx") == ["taken"]
    assert store.backend.transaction(ops[:1]) == [0]
    assert store.children("tx") == ["first", "taken"]


def test_commit_batch_applies_everything_at_once(cluster: Cluster) -> None:
    store = cluster.store()
    w1, w2 = _prepare_batch(store)
    first = store.commit_batch(_position(1), None)
    assert first.position_version == 0
    store.put_batch_intent(2, {"lsn": 1}, {"lsn": 2})
    r1 = RangeProgress(ORDERS, None, (100,), (50,), 1, 50, 3)
    r2 = RangeProgress(ORDERS, (100,), None, (150,), 1, 50, 0)
    result = store.commit_batch(
        _position(2, offset=999), first.position_version,
        ranges=[RangeUpdate("cap", "r1", r1, 0), RangeUpdate("cap", "r2", r2, ABSENT)],
        windows=[WindowUpdate(w1.window_id, "emitted", "50 rows"),
                 WindowUpdate(w2.window_id, "aborted")],
    )
    assert result.position_version == 1
    assert dict(result.range_versions) == {("cap", "r1"): 1, ("cap", "r2"): 0}
    assert dict(result.window_versions) == {w1.window_id: 1, w2.window_id: 1}
    pos = store.get_position()
    assert pos is not None and pos.value.batch == 2 and pos.version == 1
    ranges = store.list_ranges("cap")
    assert ranges["r1"].value == r1 and ranges["r2"].value == r2
    statuses = {v.value.window.window_id: v.value.status for v in store.list_windows()}
    assert statuses == {w1.window_id: "emitted", w2.window_id: "aborted"}
    assert store.get_batch_intent() is None


def test_a_commit_batch_failing_at_any_operation_changes_nothing(cluster: Cluster) -> None:
    store, other = cluster.store(), cluster.store()
    w1, _ = _prepare_batch(store)
    first = store.commit_batch(_position(1), None)
    store.put_range("cap", "r1", RangeProgress(ORDERS, None, (100,), (1,), 1, 1, 0), 0)
    store.put_batch_intent(2, {"lsn": 1}, {"lsn": 2})
    before = _snapshot(store)
    with pytest.raises(StateConflict, match="at 'set captures/cap/ranges/r1'.*nothing"):
        store.commit_batch(  # the new range and the window come before and after the failure
            _position(2), first.position_version,
            ranges=[RangeUpdate("cap", "new", RangeProgress(ORDERS, (100,)), ABSENT),
                    RangeUpdate("cap", "r1", RangeProgress(ORDERS, None, (100,), (2,)), 0)],
            windows=[WindowUpdate(w1.window_id, "emitted")],
        )
    assert _snapshot(store) == before and "new" not in store.list_ranges("cap")
    moved = other.get_position()
    assert moved is not None
    other.commit_batch(_position(2), moved.version, clear_intent=False)  # another tailer
    before = _snapshot(store)
    with pytest.raises(StateConflict, match="at 'check position'"):
        store.commit_batch(_position(2), first.position_version,
                           windows=[WindowUpdate(w1.window_id, "emitted")])
    assert _snapshot(store) == before
    with pytest.raises(StateConflict, match="already exists"):
        store.commit_batch(_position(3), None, clear_intent=False)  # the position exists


def test_commit_batch_refuses_an_intent_for_another_batch(cluster: Cluster) -> None:
    store = cluster.store()
    store.put_batch_intent(7, {}, {})
    with pytest.raises(StateConflict, match="batch 7"):
        store.commit_batch(_position(8), None)
    assert store.get_position() is None and store.get_batch_intent() is not None


def test_the_batch_intent_is_compare_and_set(cluster: Cluster) -> None:
    store = cluster.store()
    store.commit_batch(_position(1), None, clear_intent=False)
    position = store.get_position()
    assert position is not None
    store.create_batch_intent(BatchIntent(2, {"lsn": 10}, {"lsn": 20}), position.version)
    with pytest.raises(StateConflict, match="create batch-intent"):  # a second writer
        store.create_batch_intent(BatchIntent(2, {"lsn": 10}, {"lsn": 30}), position.version)
    intent = store.get_batch_intent()
    assert intent is not None
    store.add_batch_attempt(intent, "a" * 32)
    with pytest.raises(StateConflict, match="set batch-intent"):  # a stale read
        store.add_batch_attempt(intent, "b" * 32)
    store.commit_batch(_position(2), position.version)
    with pytest.raises(StateConflict, match="check position"):  # the position moved on
        store.create_batch_intent(BatchIntent(3, {"lsn": 20}, {"lsn": 40}), position.version)
    assert store.get_batch_intent() is None


# ---- watches ------------------------------------------------------------------------


def test_a_watch_fires_once_at_creation_change_and_deletion_by_another_session(
    cluster: Cluster,
) -> None:
    store, other = cluster.store(), cluster.store()
    signal = ChangeSignal()
    store.watch(["chunks/w/files"], signal)
    assert not signal.wait(0.2)
    other.put("chunks/w/files", {"n": 1}, None)
    assert signal.wait(5) and signal.take()
    other.put("chunks/w/files", {"n": 2}, None)  # fired already: no longer armed
    assert not signal.wait(0.2)
    store.watch(["chunks/w/files"], signal)
    other.put("chunks/w/files", {"n": 3}, None)
    assert signal.wait(5) and signal.take()
    store.watch(["chunks/w/files", "chunks/w/holder"], signal)
    other.delete("chunks/w/files")
    assert signal.wait(5) and signal.take()


def test_a_failed_transaction_fires_no_watch(cluster: Cluster) -> None:
    store, other = cluster.store(), cluster.store()
    store.put("tx/taken", {}, ABSENT)
    signal = ChangeSignal()
    store.watch(["tx/first"], signal)
    other.backend.transaction([Create(f"{other.root}/tx/first"), Create(f"{other.root}/tx/taken")])
    assert not signal.wait(0.3)


def test_a_lookout_reads_again_when_its_watch_fired(cluster: Cluster) -> None:
    store, other = cluster.store(), cluster.store()
    lookout = Lookout(lambda signal: store.watch(["windows/w"], signal), every=30)
    assert lookout.due() and not lookout.due()
    other.put("windows/w", {"status": "emitted"}, None)
    began = time.monotonic()
    lookout.wait(20)
    assert time.monotonic() - began < 15, "the watch did not fire"
    assert lookout.due() and not lookout.due()


# ---- the tailer lock ----------------------------------------------------------------


def test_the_tailer_lock_has_one_holder(cluster: Cluster) -> None:
    store, other = cluster.store(), cluster.store()
    assert store.lock_holder() is None
    with store.tailer_lock("tailer-a@host1"):
        store.check_leader()
        assert other.lock_holder() == "tailer-a@host1"
        with pytest.raises(LockHeld, match="tailer-a@host1"):
            with other.tailer_lock("tailer-b@host2", timeout=0.5):
                pytest.fail("a second session must not get the lock")
        with pytest.raises(LeadershipLost, match="not held"):
            other.check_leader()
        assert store.lock_holder() == "tailer-a@host1"  # the loser left no contender
        assert len(store.children("tailer-lock")) == 1
    with pytest.raises(LeadershipLost, match="not held"):
        store.check_leader()
    with other.tailer_lock("tailer-b@host2", timeout=2):
        assert store.lock_holder() == "tailer-b@host2"
    assert store.lock_holder() is None


def test_a_standby_takes_over_when_the_holder_releases(cluster: Cluster) -> None:
    store, other = cluster.store(), cluster.store()
    told: list[str | None] = []
    took_over = threading.Event()

    def standby() -> None:
        with other.tailer_lock("tailer-b@host2", timeout=None, on_standby=told.append):
            took_over.set()

    with store.tailer_lock("tailer-a@host1"):
        waiter = threading.Thread(target=standby)
        waiter.start()
        _wait_for(lambda: bool(told), "the standby never said it stands by")
        assert told == ["tailer-a@host1"] and not took_over.is_set()
    waiter.join(15)
    assert took_over.is_set() and told == ["tailer-a@host1"]


def test_a_closed_session_frees_its_lock_and_releasing_after_is_harmless(
    cluster: Cluster,
) -> None:
    first, second = cluster.store(), cluster.store()
    lock = first.tailer_lock("crashy")
    lock.__enter__()
    assert second.lock_holder() == "crashy"
    first.close()  # the session ends without releasing: its lock node goes with it
    with second.tailer_lock("survivor", timeout=5):
        assert second.lock_holder() == "survivor"
        lock.__exit__(None, None, None)
        assert second.lock_holder() == "survivor"


def test_a_lost_session_loses_the_lock_and_every_fenced_write(cluster: Cluster) -> None:
    """A tailer whose session expired (a long pause, a partition) while it held the lock:
    a standby takes over, and the stale tailer's leadership check, batch intent and batch
    attempt are refused even once its client is on a new session, and its batch commit
    is refused by the position compare-and-set once the new holder has committed."""
    stale, standby = cluster.store(), cluster.store()
    stale.put_position(_position(1), ABSENT)
    took_over = threading.Event()
    release = threading.Event()

    def stand_by() -> None:
        with standby.tailer_lock("standby", timeout=None):
            took_over.set()
            release.wait(30)
            read = standby.get_position()
            assert read is not None
            standby.commit_batch(_position(2), read.version, clear_intent=False)

    with stale.tailer_lock("stale"):
        stale.put_batch_intent(2, {"pos": 4}, {"pos": 9})
        intent, read = stale.get_batch_intent(), stale.get_position()
        assert intent is not None and read is not None
        waiter = threading.Thread(target=stand_by)
        waiter.start()
        cluster.expire(stale)
        assert stale.session_interrupted()
        _wait_for(took_over.is_set, "the standby never took over")
        assert stale.lock_holder() == "standby"
        with pytest.raises(LeadershipLost, match="suspended or lost"):
            stale.check_leader()
        with pytest.raises(LeadershipLost):
            stale.add_batch_attempt(intent, "a" * 32)
        stale._session_lost.clear()  # as if the flag had not been seen yet
        with pytest.raises(LeadershipLost, match="was lost"):
            stale.check_leader()
        with pytest.raises(LeadershipLost, match="was lost"):
            stale.add_batch_attempt(intent, "a" * 32)
        stale.clear_batch_intent()
        with pytest.raises(LeadershipLost, match="was lost"):
            stale.create_batch_intent(BatchIntent(2, {"pos": 4}, {"pos": 9}), read.version)
        assert stale.get_batch_intent() is None
        release.set()
        waiter.join(30)
        with pytest.raises(StateConflict, match="check position"):
            stale.commit_batch(_position(2), read.version, clear_intent=False)
    moved = stale.get_position()
    assert moved is not None and moved.version == read.version + 1


def test_a_held_node_goes_with_its_session(cluster: Cluster) -> None:
    store, other = cluster.store(), cluster.store()
    store.put("chunks/w/files", {}, ABSENT)
    store.hold("chunks/w/holder")
    with pytest.raises(StateConflict, match="held already"):
        other.hold("chunks/w/holder")
    with pytest.raises(StateConflict, match="parent"):
        other.hold("chunks/nowhere/holder")
    signal = ChangeSignal()
    other.watch(["chunks/w/holder"], signal)
    assert other.exists("chunks/w/holder")
    cluster.expire(store)
    assert signal.wait(10) and not other.exists("chunks/w/holder")
    assert store.exists("chunks/w/files")  # persistent nodes stay


def test_unsafe_names_are_refused(cluster: Cluster) -> None:
    store = cluster.store()
    with pytest.raises(ValueError, match="invalid"):
        store.get_window("../position")
    with pytest.raises(ValueError, match="invalid"):
        store.get("a//b/../c")
    with pytest.raises(ValueError, match="invalid source"):
        StateStore(store.backend, "a/b")


# ---- helpers ------------------------------------------------------------------------


def _position(batch: int, offset: int = 4) -> PositionState:
    return PositionState(Position.from_binlog(3, offset, seq=batch),
                         {"file": "mysql-bin.000003", "pos": offset}, batch)


def _window(n: int) -> Window:
    return Window(f"w-{n}-{uuid.uuid4().hex[:6]}", ORDERS, f"low-{n}", f"high-{n}", {"chunk": n})


def _prepare_batch(store: StateStore) -> tuple[Window, Window]:
    store.create_capture("cap", [ORDERS], {})
    store.put_range("cap", "r1", RangeProgress(ORDERS, None, (100,)), ABSENT)
    w1, w2 = _window(1), _window(2)
    store.register_window(w1, {})
    store.register_window(w2, {})
    return w1, w2


def _snapshot(store: StateStore) -> object:
    return (store.get_position(), store.list_ranges("cap"),
            [(v.value.status, v.version) for v in store.list_windows()],
            store.get_batch_intent())


def _race(stores: dict[str, StateStore], path: str, version: int) -> dict[str, object]:
    """All stores compare-and-set ``path`` at ``version`` at once: name -> version or error."""
    barrier = threading.Barrier(len(stores))
    outcomes: dict[str, object] = {}

    def attempt(name: str, s: StateStore) -> None:
        barrier.wait()
        try:
            outcomes[name] = s.put(path, {"by": name}, version)
        except StateConflict as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=attempt, args=item) for item in stores.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return outcomes


def _wait_for(done: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


__all__ = sorted(name for name in dict(globals()) if name.startswith("test_"))
