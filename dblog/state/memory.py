"""An in-process backend of the state store with ZooKeeper's semantics, for fast tests.

A :class:`MemoryServer` is the tree (one per test, as one ZooKeeper ensemble); each
:meth:`MemoryServer.session` is a :class:`MemoryBackend`, a client session on it, so two
stores on one server race as two tailers on one ZooKeeper do. Versions, compare-and-set
failures, all-or-nothing transactions (with ZooKeeper's per-operation results), one-shot
existence watches, ephemeral nodes and the lock recipe (ephemeral sequential contenders,
the lowest holds) behave as they do there. What a test cannot easily make ZooKeeper do is
one call here: :meth:`MemoryBackend.expire` ends a session as a long pause or a partition
would, :meth:`MemoryBackend.suspend` reports a dropped connection, and
:meth:`MemoryServer.outage` makes every call fail as if ZooKeeper were down.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from dblog.state.backend import (
    BackendError,
    BadVersion,
    Check,
    Create,
    Delete,
    Inconsistent,
    NodeExists,
    NoNode,
    NotEmpty,
    Op,
    OpResult,
    RolledBack,
    SetData,
    Unavailable,
    Watcher,
)

__all__ = ["MemoryBackend", "MemoryEvent", "MemoryServer"]

_LOCK_NODE = "__lock__"
_CONTENDER_RE = re.compile(rf"{_LOCK_NODE}(-?\d{{10}})$")


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """What a watch is called with (kazoo calls it with a ``WatchedEvent``)."""

    type: Literal["CREATED", "CHANGED", "DELETED"]
    path: str


@dataclass(slots=True)
class _Node:
    data: bytes
    owner: int = 0
    """The session of an ephemeral node; 0 for a persistent one."""
    version: int = 0
    children: set[str] = field(default_factory=set)
    sequence: int = 0
    """The next sequential child's number."""


class _Change:
    """The mutations of one operation or transaction under the server's lock: each can be
    undone, and the watches of the paths they touched fire once it is over."""

    def __init__(self, nodes: dict[str, _Node]) -> None:
        self._nodes = nodes
        self._undo: list[Callable[[], None]] = []
        self.touched: list[MemoryEvent] = []

    def exists(self, path: str) -> bool:
        return path in self._nodes

    def node(self, path: str) -> _Node:
        found = self._nodes.get(path)
        if found is None:
            raise NoNode(path)
        return found

    def create(self, path: str, data: bytes, *, owner: int = 0, makepath: bool = False,
               sequential: bool = False) -> str:
        parent_path, name = _split(path)
        if parent_path not in self._nodes and makepath:
            self.create(parent_path, b"", makepath=True)
        parent = self.node(parent_path)
        if parent.owner:
            raise BackendError(path, name="NoChildrenForEphemeralsError")
        if sequential:
            name = f"{name}{parent.sequence:010d}"
            path = f"{parent_path.rstrip('/')}/{name}"
        if path in self._nodes:
            raise NodeExists(path)
        parent.sequence += 1
        parent.children.add(name)
        self._nodes[path] = _Node(data, owner)

        def undo() -> None:
            parent.sequence -= 1
            parent.children.discard(name)
            del self._nodes[path]

        self._undo.append(undo)
        self.touched.append(MemoryEvent("CREATED", path))
        return path

    def check(self, path: str, version: int) -> _Node:
        node = self.node(path)
        if version != -1 and node.version != version:
            raise BadVersion(path)
        return node

    def set(self, path: str, data: bytes, version: int) -> int:
        node = self.check(path, version)
        before = node.data, node.version
        node.data, node.version = data, node.version + 1

        def undo() -> None:
            node.data, node.version = before

        self._undo.append(undo)
        self.touched.append(MemoryEvent("CHANGED", path))
        return node.version

    def delete(self, path: str, version: int) -> None:
        node = self.check(path, version)
        if node.children:
            raise NotEmpty(path)
        parent_path, name = _split(path)
        parent = self._nodes[parent_path]
        parent.children.discard(name)
        del self._nodes[path]

        def undo() -> None:
            self._nodes[path] = node
            parent.children.add(name)

        self._undo.append(undo)
        self.touched.append(MemoryEvent("DELETED", path))

    def delete_tree(self, path: str) -> None:
        node = self._nodes.get(path)
        if node is None:
            return
        for child in sorted(node.children):
            self.delete_tree(f"{path.rstrip('/')}/{child}")
        self.delete(path, -1)

    def rollback(self) -> None:
        while self._undo:
            self._undo.pop()()
        self.touched.clear()


