"""The ZooKeeper backend of the state store (kazoo): one client session.

Reads (get, children, exists, watches) retry a few times within a deadline; writes and
transactions are tried once, since a lost reply leaves their outcome unknown. kazoo's
exceptions become those of :mod:`dblog.state.backend`, named as kazoo names them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    LockTimeout,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.lock import Lock
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import make_digest_acl

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
    StateUnavailable,
    Unavailable,
    Watcher,
)

_CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, RetryFailedError)
_KINDS: dict[type[KazooException], type[BackendError]] = {
    NoNodeError: NoNode,
    NodeExistsError: NodeExists,
    BadVersionError: BadVersion,
    NotEmptyError: NotEmpty,
    RolledBackError: RolledBack,
    RuntimeInconsistency: Inconsistent,
}


class ZooKeeperBackend:
    """A started kazoo client as a :class:`~dblog.state.backend.StateBackend`."""

    def __init__(self, client: KazooClient) -> None:
        """Wrap a started client; prefer :meth:`connect`."""
        self.client = client
        # Bounded: kazoo's default command retry retries forever while ZooKeeper is down.
        self._retry = KazooRetry(
            max_tries=3, deadline=10.0, ignore_expire=False, sleep_func=client.handler.sleep_func
        )

    @classmethod
    def connect(cls, hosts: str, *, timeout: float = 10,
                auth: tuple[str, str] | None = None) -> ZooKeeperBackend:
        """Connect to ZooKeeper ``hosts`` (``host:port[,host:port]``) within ``timeout``
        seconds. With ``auth`` (user, password) the session authenticates by digest and
        every node it creates carries an ACL granting that identity alone."""
        retry = KazooRetry(max_tries=3, deadline=timeout, ignore_expire=False)
        secured: dict[str, Any] = {}
        if auth is not None:
            user, password = auth
            secured = {"auth_data": [("digest", f"{user}:{password}")],
                       "default_acl": [make_digest_acl(user, password, all=True)]}
        client = KazooClient(hosts=hosts, timeout=timeout, command_retry=retry, **secured)
        try:
            client.start(timeout=timeout)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            _stop(client)
            raise StateUnavailable(
                f"ZooKeeper at {hosts} unreachable within {timeout:g}s "
                f"({type(exc).__name__}); is it running? (python -m devtools.services up)"
            ) from None
        return cls(client)

    def get(self, path: str) -> tuple[bytes, int]:
        with _translated():
            data, stat = self._retry.copy()(self.client.get, path)
        return data, int(stat.version)

    def create(self, path: str, data: bytes, *, makepath: bool = False,
               ephemeral: bool = False) -> None:
        with _translated():
            self.client.create(path, data, makepath=makepath, ephemeral=ephemeral)

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        with _translated():
            return int(self.client.set(path, data, version=version).version)

    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        with _translated():
            if recursive:
                self.client.delete(path, recursive=True)
            else:
                self.client.delete(path, version=version)

    def children(self, path: str) -> list[str]:
        with _translated():
            return list(self._retry.copy()(self.client.get_children, path))

    def exists(self, path: str) -> bool:
        with _translated():
            return self._retry.copy()(self.client.exists, path) is not None

    def watch(self, path: str, watcher: Watcher) -> None:
        with _translated():
            self._retry.copy()(self.client.exists, path, watch=watcher)

    def ensure_path(self, path: str) -> None:
        with _translated():
            self.client.ensure_path(path)

    def transaction(self, ops: Sequence[Op]) -> list[OpResult]:
        tx = self.client.transaction()
        for op in ops:
            match op:
                case Create(path, data):
                    tx.create(path, data)
                case SetData(path, data, version):
                    tx.set_data(path, data, version)
                case Check(path, version):
                    tx.check(path, version)
                case Delete(path, version):
                    tx.delete(path, version)
        with _translated():
            results = tx.commit()
        return [_result(r) for r in results]

    def lock(self, path: str, identifier: str) -> _ZooKeeperLock:
        return _ZooKeeperLock(Lock(self.client, path, identifier))

    def contenders(self, path: str) -> list[str]:
        with _translated():
            return [str(c) for c in Lock(self.client, path).contenders()]

    def owns(self, path: str) -> bool:
        with _translated():
            found = self.client.exists(path)
        return found is not None and bool(found.ephemeralOwner == self.client.client_id[0])

    def on_interruption(self, callback: Callable[[], None]) -> None:
        def on_state(state: str) -> None:
            # Runs on kazoo's event thread: only flag it. A suspended session may already
            # have expired on the server, and a standby may hold the lock: writes stop
            # either way.
            if state in (KazooState.SUSPENDED, KazooState.LOST):
                callback()

        self.client.add_listener(on_state)

    def close(self) -> None:
        _stop(self.client)


class _ZooKeeperLock:
    """kazoo's Lock recipe as a :class:`~dblog.state.backend.BackendLock`."""

    def __init__(self, lock: Lock) -> None:
        self._lock = lock

    @property
    def node(self) -> str | None:
        lock = self._lock
        return f"{lock.path}/{lock.node}" if lock.node else None

    def acquire(self, timeout: float) -> bool:
        with _translated():
            try:
                return bool(self._lock.acquire(timeout=timeout))
            except LockTimeout:
                return False

    def release(self) -> None:
        with _translated():
            try:
                self._lock.release()
            except (SessionExpiredError, ConnectionLoss):
                pass  # session over (or store closed): ZooKeeper already dropped the lock


def _result(result: Any) -> OpResult:
    """A kazoo transaction result as an :data:`~dblog.state.backend.OpResult`."""
    if isinstance(result, KazooException):
        return _backend_error(result)
    if isinstance(result, str):
        return 0  # create -> the path created
    if result is True:
        return None  # check, delete
    return int(result.version)  # set -> the new stat


def _backend_error(exc: KazooException) -> BackendError:
    if isinstance(exc, _CONNECTION_ERRORS):
        error: BackendError = Unavailable(*exc.args, name=type(exc).__name__)
    else:
        kind = _KINDS.get(type(exc))
        error = kind(*exc.args) if kind else BackendError(*exc.args, name=type(exc).__name__)
    error.__cause__ = exc
    return error


@contextmanager
def _translated() -> Iterator[None]:
    """kazoo's exceptions as :mod:`dblog.state.backend`'s."""
    try:
        yield
    except KazooException as exc:
        raise _backend_error(exc) from exc


def _stop(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: S110 - best effort on shutdown
        pass
