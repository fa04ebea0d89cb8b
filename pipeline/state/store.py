"""StateStore: the versioned JSON state of one source in ZooKeeper (see :mod:`pipeline.state`)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar

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

from pipeline.errors import DblogError, LeadershipLost, LockHeld, StateConflict, TransientError
from pipeline.events import TableId, Window
from pipeline.state.documents import (
    ABSENT,
    CAPTURE_STATUSES,
    WINDOW_STATUSES,
    BatchIntent,
    CaptureState,
    CaptureStatus,
    CommitResult,
    Doc,
    PositionState,
    RangeProgress,
    RangeUpdate,
    StateSchemaError,
    Versioned,
    WindowState,
    WindowStatus,
    WindowUpdate,
    check_status,
    decode,
    encode,
    now_ms,
)
from pipeline.state.signals import ChangeSignal

log = logging.getLogger("pipeline.state")

POSITION = "position"
BATCH_INTENT = "batch-intent"
WINDOWS = "windows"
CAPTURES = "captures"
TAILER_LOCK = "tailer-lock"

_NAME_RE = re.compile(r"[\w.:@=+-]+")  # \w: Unicode letters, digits, underscore
_CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, RetryFailedError)

T = TypeVar("T")


class StateUnavailable(TransientError):
    """ZooKeeper cannot be reached (or the session was lost); retry later."""


class StateStore:
    """Versioned JSON state of one source in ZooKeeper (see module docstring)."""

    def __init__(self, client: KazooClient, source: str, *, chroot: str = "dblog") -> None:
        """Wrap a started kazoo client; prefer :meth:`connect`."""
        _check_name(source, "source")
        parts = [p for p in chroot.split("/") if p] or ["dblog"]
        for p in parts:
            _check_name(p, "chroot component")
        self.source = source
        self.root = "/" + "/".join([*parts, source])
        self._zk = client
        self._session_lost = threading.Event()
        self._lock_node: str | None = None
        client.add_listener(self._on_connection_state)
        # Bounded: kazoo's default command retry retries forever while ZooKeeper is down.
        self._retry = KazooRetry(
            max_tries=3, deadline=10.0, ignore_expire=False, sleep_func=client.handler.sleep_func
        )
        with _zk_errors("create root"):
            self._zk.ensure_path(self.root)

    @classmethod
    def connect(
        cls, hosts: str, source: str, *, chroot: str = "dblog", timeout: float = 10,
        auth: tuple[str, str] | None = None,
    ) -> StateStore:
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
                f"({type(exc).__name__}); is it running? (dblog services up)"
            ) from None
        try:
            return cls(client, source, chroot=chroot)
        except BaseException:
            _stop(client)
            raise

    def close(self) -> None:
        """End the session (releasing any held lock) and free the client."""
        _stop(self._zk)

    def _on_connection_state(self, state: str) -> None:
        # Runs on kazoo's event thread: only flag it. A suspended session may already have
        # expired on the server, and a standby may hold the lock: writes stop either way.
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._session_lost.set()

    def __enter__(self) -> StateStore:
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
        with _zk_errors(f"get {path}"):
            try:
                data, stat = self._retry.copy()(self._zk.get, full)
            except NoNodeError:
                return None
        if not data:
            return None  # a bare parent znode, no document
        return Versioned(decode(data, path), stat.version)

    def put(self, path: str, value: Mapping[str, Any], expected_version: int | None) -> int:
        """Write ``value`` at ``path``; return the new version.

        ``expected_version``: ``None`` creates or overwrites unconditionally, an int is a
        compare-and-set on the version read, :data:`ABSENT` creates only.
        """
        full, data = self._abs(path), encode(value, path)
        with _zk_errors(f"put {path}"):
            try:
                if expected_version is None:
                    for _ in range(3):
                        try:
                            self._zk.create(full, data, makepath=True)
                            return 0
                        except NodeExistsError:
                            pass
                        try:
                            return int(self._zk.set(full, data).version)
                        except NoNodeError:
                            pass  # deleted in between: create again
                    raise StateConflict(f"{path} keeps being created and deleted concurrently")
                if expected_version == ABSENT:
                    self._zk.create(full, data, makepath=True)
                    return 0
                return int(self._zk.set(full, data, version=expected_version).version)
            except NodeExistsError:
                raise StateConflict(f"{path} already exists (expected absent)") from None
            except NoNodeError:
                raise StateConflict(
                    f"{path} does not exist (expected version {expected_version})"
                ) from None
            except BadVersionError:
                raise StateConflict(
                    f"{path} changed concurrently (expected version {expected_version})"
                ) from None

    def delete(
        self, path: str, expected_version: int | None = None, *, recursive: bool = False
    ) -> bool:
        """Delete ``path``; return whether it existed. An int version makes it a CAS."""
        full = self._abs(path)
        with _zk_errors(f"delete {path}"):
            try:
                if recursive:
                    if expected_version is not None:
                        raise ValueError("recursive delete cannot compare-and-set")
                    self._zk.delete(full, recursive=True)
                else:
                    version = -1 if expected_version is None else expected_version
                    self._zk.delete(full, version=version)
                return True
            except NoNodeError:
                if expected_version is not None:
                    raise StateConflict(f"{path} already deleted") from None
                return False
            except BadVersionError:
                raise StateConflict(
                    f"{path} changed concurrently (expected version {expected_version})"
                ) from None
            except NotEmptyError:
                raise DblogError(f"{path} has children; delete them first") from None

    def children(self, path: str = "") -> list[str]:
        """Sorted child names of ``path`` (``[]`` if it does not exist)."""
        full = self._abs(path)
        with _zk_errors(f"list {path or '/'}"):
            try:
                return sorted(self._retry.copy()(self._zk.get_children, full))
            except NoNodeError:
                return []

    def hold(self, path: str) -> None:
        """Create ``path`` as an ephemeral znode of this session (its parent must exist):
        it says this process is alive and holds something, and disappears with the
        session (a crash, a kill, a lost connection past the session timeout)."""
        with _zk_errors(f"hold {path}"):
            try:
                self._zk.create(self._abs(path), b"", ephemeral=True)
            except NodeExistsError:
                raise StateConflict(f"{path} is held already") from None
            except NoNodeError:
                raise StateConflict(f"the parent of {path} does not exist") from None

    def exists(self, path: str) -> bool:
        """Whether the znode ``path`` exists (a held ephemeral one, or a document)."""
        with _zk_errors(f"exists {path}"):
            return self._retry.copy()(self._zk.exists, self._abs(path)) is not None

    def watch(self, paths: Sequence[str], signal: ChangeSignal) -> None:
        """Have ``signal`` notified once when any of ``paths`` is next created, changed or
        deleted (an existence watch each: absent znodes too). Arm it before reading what
        the signal is to announce, so that no change between the read and the wait is
        missed. A watch lost with an expired session never fires: waiters also look again
        after a while."""
        for path in paths:
            with _zk_errors(f"watch {path}"):
                self._retry.copy()(self._zk.exists, self._abs(path), watch=signal.notify)

    # ---- log position and batch intent -------------------------------------------------

    def get_position(self) -> Versioned[PositionState] | None:
        """The committed log position, or ``None`` before the first commit."""
        return self._get_typed(POSITION, PositionState.from_json)

    def put_position(self, state: PositionState, expected_version: int | None) -> int:
        """Set the position outside a batch (initial position, operator reset)."""
        return self.put(POSITION, state.to_json(), expected_version)

    def put_batch_intent(self, batch: int, start: Mapping[str, Any], end: Mapping[str, Any]) -> int:
        """Write an intent unconditionally (tools and tests; the tailer uses
        :meth:`create_batch_intent`, which is fenced by the position's version)."""
        return self.put(BATCH_INTENT, BatchIntent(batch, start, end).to_json(), None)

    def create_batch_intent(self, intent: BatchIntent, position_version: int) -> int:
        """Record the batch about to be written, only if the position is still at
        ``position_version`` and no intent exists (:class:`StateConflict` otherwise: another
        tailer moved on, or a batch is pending). Cleared by :meth:`commit_batch`."""
        tx = self._zk.transaction()
        ops = self._check_lock_in(tx)
        tx.check(self._abs(POSITION), position_version)
        tx.create(self._abs(BATCH_INTENT), encode(intent.to_json(), BATCH_INTENT))
        with _zk_errors("create batch intent"):
            results = tx.commit()
        self._raise_if_lock_lost(results, ops)
        _raise_tx_failure(results, [*ops, f"check {POSITION}", f"create {BATCH_INTENT}"],
                          f"intent of batch {intent.batch}")
        return 0

    def get_batch_intent(self) -> Versioned[BatchIntent] | None:
        """The pending batch intent, if a batch was started but not committed."""
        return self._get_typed(BATCH_INTENT, BatchIntent.from_json)

    def add_batch_attempt(self, found: Versioned[BatchIntent], attempt: str) -> int:
        """Record a new write attempt at the pending batch (compare-and-set on the intent
        read: :class:`StateConflict` if another tailer changed or committed it)."""
        updated = replace(found.value, attempts=(*found.value.attempts, attempt))
        tx = self._zk.transaction()
        ops = self._check_lock_in(tx)
        tx.set_data(self._abs(BATCH_INTENT), encode(updated.to_json(), BATCH_INTENT),
                    found.version)
        with _zk_errors("add a batch attempt"):
            results = tx.commit()
        self._raise_if_lock_lost(results, ops)
        _raise_tx_failure(results, [*ops, f"set {BATCH_INTENT}"],
                          f"attempt at batch {found.value.batch}")
        return int(results[-1].version)

    def _check_lock_in(self, tx: Any) -> list[str]:
        """Make ``tx`` hold only while this store holds the tailer lock: LeadershipLost
        now if the session was interrupted, and a check that the lock node still exists
        in the transaction (an expired session's ephemeral node is gone, whatever session
        the client has reconnected with since). Returns the operations it added."""
        if self._lock_node is None:
            return []
        if self._session_lost.is_set():
            raise LeadershipLost(
                f"the ZooKeeper session of the tailer for {self.source} was suspended or lost; "
                "another tailer may have taken over, so this one stops writing")
        tx.check(self._lock_node, -1)
        return [f"check {TAILER_LOCK}"]

    def _raise_if_lock_lost(self, results: Sequence[Any], ops: Sequence[str]) -> None:
        """LeadershipLost when the lock check :meth:`_check_lock_in` added failed."""
        if ops and isinstance(results[0], NoNodeError):
            raise LeadershipLost(f"the tailer lock for source {self.source} was lost")

    def clear_batch_intent(self) -> bool:
        """Drop a pending intent (e.g. after rolling the batch back)."""
        return self.delete(BATCH_INTENT)

    # ---- windows ----------------------------------------------------------------------

    def register_window(self, window: Window, extra: Mapping[str, Any]) -> Versioned[WindowState]:
        """Create the window's document; :class:`StateConflict` if it already exists."""
        state = WindowState(window, extra=dict(extra))
        version = self.put(_window_path(window.window_id), state.to_json(), ABSENT)
        return Versioned(state, version)

    def get_window(self, window_id: str) -> Versioned[WindowState] | None:
        return self._get_typed(_window_path(window_id), WindowState.from_json)

    def watch_window(self, window_id: str, signal: ChangeSignal) -> None:
        """Notify ``signal`` at the window document's next change (see :meth:`watch`)."""
        self.watch([_window_path(window_id)], signal)

    def list_windows(self) -> list[Versioned[WindowState]]:
        """All windows, oldest first."""
        found = (self.get_window(w) for w in self.children(WINDOWS))
        windows = [w for w in found if w is not None]
        return sorted(windows, key=lambda v: (v.value.created_at_ms, v.value.window.window_id))

    def set_window_status(
        self,
        window_id: str,
        status: WindowStatus,
        detail: str | None,
        expected_version: int | None,
    ) -> Versioned[WindowState]:
        """Set a window's status (CAS if ``expected_version`` is given)."""
        update = WindowUpdate(window_id, status, detail, expected_version)
        new, version = self._window_update(update)
        return Versioned(new, self.put(_window_path(window_id), new.to_json(), version))

    def remove_window(self, window_id: str, expected_version: int | None = None) -> bool:
        return self.delete(_window_path(window_id), expected_version)

    def abort_open_windows(self, capture_id: str | None, reason: str) -> list[str]:
        """Abort the registered windows of ``capture_id`` (``None``: of every capture), except
        those a pending batch intent records (the tailer must rebuild that batch as it was
        written). Returns the ids aborted."""
        intent = self.get_batch_intent()
        protected = set(intent.value.windows) if intent is not None else set()
        aborted = []
        for found in self.list_windows():
            ws = found.value
            wid = ws.window.window_id
            if ws.status != "registered" or wid in protected:
                continue
            if capture_id is not None and ws.extra.get("capture_id") != capture_id:
                continue
            try:
                self.set_window_status(wid, "aborted", reason, found.version)
            except StateConflict:
                continue  # the tailer settled it meanwhile
            aborted.append(wid)
        return aborted

    # ---- captures and range progress ---------------------------------------------------

    def create_capture(
        self,
        capture_id: str,
        tables: Sequence[TableId],
        spec: Mapping[str, Any],
        ranges: Mapping[str, RangeProgress] | None = None,
    ) -> Versioned[CaptureState]:
        """Create a running capture with its key ranges, all or nothing;
        :class:`StateConflict` if the id is taken."""
        state = CaptureState(capture_id, tuple(tables), dict(spec))
        path = _capture_path(capture_id)
        ops = [f"create {path}", f"create {path}/ranges"]
        with _zk_errors(f"create {path}"):
            self._zk.ensure_path(self._abs(CAPTURES))
            tx = self._zk.transaction()
            tx.create(self._abs(path), encode(state.to_json(), path))
            tx.create(self._abs(f"{path}/ranges"))
            for range_id, progress in (ranges or {}).items():
                rpath = _range_path(capture_id, range_id)
                tx.create(self._abs(rpath), encode(progress.to_json(), rpath))
                ops.append(f"create {rpath}")
            results = tx.commit()
        _raise_tx_failure(results, ops)
        return Versioned(state, 0)

    def get_capture(self, capture_id: str) -> Versioned[CaptureState] | None:
        return self._get_typed(_capture_path(capture_id), CaptureState.from_json)

    def list_captures(self) -> list[Versioned[CaptureState]]:
        """All captures, oldest first."""
        found = (self.get_capture(c) for c in self.children(CAPTURES))
        captures = [c for c in found if c is not None]
        return sorted(captures, key=lambda v: (v.value.created_at_ms, v.value.capture_id))

    def set_capture_status(
        self, capture_id: str, status: CaptureStatus, expected_version: int | None
    ) -> Versioned[CaptureState]:
        """Set a capture's status (CAS if ``expected_version`` is given)."""
        check_status(status, CAPTURE_STATUSES, "capture")
        current = self._require(self.get_capture(capture_id), f"capture {capture_id}")
        if expected_version is not None and current.version != expected_version:
            raise StateConflict(
                f"capture {capture_id} changed concurrently "
                f"(expected version {expected_version}, found {current.version})"
            )
        new = replace(current.value, status=status, updated_at_ms=now_ms())
        path = _capture_path(capture_id)
        return Versioned(new, self.put(path, new.to_json(), current.version))

    def remove_capture(self, capture_id: str) -> bool:
        """Delete a capture and all its range progress."""
        return self.delete(_capture_path(capture_id), recursive=True)

    def put_range(
        self, capture_id: str, range_id: str, progress: RangeProgress, expected_version: int | None
    ) -> int:
        """Write a range's progress (CAS on an int version, :data:`ABSENT` = create)."""
        return self.put(_range_path(capture_id, range_id), progress.to_json(), expected_version)

    def get_range(self, capture_id: str, range_id: str) -> Versioned[RangeProgress] | None:
        return self._get_typed(_range_path(capture_id, range_id), RangeProgress.from_json)

    def list_ranges(self, capture_id: str) -> dict[str, Versioned[RangeProgress]]:
        """Range id -> progress, in range id order."""
        ranges = {}
        for range_id in self.children(f"{_capture_path(capture_id)}/ranges"):
            found = self.get_range(capture_id, range_id)
            if found is not None:
                ranges[range_id] = found
        return ranges

    # ---- the atomic batch commit -------------------------------------------------------

    def commit_batch(
        self,
        state: PositionState,
        expected_version: int | None,
        *,
        ranges: Sequence[RangeUpdate] = (),
        windows: Sequence[WindowUpdate] = (),
        clear_intent: bool = True,
    ) -> CommitResult:
        """Atomically move the position and record the batch's range and window progress.

        ``expected_version`` is the position version read before the batch (``None``: no
        position stored yet). One transaction checks and sets the position, writes each
        range (CAS or create), sets each window's status, and deletes the batch intent (if
        ``clear_intent`` and one exists; it must be for ``state.batch``). Nothing changes if
        any part fails: :class:`StateConflict` names the failing operation. On
        :class:`StateUnavailable` the outcome is unknown: re-read the position (its ``batch``
        tells whether this commit landed) before retrying.
        """
        tx = self._zk.transaction()
        ops: list[str] = []

        def add(op: str, path: str, fn: Any, *args: Any) -> None:
            fn(self._abs(path), *args)
            ops.append(f"{op} {path}")

        if expected_version is None:
            add("create", POSITION, tx.create, encode(state.to_json(), POSITION))
        else:
            add("check", POSITION, tx.check, expected_version)
            add("set", POSITION, tx.set_data, encode(state.to_json(), POSITION), expected_version)
        for r in ranges:
            path = _range_path(r.capture_id, r.range_id)
            data = encode(r.progress.to_json(), path)
            if r.expected_version == ABSENT:
                add("create", path, tx.create, data)
            else:
                add("set", path, tx.set_data, data, r.expected_version)
        written_windows: list[WindowUpdate] = []
        for w in windows:
            if w.expected_version is None and self.get_window(w.window_id) is None:
                continue  # settled and forgotten by its capture meanwhile: nothing to record
            new, version = self._window_update(w)
            path = _window_path(w.window_id)
            add("set", path, tx.set_data, encode(new.to_json(), path), version)
            written_windows.append(w)
        if clear_intent:
            intent = self.get_batch_intent()
            if intent is not None:
                if intent.value.batch != state.batch:
                    raise StateConflict(
                        f"batch intent is for batch {intent.value.batch}, "
                        f"not the committed batch {state.batch}"
                    )
                add("delete", BATCH_INTENT, tx.delete, intent.version)
        with _zk_errors("commit batch"):
            results = tx.commit()
        _raise_tx_failure(results, ops, f"commit of batch {state.batch}")

        def new_version(result: Any) -> int:
            return 0 if isinstance(result, str) else int(result.version)  # create -> path

        it = iter(results)
        if expected_version is not None:
            next(it)  # the check
        position_version = new_version(next(it))
        range_versions = {(r.capture_id, r.range_id): new_version(next(it)) for r in ranges}
        window_versions = {w.window_id: new_version(next(it)) for w in written_windows}
        return CommitResult(position_version, range_versions, window_versions)

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
        lock = Lock(self._zk, self._abs(TAILER_LOCK), identifier)
        began = time.monotonic()
        told = False
        while True:
            wait = 5.0 if timeout is None else max(0.0, timeout - (time.monotonic() - began))
            with _zk_errors("acquire tailer lock"):
                try:
                    acquired = bool(lock.acquire(timeout=min(wait, 1.0) if timeout is None
                                                 else wait))
                except LockTimeout:
                    acquired = False
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
        self._session_lost.clear()
        self._lock_node = f"{lock.path}/{lock.node}" if lock.node else None
        try:
            yield
        finally:
            self._lock_node = None
            with _zk_errors("release tailer lock"):
                try:
                    lock.release()
                except (SessionExpiredError, ConnectionLoss):
                    pass  # session over (or store closed): ZooKeeper already dropped the lock

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
        with _zk_errors("check tailer lock"):
            found = self._zk.exists(self._lock_node)
        if found is None or found.ephemeralOwner != self._zk.client_id[0]:
            raise LeadershipLost(f"the tailer lock for source {self.source} was lost")

    def session_interrupted(self, wait_s: float = 0.0) -> bool:
        """Whether the session was suspended or lost since the tailer lock was taken
        (waiting up to ``wait_s`` for kazoo's event thread to report it)."""
        return self._session_lost.wait(wait_s) if wait_s > 0 else self._session_lost.is_set()

    def lock_holder(self) -> str | None:
        """The identifier of the current tailer-lock holder, or ``None`` if it is free."""
        with _zk_errors("read tailer lock"):
            contenders = Lock(self._zk, self._abs(TAILER_LOCK)).contenders()
        return str(contenders[0]) if contenders else None

    # ---- helpers -----------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        path = path.strip("/")
        if not path:
            return self.root
        for part in path.split("/"):
            _check_name(part, "path component")
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

    def _require(self, found: Versioned[T] | None, what: str) -> Versioned[T]:
        if found is None:
            raise StateConflict(f"{what} does not exist")
        return found

    def _window_update(self, w: WindowUpdate) -> tuple[WindowState, int]:
        check_status(w.status, WINDOW_STATUSES, "window")
        current = self._require(self.get_window(w.window_id), f"window {w.window_id}")
        if w.expected_version is not None and current.version != w.expected_version:
            raise StateConflict(
                f"window {w.window_id} changed concurrently "
                f"(expected version {w.expected_version}, found {current.version})"
            )
        extra = {**current.value.extra, **(w.extra or {})}
        status, detail = w.status, w.detail
        if status == "registered" and current.value.status != "registered":
            # A progress note (e.g. the low watermark was seen) never reopens a settled window.
            status, detail = current.value.status, current.value.detail
        new = replace(
            current.value, status=status, detail=detail, extra=extra, updated_at_ms=now_ms()
        )
        return new, current.version


def _check_name(name: str, what: str) -> None:
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"invalid {what} {name!r}: use letters, digits and _.:@=+-")



