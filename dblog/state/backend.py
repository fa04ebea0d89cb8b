"""The storage backend protocol :class:`~dblog.state.store.StateStore` is written against.

A backend is one session on a tree of versioned nodes, as ZooKeeper has it: each node holds
bytes and a version that every write increments (0 when created), writes can be
compare-and-set on that version, a transaction applies several operations all or nothing,
a watch fires once at a node's next creation, change or deletion, an ephemeral node ends
with its session, and a lock admits one holder at a time. Paths are absolute
(``/dblog/<source>/position``). :mod:`~dblog.state.zookeeper` is the real one,
:mod:`~dblog.state.memory` an in-process one with the same semantics for tests.

Failures are the exceptions below, whichever backend raised them; each carries
ZooKeeper's name for the failure (``name``), which error messages quote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from dblog.core.errors import TransientError

__all__ = [
    "BackendError",
    "BackendLock",
    "BadVersion",
    "Check",
    "Create",
    "Delete",
    "Inconsistent",
    "NoNode",
    "NodeExists",
    "NotEmpty",
    "Op",
    "OpResult",
    "RolledBack",
    "SetData",
    "StateBackend",
    "StateUnavailable",
    "Unavailable",
    "Watcher",
]


class StateUnavailable(TransientError):
    """ZooKeeper cannot be reached (or the session was lost); retry later."""


class BackendError(Exception):
    """A backend operation failed; ``name`` is ZooKeeper's name for the failure."""

    name: str = "ZookeeperError"

    def __init__(self, *args: object, name: str | None = None) -> None:
        super().__init__(*args)
        if name is not None:
            self.name = name


class NoNode(BackendError):
    """The node does not exist."""

    name = "NoNodeError"


class NodeExists(BackendError):
    """The node to create exists already."""

    name = "NodeExistsError"


class BadVersion(BackendError):
    """The node's version is not the one expected."""

    name = "BadVersionError"


class NotEmpty(BackendError):
    """The node to delete has children."""

    name = "NotEmptyError"


class RolledBack(BackendError):
    """A transaction's operation before the one that failed: undone."""

    name = "RolledBackError"


class Inconsistent(BackendError):
    """A transaction's operation after the one that failed: not tried."""

    name = "RuntimeInconsistency"


class Unavailable(BackendError):
    """The connection or the session is lost, or the service does not answer in time."""

    name = "ConnectionLoss"


@dataclass(frozen=True, slots=True)
class Create:
    """Transaction operation: create ``path`` (its parent must exist)."""

    path: str
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class SetData:
    """Transaction operation: set ``path``'s data if its version is ``version`` (-1: any)."""

    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class Check:
    """Transaction operation: require ``path`` at ``version`` (-1: that it exists)."""

    path: str
    version: int


@dataclass(frozen=True, slots=True)
class Delete:
    """Transaction operation: delete ``path`` if its version is ``version`` (-1: any)."""

    path: str
    version: int = -1


Op: TypeAlias = Create | SetData | Check | Delete
OpResult: TypeAlias = int | None | BackendError
"""A transaction operation's outcome: the new version (create: 0; set: the version it set),
``None`` (check, delete), or the failure (of every operation when one failed)."""
Watcher: TypeAlias = Callable[[Any], object]
"""Called once with the backend's event object when a watched node changes."""


class BackendLock(Protocol):
    """One contender for a lock (ZooKeeper's lock recipe: ephemeral sequential nodes)."""

    @property
    def node(self) -> str | None:
        """The path of this contender's node while it holds the lock."""

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds to hold the lock; whether it does (if not, this
        contender leaves no node behind)."""

    def release(self) -> None:
        """Release the lock; harmless when the session that held it is over."""


class StateBackend(Protocol):
    """One session on a tree of versioned nodes (see the module docstring)."""

    def get(self, path: str) -> tuple[bytes, int]:
        """The node's data and version; :class:`NoNode` if it does not exist."""

    def create(self, path: str, data: bytes, *, makepath: bool = False,
               ephemeral: bool = False) -> None:
        """Create a node (version 0) and, with ``makepath``, its missing parents (empty)."""

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Set the node's data (compare-and-set unless ``version`` is -1); the new version."""

    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete the node (CAS unless -1); ``recursive``: its subtree, if it exists at all."""

    def children(self, path: str) -> list[str]:
        """The names of the node's children, in no order; :class:`NoNode` if absent."""

    def exists(self, path: str) -> bool:
        """Whether the node exists."""

    def watch(self, path: str, watcher: Watcher) -> None:
        """Call ``watcher`` once when the node is next created, changed or deleted."""

    def ensure_path(self, path: str) -> None:
        """Create the node and its parents (empty) where missing."""

    def transaction(self, ops: Sequence[Op]) -> list[OpResult]:
        """Apply ``ops`` all or nothing; one result per operation."""

    def lock(self, path: str, identifier: str) -> BackendLock:
        """A contender for the lock at ``path``, named ``identifier``."""

    def contenders(self, path: str) -> list[str]:
        """The identifiers of the lock's contenders, the holder first."""

    def owns(self, path: str) -> bool:
        """Whether ``path`` is an ephemeral node of this session (this session's lock node)."""

    def on_interruption(self, callback: Callable[[], None]) -> None:
        """Have ``callback`` called whenever the session is suspended or lost."""

    def close(self) -> None:
        """End the session (its ephemeral nodes go) and free the connection."""
