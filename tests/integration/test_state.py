"""StateStore against the real local ZooKeeper (``python -m devtools.services up``)."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from dblog.core.errors import DblogError, LockHeld, StateConflict
from dblog.core.events import Position, TableId, Window
from dblog.state import (
    ABSENT,
    ChangeSignal,
    Lookout,
    PositionState,
    RangeProgress,
    RangeUpdate,
    StateSchemaError,
    StateStore,
    StateUnavailable,
    WindowUpdate,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ZK_HOSTS = f"127.0.0.1:{os.environ.get('DBLOG_ZK_PORT', '12181')}"
ORDERS = TableId("shop", "orders")
LINES = TableId("shop", "order_lines")


@pytest.fixture
def raw() -> Iterator[KazooClient]:
    client = KazooClient(hosts=ZK_HOSTS, timeout=5)
    client.start(timeout=5)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def names(raw: KazooClient) -> Iterator[tuple[str, str]]:
    """A unique (chroot, source) per test, removed afterwards."""
    chroot = f"dblog-test-{uuid.uuid4().hex[:12]}"
    yield chroot, f"src-{uuid.uuid4().hex[:8]}"
    raw.delete(f"/{chroot}", recursive=True)


@pytest.fixture
def store(names: tuple[str, str]) -> Iterator[StateStore]:
    with StateStore.connect(ZK_HOSTS, names[1], chroot=names[0], timeout=5) as s:
        yield s


@pytest.fixture
def store2(names: tuple[str, str]) -> Iterator[StateStore]:
    """A second client (own ZooKeeper session) on the same source."""
    with StateStore.connect(ZK_HOSTS, names[1], chroot=names[0], timeout=5) as s:
        yield s


def _window(n: int = 0, table: TableId = ORDERS) -> Window:
    return Window(f"w-{n}-{uuid.uuid4().hex[:6]}", table, f"low-{n}", f"high-{n}", {"chunk": n})


def _position(batch: int, offset: int = 4) -> PositionState:
    return PositionState(
        Position.from_binlog(3, offset, seq=batch),
        {"file": "mysql-bin.000003", "pos": offset},
        batch,
    )


# ---- watches ---------------------------------------------------------------------------


def test_a_watch_fires_once_at_the_creation_change_and_deletion_seen_by_another_client(
    store: StateStore, store2: StateStore
) -> None:
    """A watch armed on an absent znode fires when another session creates it, and, armed
    again, when it changes and when it is deleted; an unarmed change fires nothing."""
    signal = ChangeSignal()
    store.watch(["chunks/w/files"], signal)
    assert not signal.wait(0.3)
    store2.put("chunks/w/files", {"n": 1}, None)
    assert signal.wait(5) and signal.take()
    store2.put("chunks/w/files", {"n": 2}, None)  # the watch fired already: not armed
    assert not signal.wait(0.3)
    store.watch(["chunks/w/files"], signal)
    store2.put("chunks/w/files", {"n": 3}, None)
    assert signal.wait(5) and signal.take()
    store.watch(["chunks/w/files", "chunks/w/holder"], signal)
    store2.delete("chunks/w/files")
    assert signal.wait(5) and signal.take()


def test_a_lookout_reads_again_when_its_watch_fired_or_its_interval_passed(
    store: StateStore, store2: StateStore
) -> None:
    """:class:`Lookout`: the first look is due; then none until another client changes the
    watched znode, or ``every`` seconds passed."""
    # The interval (30 s) is far beyond the wait: only the watch can end it early, so a
    # slow machine cannot make this pass or fail by timing.
    lookout = Lookout(lambda signal: store.watch(["windows/w"], signal), every=30)
    assert lookout.due()
    assert not lookout.due()
    lookout.wait(0.3)
    assert not lookout.due()
    began = time.monotonic()
    store2.put("windows/w", {"status": "emitted"}, None)
    lookout.wait(20)
    assert time.monotonic() - began < 15, "the watch did not fire"
    assert lookout.due()
    assert not lookout.due()
    ticking = Lookout(lambda signal: store.watch(["windows/w"], signal), every=1.5)
    assert ticking.due()
    assert not ticking.due()
    time.sleep(1.6)
    assert ticking.due()  # nothing changed, but the interval passed


# ---- round-trips ----------------------------------------------------------------------


def test_generic_put_get_versions_and_children(store: StateStore) -> None:
    assert store.get("misc/doc") is None
    value = {"name": "Zürich ☃ 東京", "nested": {"k": [1, "two", None, 3.5, True]}}
    assert store.put("misc/doc", value, None) == 0  # creates, with parents
    got = store.get("misc/doc")
    assert got is not None and got.value == value and got.version == 0
    assert store.put("misc/doc", {"a": 1}, None) == 1  # overwrites
    assert store.put("misc/doc", {"a": 2}, 1) == 2  # compare-and-set
    with pytest.raises(StateConflict, match="expected version 1"):
        store.put("misc/doc", {"a": 3}, 1)
    with pytest.raises(StateConflict, match="already exists"):
        store.put("misc/doc", {"a": 3}, ABSENT)
    with pytest.raises(StateConflict, match="does not exist"):
        store.put("misc/missing", {"a": 3}, 0)
    store.put("misc/other", {}, ABSENT)
    assert store.children("misc") == ["doc", "other"]
    assert store.children("nowhere") == []
    with pytest.raises(StateConflict):
        store.delete("misc/doc", expected_version=0)
    assert store.delete("misc/doc", expected_version=2) is True
    assert store.delete("misc/doc") is False
    assert store.get("misc/doc") is None


def test_documents_are_sorted_utf8_json_with_schema(store: StateStore, raw: KazooClient) -> None:
    store.put("misc/doc", {"b": "ä", "a": 1}, None)
    data, _ = raw.get(f"{store.root}/misc/doc")
    assert data == '{"a": 1, "b": "ä", "schema": 1}'.encode()


def test_position_and_batch_intent_round_trip(store: StateStore) -> None:
    assert store.get_position() is None and store.get_batch_intent() is None
    state = PositionState(
        Position(2**62 + 5, 7), {"lsn": "0/16B3748", "slot": "dblog_ünï"}, 41, 1_700_000_000_000
    )
    assert store.put_position(state, ABSENT) == 0
    got = store.get_position()
    assert got is not None and got.value == state and got.version == 0

    store.put_batch_intent(42, {"lsn": 10, "seq": 0}, {"lsn": 99, "seq": 3})
    intent = store.get_batch_intent()
    assert intent is not None
    assert (intent.value.batch, intent.value.start, intent.value.end) == (
        42,
        {"lsn": 10, "seq": 0},
        {"lsn": 99, "seq": 3},
    )
    assert intent.value.attempts == ()
    store.add_batch_attempt(intent, "a" * 32)
    again = store.get_batch_intent()
    assert again is not None and again.value.attempts == ("a" * 32,)
    with pytest.raises(StateConflict):  # another tailer recorded its attempt first
        store.add_batch_attempt(intent, "b" * 32)
    store.add_batch_attempt(again, "b" * 32)
    last = store.get_batch_intent()
    assert last is not None and last.value.attempts == ("a" * 32, "b" * 32)
    assert store.clear_batch_intent() is True
    assert store.get_batch_intent() is None


def test_window_round_trip_and_status(store: StateStore) -> None:
    w = Window("w-ünï-1", TableId("dä", "tä"), "low-α", "high-β", {"range": [1, "x"]})
    reg = store.register_window(w, {"capture": "cap-1", "note": "☃"})
    assert reg.version == 0
    with pytest.raises(StateConflict, match="already exists"):
        store.register_window(w, {})
    got = store.get_window(w.window_id)
    assert got is not None and got.value == reg.value
    assert got.value.window.meta == {"range": [1, "x"]} and got.value.status == "registered"

    emitted = store.set_window_status(w.window_id, "emitted", "42 rows", expected_version=0)
    assert emitted.version == 1 and emitted.value.detail == "42 rows"
    with pytest.raises(StateConflict):
        store.set_window_status(w.window_id, "aborted", None, expected_version=0)
    with pytest.raises(ValueError, match="unknown window status"):
        store.set_window_status(w.window_id, "bogus", None, None)  # type: ignore[arg-type]

    w2 = _window(2)
    store.register_window(w2, {})
    listed = store.list_windows()
    assert [v.value.window.window_id for v in listed] == [w.window_id, w2.window_id]
    assert listed[0].value.status == "emitted" and listed[0].version == 1
    assert store.remove_window(w.window_id) is True
    assert [v.value.window for v in store.list_windows()] == [w2]


def test_capture_and_range_round_trip(store: StateStore) -> None:
    cap = store.create_capture("cap-1", [ORDERS, LINES], {"filter": "id > 0", "keys": ["id", "ç"]})
    with pytest.raises(StateConflict):
        store.create_capture("cap-1", [ORDERS], {})
    got = store.get_capture("cap-1")
    assert got is not None and got.value == cap.value and got.value.tables == (ORDERS, LINES)

    first = RangeProgress(LINES, None, (10, "straße"), None)
    second = RangeProgress(
        LINES, (10, "straße"), None, (12, "Ω"), 3, 3000, 17, done=True
    )  # composite keys, mixed int/str
    assert store.put_range("cap-1", "r-0001", first, ABSENT) == 0
    assert store.put_range("cap-1", "r-0002", second, ABSENT) == 0
    ranges = store.list_ranges("cap-1")
    assert list(ranges) == ["r-0001", "r-0002"]
    assert ranges["r-0001"].value == first and ranges["r-0002"].value == second
    assert ranges["r-0002"].value.key_range.contains((11, "a"))

    advanced = RangeProgress(LINES, None, (10, "straße"), (5, "e"), 1, 500, 2)
    assert store.put_range("cap-1", "r-0001", advanced, 0) == 1
    with pytest.raises(StateConflict):
        store.put_range("cap-1", "r-0001", advanced, 0)

    paused = store.set_capture_status("cap-1", "paused", expected_version=0)
    assert paused.value.status == "paused" and paused.version == 1
    with pytest.raises(StateConflict):
        store.set_capture_status("cap-1", "running", expected_version=0)
    assert [c.value.capture_id for c in store.list_captures()] == ["cap-1"]
    assert store.remove_capture("cap-1") is True
    assert store.get_capture("cap-1") is None and store.list_ranges("cap-1") == {}


# ---- compare-and-set races ----------------------------------------------------------


def _race(stores: dict[str, StateStore], path: str, version: int) -> dict[str, object]:
    """All stores compare-and-set ``path`` at ``version`` at once; name -> new version or error."""
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


def test_cas_race_between_two_clients_has_exactly_one_winner(
    store: StateStore, store2: StateStore
) -> None:
    store.put("race/doc", {"by": None}, ABSENT)
    for _ in range(10):
        current = store.get("race/doc")
        assert current is not None
        outcomes = _race({"a": store, "b": store2}, "race/doc", current.version)
        winners = [n for n, o in outcomes.items() if isinstance(o, int)]
        losers = [n for n, o in outcomes.items() if isinstance(o, StateConflict)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        final = store2.get("race/doc")
        assert final is not None and final.value["by"] == winners[0]
        assert final.version == current.version + 1


# ---- commit_batch -------------------------------------------------------------------


def _prepare_batch(store: StateStore) -> tuple[Window, Window]:
    store.create_capture("cap", [ORDERS], {})
    store.put_range("cap", "r1", RangeProgress(ORDERS, None, (100,)), ABSENT)
    w1, w2 = _window(1), _window(2)
    store.register_window(w1, {})
    store.register_window(w2, {})
    return w1, w2


def test_commit_batch_applies_everything_atomically(store: StateStore) -> None:
    w1, w2 = _prepare_batch(store)
    first = store.commit_batch(_position(1), None)  # no position stored yet: create
    assert first.position_version == 0

    store.put_batch_intent(2, {"lsn": 1}, {"lsn": 2})
    r1 = RangeProgress(ORDERS, None, (100,), (50,), 1, 50, 3)
    r2 = RangeProgress(ORDERS, (100,), None, (150,), 1, 50, 0)
    result = store.commit_batch(
        _position(2, offset=999),
        first.position_version,
        ranges=[RangeUpdate("cap", "r1", r1, 0), RangeUpdate("cap", "r2", r2, ABSENT)],
        windows=[
            WindowUpdate(w1.window_id, "emitted", "50 rows"),
            WindowUpdate(w2.window_id, "aborted"),
        ],
    )
    assert result.position_version == 1
    assert dict(result.range_versions) == {("cap", "r1"): 1, ("cap", "r2"): 0}
    assert dict(result.window_versions) == {w1.window_id: 1, w2.window_id: 1}

    pos = store.get_position()
    assert pos is not None and pos.value.batch == 2 and pos.value.source_position["pos"] == 999
    assert pos.version == result.position_version
    ranges = store.list_ranges("cap")
    assert ranges["r1"].value == r1 and ranges["r2"].value == r2
    statuses = {v.value.window.window_id: v.value.status for v in store.list_windows()}
    assert statuses == {w1.window_id: "emitted", w2.window_id: "aborted"}
    assert store.get_batch_intent() is None


def _snapshot(store: StateStore) -> object:
    return (
        store.get_position(),
        store.list_ranges("cap"),
        [(v.value.status, v.version) for v in store.list_windows()],
        store.get_batch_intent(),
    )


def test_commit_batch_position_conflict_changes_nothing(
    store: StateStore, store2: StateStore
) -> None:
    w1, _ = _prepare_batch(store)
    store.commit_batch(_position(1), None)
    read = store.get_position()
    assert read is not None
    # Another tailer moves the position after we read it.
    other = store2.get_position()
    assert other is not None
    store2.commit_batch(_position(2), other.version)
    store.put_batch_intent(2, {"lsn": 1}, {"lsn": 2})
    before = _snapshot(store)

    with pytest.raises(StateConflict, match="check position") as err:
        store.commit_batch(
            _position(2),
            read.version,
            ranges=[
                RangeUpdate("cap", "r1", RangeProgress(ORDERS, None, (100,), (9,), 1, 9, 0), 0),
                RangeUpdate("cap", "new", RangeProgress(ORDERS, (100,), None), ABSENT),
            ],
            windows=[WindowUpdate(w1.window_id, "emitted")],
        )
    assert "nothing was changed" in str(err.value)
    assert _snapshot(store) == before
    assert "new" not in store.list_ranges("cap")


def test_commit_batch_range_conflict_names_op_and_changes_nothing(store: StateStore) -> None:
    w1, _ = _prepare_batch(store)
    first = store.commit_batch(_position(1), None)
    store.put_range("cap", "r1", RangeProgress(ORDERS, None, (100,), (1,), 1, 1, 0), 0)
    before = _snapshot(store)
    with pytest.raises(StateConflict, match="set captures/cap/ranges/r1"):
        store.commit_batch(
            _position(2),
            first.position_version,
            ranges=[RangeUpdate("cap", "r1", RangeProgress(ORDERS, None, (100,), (2,)), 0)],
            windows=[WindowUpdate(w1.window_id, "emitted")],
        )
    assert _snapshot(store) == before
    with pytest.raises(StateConflict, match="already exists"):
        store.commit_batch(_position(2), None)  # position exists: create must fail


def test_commit_batch_rejects_intent_for_another_batch(store: StateStore) -> None:
    store.put_batch_intent(7, {}, {})
    with pytest.raises(StateConflict, match="batch 7"):
        store.commit_batch(_position(8), None)
    assert store.get_position() is None


# ---- tailer lock --------------------------------------------------------------------


def test_tailer_lock_is_exclusive_between_clients(store: StateStore, store2: StateStore) -> None:
    assert store.lock_holder() is None
    with store.tailer_lock("tailer-a@host1"):
        assert store2.lock_holder() == "tailer-a@host1"
        started = time.monotonic()
        with pytest.raises(LockHeld, match="tailer-a@host1"):
            with store2.tailer_lock("tailer-b@host2", timeout=0.5):
                pytest.fail("second client must not get the lock")
        assert time.monotonic() - started < 15  # the 0.5 s timeout, not a wait for the holder
        assert store.lock_holder() == "tailer-a@host1"  # the loser left no contender behind
    with store2.tailer_lock("tailer-b@host2", timeout=2):
        assert store.lock_holder() == "tailer-b@host2"
    assert store.lock_holder() is None


def test_a_standby_says_whom_it_waits_for_when_the_wait_begins(
        store: StateStore, store2: StateStore) -> None:
    # The tail command prints this; a standby that learned nothing before its wait (ZooKeeper
    # restarting as it started) must still say it stands by, or no one can tell it is alive.
    told: list[str | None] = []
    took_over = threading.Event()

    def standby() -> None:
        with store2.tailer_lock("tailer-b@host2", timeout=None, on_standby=told.append):
            took_over.set()

    with store.tailer_lock("tailer-a@host1"):
        waiter = threading.Thread(target=standby)
        waiter.start()
        deadline = time.monotonic() + 10
        while not told and time.monotonic() < deadline:
            time.sleep(0.05)
        assert told == ["tailer-a@host1"]
        assert not took_over.is_set()
    waiter.join(10)
    assert took_over.is_set() and told == ["tailer-a@host1"]  # said once per wait


def test_tailer_lock_freed_when_holder_session_ends(names: tuple[str, str]) -> None:
    chroot, source = names
    first = StateStore.connect(ZK_HOSTS, source, chroot=chroot, timeout=5)
    with StateStore.connect(ZK_HOSTS, source, chroot=chroot, timeout=5) as second:
        lock = first.tailer_lock("crashy")
        lock.__enter__()
        assert second.lock_holder() == "crashy"
        first.close()  # session ends without releasing: the ephemeral node goes
        with second.tailer_lock("survivor", timeout=5):
            assert second.lock_holder() == "survivor"
            lock.__exit__(None, None, None)  # releasing on a closed store is harmless
            assert second.lock_holder() == "survivor"


# ---- connection and schema errors ---------------------------------------------------


def test_unreachable_zookeeper_fails_fast_with_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends
    started = time.monotonic()
    with pytest.raises(StateUnavailable, match=f"127.0.0.1:{port} unreachable") as err:
        StateStore.connect(f"127.0.0.1:{port}", "src", timeout=2)
    assert time.monotonic() - started < 6
    assert isinstance(err.value, DblogError) and err.value.transient


def test_unknown_schema_and_corrupt_documents_raise(store: StateStore, raw: KazooClient) -> None:
    newer = b'{"schema": 2, "batch": 1, "position": {"lsn": 1, "seq": 0}}'
    raw.create(f"{store.root}/position", newer, makepath=True)
    with pytest.raises(StateSchemaError, match="schema 2.*upgrade"):
        store.get_position()
    with pytest.raises(DblogError, match="schema 2"):
        store.get("position")

    raw.create(f"{store.root}/misc/garbage", b"\xff not json", makepath=True)
    with pytest.raises(StateSchemaError, match="not a UTF-8 JSON"):
        store.get("misc/garbage")
    raw.create(f"{store.root}/misc/noschema", b'{"a": 1}')
    with pytest.raises(StateSchemaError, match="schema"):
        store.get("misc/noschema")
    raw.create(f"{store.root}/windows/bad", b'{"schema": 1, "window_id": "bad"}', makepath=True)
    with pytest.raises(StateSchemaError, match="corrupt state document"):
        store.get_window("bad")


def test_rejects_unsafe_names(store: StateStore) -> None:
    with pytest.raises(ValueError, match="invalid"):
        store.get_window("../position")
    with pytest.raises(ValueError, match="invalid"):
        store.get("a//b/../c")
    with pytest.raises(ValueError, match="invalid"):
        store.get_capture("cap\n")
    with pytest.raises(ValueError, match="invalid source"):
        StateStore(store._zk, "a/b")


def test_a_batch_attempt_or_intent_is_recorded_only_while_the_lock_is_held(
    names: tuple[str, str], raw: KazooClient
) -> None:
    """The write-ahead record of a batch is the tailer's first write of it: a tailer whose
    session was interrupted (another may hold the lock now) must not add its attempt, and a
    lock node gone with an expired session makes the record fail even on the new session
    the client reconnected with."""
    from dblog.core.errors import LeadershipLost
    from dblog.state import BatchIntent

    chroot, source = names
    with StateStore.connect(ZK_HOSTS, source, chroot=chroot, timeout=5) as store:
        store.put_position(_position(1), ABSENT)
        with store.tailer_lock("stale"):
            store.put_batch_intent(2, {"pos": 4}, {"pos": 9})
            intent = store.get_batch_intent()
            assert intent is not None
            # Expire the session from outside, as a long pause or partition would.
            session_id, session_password = store._zk.client_id
            thief = KazooClient(hosts=ZK_HOSTS, client_id=(session_id, session_password))
            thief.start(timeout=10)
            thief.stop()
            thief.close()
            deadline = time.monotonic() + 60
            while not store.session_interrupted():
                assert time.monotonic() < deadline, "the session loss was never noticed"
                time.sleep(0.1)
            with pytest.raises(LeadershipLost):
                store.add_batch_attempt(intent, "a" * 32)
            store._session_lost.clear()  # as if the flag had not been seen yet
            deadline = time.monotonic() + 60
            while store._zk.state != "CONNECTED":  # reconnected, on a new session
                assert time.monotonic() < deadline, "never reconnected"
                time.sleep(0.1)
            with pytest.raises(LeadershipLost):
                store.add_batch_attempt(intent, "a" * 32)
            store.clear_batch_intent()
            position = store.get_position()
            assert position is not None
            with pytest.raises(LeadershipLost):
                store.create_batch_intent(BatchIntent(2, {"pos": 4}, {"pos": 9}),
                                          position.version)
            assert store.get_batch_intent() is None
