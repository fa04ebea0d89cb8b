"""The generic layer of the state store: versioned JSON documents at paths under one
source's root, on a :class:`~dblog.state.backend.StateBackend` session, and the
tailer lock that fences the tailer's writes. :class:`~dblog.state.store.StateStore`
adds the typed documents on top."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

from dblog.core.errors import DblogError, LeadershipLost, LockHeld, StateConflict
from dblog.state.backend import (
    BackendError,
    BackendLock,
    BadVersion,
    Check,
    Inconsistent,
    NodeExists,
    NoNode,
    NotEmpty,
    Op,
    OpResult,
    RolledBack,
    StateBackend,
    StateUnavailable,
    Unavailable,
)
from dblog.state.documents import ABSENT, Doc, StateSchemaError, Versioned, decode, encode
from dblog.state.signals import ChangeSignal

log = logging.getLogger("dblog.state")

from dblog.protocol.paths import TAILER_LOCK  # noqa: E402

_NAME_RE = re.compile(r"[\w.:@=+-]+")  # \w: Unicode letters, digits, underscore

T = TypeVar("T")


class StateTree:
    """Versioned JSON documents of one source at paths relative to its root
    ``/<chroot>/<source>``, and its tailer lock."""

    def __init__(self, backend: StateBackend, source: str, *, chroot: str = "dblog") -> None:
        check_name(source, "source")
        parts = [p for p in chroot.split("/") if p] or ["dblog"]
        for p in parts:
            check_name(p, "chroot component")
        self.source = source
        self.root = "/" + "/".join([*parts, source])
        self.backend = backend
        self._session_lost = threading.Event()
        self._lock_node: str | None = None
        backend.on_interruption(self._session_lost.set)
        with state_errors("create root"):
            backend.ensure_path(self.root)

    def close(self) -> None:
        """End the session (releasing any held lock) and free the client."""
        self.backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- generic layer (paths are relative to the source root) -------------------------

    def get(self, path: str) -> Versioned[Doc] | None:
        """The document at ``path`` (``schema`` key removed) and its version, or ``None``."""
        full = self._abs(path)
        with state_errors(f"get {path}"):
            try:
                data, version = self.backend.get(full)
            except NoNode:
                return None
        if not data:
            return None  # a bare parent znode, no document
        return Versioned(decode(data, path), version)

    def put(self, path: str, value: Mapping[str, Any], expected_version: int | None) -> int:
        """Write ``value`` at ``path``; return the new version.

        ``expected_version``: ``None`` creates or overwrites unconditionally, an int is a
        compare-and-set on the version read, :data:`ABSENT` creates only.
        """
        full, data = self._abs(path), encode(value, path)
        with state_errors(f"put {path}"):
            try:
                if expected_version is None:
                    for _ in range(3):
                        try:
                            self.backend.create(full, data, makepath=True)
                            return 0
                        except NodeExists:
                            pass
                        try:
                            return self.backend.set(full, data)
                        except NoNode:
                            pass  # deleted in between: create again
                    raise StateConflict(f"{path} keeps being created and deleted concurrently")
                if expected_version == ABSENT:
                    self.backend.create(full, data, makepath=True)
                    return 0
                return self.backend.set(full, data, version=expected_version)
            except NodeExists:
                raise StateConflict(f"{path} already exists (expected absent)") from None
            except NoNode:
                raise StateConflict(
                    f"{path} does not exist (expected version {expected_version})"
                ) from None
            except BadVersion:
                raise StateConflict(
                    f"{path} changed concurrently (expected version {expected_version})"
                ) from None

    def delete(
        self, path: str, expected_version: int | None = None, *, recursive: bool = False
    ) -> bool:
        """Delete ``path``; return whether it existed. An int version makes it a CAS."""
        full = self._abs(path)
        with state_errors(f"delete {path}"):
            try:
                if recursive:
                    if expected_version is not None:
                        raise ValueError("recursive delete cannot compare-and-set")
                    self.backend.delete(full, recursive=True)
                else:
                    version = -1 if expected_version is None else expected_version
                    self.backend.delete(full, version=version)
                return True
            except NoNode:
                if expected_version is not None:
                    raise StateConflict(f"{path} already deleted") from None
                return False
            except BadVersion:
                raise StateConflict(
                    f"{path} changed concurrently (expected version {expected_version})"
                ) from None
            except NotEmpty:
                raise DblogError(f"{path} has children; delete them first") from None

    def children(self, path: str = "") -> list[str]:
        """Sorted child names of ``path`` (``[]`` if it does not exist)."""
        full = self._abs(path)
        with state_errors(f"list {path or '/'}"):
            try:
                return sorted(self.backend.children(full))
            except NoNode:
                return []

    def hold(self, path: str) -> None:
        """Create ``path`` as an ephemeral znode of this session (its parent must exist):
        it says this process is alive and holds something, and disappears with the
        session (a crash, a kill, a lost connection past the session timeout)."""
        with state_errors(f"hold {path}"):
            try:
                self.backend.create(self._abs(path), b"", ephemeral=True)
            except NodeExists:
                raise StateConflict(f"{path} is held already") from None
            except NoNode:
                raise StateConflict(f"the parent of {path} does not exist") from None

    def exists(self, path: str) -> bool:
        """Whether the znode ``path`` exists (a held ephemeral one, or a document)."""
        with state_errors(f"exists {path}"):
            return self.backend.exists(self._abs(path))

    def watch(self, paths: Sequence[str], signal: ChangeSignal) -> None:
        """Have ``signal`` notified once when any of ``paths`` is next created, changed or
        deleted (an existence watch each: absent znodes too). Arm it before reading what
        the signal is to announce, so that no change between the read and the wait is
        missed. A watch lost with an expired session never fires: waiters also look again
        after a while."""
        for path in paths:
            with state_errors(f"watch {path}"):
                self.backend.watch(self._abs(path), signal.notify)

    # ---- tailer lock -------------------------------------------------------------------

    @contextmanager
    def tailer_lock(self, identifier: str, timeout: float | None = 5.0,
                    stop: threading.Event | None = None,
                    on_standby: Callable[[str | None], None] | None = None) -> Iterator[None]:
        """Hold the source's single-tailer lock; :class:`LockHeld` if not acquired in time.

        ``timeout=None`` stands by: it waits as long as another tailer holds the lock (until
        that one stops or its ZooKeeper session ends) or until ``stop`` is set, which raises
        :class:`LockHeld` too; ``on_standby`` is called with the holder (None if it left
        meanwhile) once it begins to wait. The lock is an ephemeral znode: it is released
        on exit, or by ZooKeeper when this session ends. Writes stay fenced by
        :meth:`commit_batch`'s position CAS and :meth:`check_leader`.
        """
        if not identifier:
            raise ValueError("lock identifier must not be empty")
        lock = self.backend.lock(self._abs(TAILER_LOCK), identifier)
        self._acquire(lock, timeout, stop, on_standby)
        self._session_lost.clear()
        self._lock_node = lock.node
        try:
            yield
        finally:
            self._lock_node = None
            with state_errors("release tailer lock"):
                lock.release()

    def _acquire(self, lock: BackendLock, timeout: float | None, stop: threading.Event | None,
                 on_standby: Callable[[str | None], None] | None) -> None:
        """Acquire ``lock`` for :meth:`tailer_lock`: :class:`LockHeld` if not acquired."""
        began = time.monotonic()
        told = False
        while True:
            wait = 5.0 if timeout is None else max(0.0, timeout - (time.monotonic() - began))
            with state_errors("acquire tailer lock"):
                acquired = lock.acquire(min(wait, 1.0) if timeout is None else wait)
            if acquired or timeout is not None or (stop is not None and stop.is_set()):
                break
            if not told:
                told = True
                holder = self.lock_holder()
                log.info("standing by: the tailer lock for source %s is held by %s",
                         self.source, holder or "an unknown holder")
                if on_standby is not None:
                    on_standby(holder)
        if not acquired:
            holder = self.lock_holder()
            waited = time.monotonic() - began
            raise LockHeld(
                f"tailer lock for source {self.source} is held by {holder or 'an unknown holder'}"
                f" (waited {waited:.0f}s)"
            )
        if told:
            log.info("took over the tailer lock for source %s after %.1fs standing by",
                     self.source, time.monotonic() - began)

    def check_leader(self) -> None:
        """Raise :class:`LeadershipLost` unless this store still holds the tailer lock on an
        uninterrupted ZooKeeper session. The tailer calls it before every write."""
        if self._lock_node is None:
            raise LeadershipLost(f"the tailer lock for source {self.source} is not held")
        if self._session_lost.is_set():
            raise LeadershipLost(
                f"the ZooKeeper session of the tailer for {self.source} was suspended or lost; "
                "another tailer may have taken over, so this one stops writing"
            )
        with state_errors("check tailer lock"):
            owned = self.backend.owns(self._lock_node)
        if not owned:
            raise LeadershipLost(f"the tailer lock for source {self.source} was lost")

    def session_interrupted(self, wait_s: float = 0.0) -> bool:
        """Whether the session was suspended or lost since the tailer lock was taken
        (waiting up to ``wait_s`` for kazoo's event thread to report it)."""
        return self._session_lost.wait(wait_s) if wait_s > 0 else self._session_lost.is_set()

    def lock_holder(self) -> str | None:
        """The identifier of the current tailer-lock holder, or ``None`` if it is free."""
        with state_errors("read tailer lock"):
            contenders = self.backend.contenders(self._abs(TAILER_LOCK))
        return contenders[0] if contenders else None

    def _check_lock_in(self, ops: list[Op]) -> list[str]:
        """Make the transaction ``ops`` hold only while this store holds the tailer lock:
        LeadershipLost now if the session was interrupted, and a check that the lock node
        still exists in the transaction (an expired session's ephemeral node is gone,
        whatever session the client has reconnected with since). Returns the names of the
        operations it added."""
        if self._lock_node is None:
            return []
        if self._session_lost.is_set():
            raise LeadershipLost(
                f"the ZooKeeper session of the tailer for {self.source} was suspended or lost; "
                "another tailer may have taken over, so this one stops writing")
        ops.append(Check(self._lock_node, -1))
        return [f"check {TAILER_LOCK}"]

    def _raise_if_lock_lost(self, results: Sequence[OpResult], ops: Sequence[str]) -> None:
        """LeadershipLost when the lock check :meth:`_check_lock_in` added failed."""
        if ops and isinstance(results[0], NoNode):
            raise LeadershipLost(f"the tailer lock for source {self.source} was lost")

    # ---- helpers -----------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        path = path.strip("/")
        if not path:
            return self.root
        for part in path.split("/"):
            check_name(part, "path component")
        return f"{self.root}/{path}"

    def _get_typed(self, path: str, parse: Callable[[Mapping[str, Any]], T]) -> Versioned[T] | None:
        found = self.get(path)
        if found is None:
            return None
        try:
            return Versioned(parse(found.value), found.version)
        except (KeyError, TypeError, ValueError) as exc:
            where = f"{self.root}/{path}"
            raise StateSchemaError(f"corrupt state document at {where}: {exc!r}") from None


def check_name(name: str, what: str) -> None:
    """ValueError unless ``name`` is a safe path component."""
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"invalid {what} {name!r}: use letters, digits and _.:@=+-")


def raise_tx_failure(
    results: Sequence[OpResult], ops: Sequence[str], what: str = "transaction"
) -> None:
    """Raise :class:`StateConflict` naming the op that failed a committed transaction."""
    for op, result in zip(ops, results, strict=False):
        if not isinstance(result, BackendError) or isinstance(result, RolledBack | Inconsistent):
            continue
        reason = {
            BadVersion: "version changed concurrently",
            NoNode: "does not exist",
            NodeExists: "already exists",
        }.get(type(result), result.name)
        raise StateConflict(f"{what} failed at {op!r}: {reason}; nothing was changed")
    bad = [r for r in results if isinstance(r, BackendError)]
    if bad:
        raise StateConflict(f"{what} failed ({bad[0].name}); nothing was changed")


@contextmanager
def state_errors(what: str) -> Iterator[None]:
    """Turn backend connection errors into :class:`StateUnavailable` (others into
    DblogError)."""
    try:
        yield
    except Unavailable as exc:
        raise StateUnavailable(f"ZooKeeper unavailable during {what}: {exc.name}") from None
    except BackendError as exc:
        raise DblogError(f"ZooKeeper error during {what}: {exc.name} {exc}") from exc