class MemoryServer:
    """One in-process tree, shared by the sessions :meth:`session` opens."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._nodes: dict[str, _Node] = {"/": _Node(b"")}
        self._watches: dict[str, list[tuple[int, Watcher]]] = {}
        self._session_ids = itertools.count(1)
        self._down = False

    def session(self) -> MemoryBackend:
        """A new client session on this tree."""
        return MemoryBackend(self)

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Every call of every session fails with ``ConnectionLoss`` inside the block (the
        sessions survive it, as they do a ZooKeeper restart shorter than their timeout)."""
        self._down = True
        try:
            yield
        finally:
            self._down = False

    @contextmanager
    def change(self, session: MemoryBackend | None) -> Iterator[_Change]:
        """Mutate the tree under its lock (for ``session``, which must be live; ``None``:
        for the server itself): undone entirely if the block raises; the watches of the
        paths touched fire once the lock is released."""
        with self._cond:
            if session is not None:
                session.check_live()
            change = _Change(self._nodes)
            try:
                yield change
            except BaseException:
                change.rollback()
                raise
            fired = self._pop_watches(change.touched)
            self._cond.notify_all()
        for watcher, event in fired:
            watcher(event)

    @contextmanager
    def reading(self, session: MemoryBackend) -> Iterator[dict[str, _Node]]:
        """Read the tree under its lock."""
        with self._cond:
            session.check_live()
            yield self._nodes

    def add_watch(self, session_id: int, path: str, watcher: Watcher) -> None:
        """Call ``watcher`` at ``path``'s next change (hold the lock)."""
        self._watches.setdefault(path, []).append((session_id, watcher))

    def end_session(self, session_id: int) -> None:
        """Drop a session's watches (kazoo drops them unfired) and its ephemeral nodes,
        firing the watches other sessions set on those."""
        with self.change(None) as change:
            self._watches = {p: kept for p, ws in self._watches.items()
                             if (kept := [w for w in ws if w[0] != session_id])}
            for path in sorted(self._nodes, reverse=True):  # children before parents
                if self._nodes[path].owner == session_id:
                    change.delete(path, -1)

    def wait(self, timeout: float) -> None:
        """Wait (holding the lock) until the tree changes or ``timeout`` passed."""
        self._cond.wait(timeout)

    @property
    def down(self) -> bool:
        """Whether an :meth:`outage` is going on."""
        return self._down

    def new_session_id(self) -> int:
        """A session id no session had before."""
        return next(self._session_ids)

    def _pop_watches(self, events: Sequence[MemoryEvent]) -> list[tuple[Watcher, MemoryEvent]]:
        fired = []
        for event in events:
            for _, watcher in self._watches.pop(event.path, []):
                fired.append((watcher, event))
        return fired