def _window_path(window_id: str) -> str:
    _check_name(window_id, "window id")
    return f"{WINDOWS}/{window_id}"


def _capture_path(capture_id: str) -> str:
    _check_name(capture_id, "capture id")
    return f"{CAPTURES}/{capture_id}"


def _range_path(capture_id: str, range_id: str) -> str:
    _check_name(range_id, "range id")
    return f"{_capture_path(capture_id)}/ranges/{range_id}"


def _raise_tx_failure(
    results: Sequence[Any], ops: Sequence[str], what: str = "transaction"
) -> None:
    """Raise :class:`StateConflict` naming the op that failed a committed transaction."""
    for op, result in zip(ops, results, strict=False):
        if not isinstance(result, Exception) or isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            continue
        reason = {
            BadVersionError: "version changed concurrently",
            NoNodeError: "does not exist",
            NodeExistsError: "already exists",
        }.get(type(result), type(result).__name__)
        raise StateConflict(f"{what} failed at {op!r}: {reason}; nothing was changed")
    bad = [r for r in results if isinstance(r, Exception)]
    if bad:
        raise StateConflict(f"{what} failed ({type(bad[0]).__name__}); nothing was changed")


@contextmanager
def _zk_errors(what: str) -> Iterator[None]:
    """Turn kazoo connection errors into :class:`StateUnavailable` (others into DblogError)."""
    try:
        yield
    except _CONNECTION_ERRORS as exc:
        reason = type(exc).__name__
        raise StateUnavailable(f"ZooKeeper unavailable during {what}: {reason}") from None
    except KazooException as exc:
        raise DblogError(f"ZooKeeper error during {what}: {type(exc).__name__} {exc}") from exc


def _stop(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: S110 - best effort on shutdown
        pass