class MemoryBackend:
    """A client session on a :class:`MemoryServer`, as a
    :class:`~dblog.state.backend.StateBackend`."""

    def __init__(self, server: MemoryServer) -> None:
        self.server = server
        self.session_id = server.new_session_id()
        self._listeners: list[Callable[[], None]] = []
        self._closed = False

    def check_live(self) -> None:
        """Unavailable when the session is closed or the server is down."""
        if self._closed:
            raise Unavailable("the session is closed", name="ConnectionClosedError")
        if self.server.down:
            raise Unavailable("the server is down", name="ConnectionLoss")

    # ---- what tests do to it -----------------------------------------------------------

    def expire(self) -> None:
        """End this session as ZooKeeper does after a pause or partition past the session
        timeout: its ephemeral nodes go (the tailer lock passes to the next contender), its
        watches are lost, the store hears of it (its session-lost flag), and the client
        carries on with a new session, as kazoo reconnects."""
        self.server.end_session(self.session_id)
        self.session_id = self.server.new_session_id()
        self._interrupted()

    def suspend(self) -> None:
        """Report a dropped connection (kazoo's SUSPENDED): the session and its ephemeral
        nodes survive, but the store must assume another tailer may have taken over."""
        self._interrupted()

    # ---- the protocol ------------------------------------------------------------------

    def get(self, path: str) -> tuple[bytes, int]:
        with self.server.reading(self) as nodes:
            node = nodes.get(path)
            if node is None:
                raise NoNode(path)
            return node.data, node.version

    def create(self, path: str, data: bytes, *, makepath: bool = False,
               ephemeral: bool = False) -> None:
        owner = self.session_id if ephemeral else 0
        with self.server.change(self) as change:
            change.create(path, data, owner=owner, makepath=makepath)

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        with self.server.change(self) as change:
            return change.set(path, data, version)

    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        with self.server.change(self) as change:
            if recursive:
                change.delete_tree(path)  # as kazoo's: no error if it does not exist
            else:
                change.delete(path, version)

    def children(self, path: str) -> list[str]:
        with self.server.reading(self) as nodes:
            node = nodes.get(path)
            if node is None:
                raise NoNode(path)
            return list(node.children)

    def exists(self, path: str) -> bool:
        with self.server.reading(self) as nodes:
            return path in nodes

    def watch(self, path: str, watcher: Watcher) -> None:
        with self.server.reading(self):
            self.server.add_watch(self.session_id, path, watcher)

    def ensure_path(self, path: str) -> None:
        with self.server.change(self) as change:
            if not change.exists(path):
                change.create(path, b"", makepath=True)

    def transaction(self, ops: Sequence[Op]) -> list[OpResult]:
        with self.server.change(self) as change:
            results: list[OpResult] = []
            for i, op in enumerate(ops):
                try:
                    results.append(_apply(change, op))
                except BackendError as exc:
                    change.rollback()
                    failed: list[OpResult] = [RolledBack() for _ in range(i)]
                    return [*failed, exc, *(Inconsistent() for _ in ops[i + 1:])]
            return results

    def lock(self, path: str, identifier: str) -> _MemoryLock:
        return _MemoryLock(self, path, identifier)

    def contenders(self, path: str) -> list[str]:
        self.ensure_path(path)  # as kazoo's lock recipe does
        with self.server.reading(self) as nodes:
            return [nodes[f"{path}/{name}"].data.decode("utf-8")
                    for name in _contenders(nodes, path)]

    def owns(self, path: str) -> bool:
        with self.server.reading(self) as nodes:
            node = nodes.get(path)
            return node is not None and node.owner == self.session_id

    def on_interruption(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def close(self) -> None:
        if self._closed:
            return
        self.server.end_session(self.session_id)
        self._closed = True
        self._interrupted()  # kazoo reports a stopped client as LOST

    def _interrupted(self) -> None:
        for callback in list(self._listeners):
            callback()


class _MemoryLock:
    """The lock recipe: an ephemeral sequential contender node; the lowest holds the lock."""

    def __init__(self, backend: MemoryBackend, path: str, identifier: str) -> None:
        self._backend = backend
        self._path = path
        self._identifier = identifier
        self._node: str | None = None

    @property
    def node(self) -> str | None:
        return self._node

    def acquire(self, timeout: float) -> bool:
        backend, server = self._backend, self._backend.server
        deadline = time.monotonic() + timeout
        backend.ensure_path(self._path)
        with server.change(backend) as change:
            mine = change.create(f"{self._path}/{uuid.uuid4().hex}{_LOCK_NODE}",
                                 self._identifier.encode("utf-8"), owner=backend.session_id,
                                 sequential=True)
        with server.reading(backend) as nodes:
            while True:
                if mine not in nodes:
                    raise Unavailable(mine, name="SessionExpiredError")
                if _contenders(nodes, self._path)[0] == mine.rsplit("/", 1)[1]:
                    self._node = mine
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                server.wait(remaining)
                backend.check_live()
        backend.delete(mine)  # timed out: leave no contender behind
        return False

    def release(self) -> None:
        node, self._node = self._node, None
        if node is None:
            return
        try:
            self._backend.delete(node)
        except (NoNode, Unavailable):
            pass  # session over (or store closed): its node went with it


def _apply(change: _Change, op: Op) -> OpResult:
    match op:
        case Create(path, data):
            change.create(path, data)
            return 0
        case SetData(path, data, version):
            return change.set(path, data, version)
        case Check(path, version):
            change.check(path, version)
            return None
        case Delete(path, version):
            change.delete(path, version)
            return None
    raise TypeError(f"not a transaction operation: {op!r}")


def _contenders(nodes: dict[str, _Node], path: str) -> list[str]:
    """The lock's contender node names, lowest sequence first."""
    node = nodes.get(path)
    found = [(m.group(1), name) for name in (node.children if node else ())
             if (m := _CONTENDER_RE.search(name))]
    return [name for _, name in sorted(found)]


def _split(path: str) -> tuple[str, str]:
    """Parent path and name of an absolute ``path``."""
    if not path.startswith("/") or path == "/" or path.endswith("/") or "//" in path:
        raise BackendError(f"bad path {path!r}", name="BadArgumentsError")
    parent, name = path.rsplit("/", 1)
    return parent or "/", name
