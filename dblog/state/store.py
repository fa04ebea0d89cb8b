"""StateStore: the typed state documents of one source (see :mod:`dblog.state`),
on the generic layer of :class:`~dblog.state.tree.StateTree`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kazoo.client import KazooClient

from dblog.core.errors import StateConflict
from dblog.core.events import TableId, Window
from dblog.protocol.paths import (  # noqa: E402, F401  # noqa: E402
    BATCH_INTENT,
    CAPTURES,
    POSITION,
    WINDOWS,
    capture_path,
    range_path,
    window_path,
)
from dblog.state.backend import (
    Check,
    Create,
    Delete,
    Op,
    OpResult,
    SetData,
    StateBackend,
)
from dblog.state.documents import (
    ABSENT,
    CAPTURE_STATUSES,
    WINDOW_STATUSES,
    BatchIntent,
    CaptureState,
    CaptureStatus,
    CommitResult,
    PositionState,
    RangeProgress,
    RangeUpdate,
    Versioned,
    WindowState,
    WindowStatus,
    WindowUpdate,
    check_status,
    encode,
    now_ms,
)
from dblog.state.signals import ChangeSignal
from dblog.state.tree import StateTree, check_name, raise_tx_failure, state_errors
from dblog.state.zookeeper import ZooKeeperBackend

T = TypeVar("T")

_OP_NAMES: dict[type[Op], str] = {
    Create: "create", SetData: "set", Check: "check", Delete: "delete",
}


class StateStore(StateTree):
    """Versioned JSON state of one source in ZooKeeper (see :mod:`dblog.state`)."""

    def __init__(self, backend: StateBackend | KazooClient, source: str, *,
                 chroot: str = "dblog") -> None:
        """Use a backend session, or wrap a started kazoo client; prefer :meth:`connect`."""
        check_name(source, "source")
        if isinstance(backend, KazooClient):
            backend = ZooKeeperBackend(backend)
        super().__init__(backend, source, chroot=chroot)

    @classmethod
    def connect(
        cls, hosts: str, source: str, *, chroot: str = "dblog", timeout: float = 10,
        auth: tuple[str, str] | None = None,
    ) -> StateStore:
        """Connect to ZooKeeper ``hosts`` (``host:port[,host:port]``) within ``timeout``
        seconds. With ``auth`` (user, password) the session authenticates by digest and
        every node it creates carries an ACL granting that identity alone."""
        backend = ZooKeeperBackend.connect(hosts, timeout=timeout, auth=auth)
        try:
            return cls(backend, source, chroot=chroot)
        except BaseException:
            backend.close()
            raise

    @property
    def _zk(self) -> KazooClient:
        """The kazoo client of a ZooKeeper-backed store (tests look at its session)."""
        if not isinstance(self.backend, ZooKeeperBackend):
            raise AttributeError(f"{type(self.backend).__name__} has no kazoo client")
        return self.backend.client

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
        tx: list[Op] = []
        ops = self._check_lock_in(tx)
        tx.append(Check(self._abs(POSITION), position_version))
        tx.append(Create(self._abs(BATCH_INTENT), encode(intent.to_json(), BATCH_INTENT)))
        with state_errors("create batch intent"):
            results = self.backend.transaction(tx)
        self._raise_if_lock_lost(results, ops)
        raise_tx_failure(results, [*ops, f"check {POSITION}", f"create {BATCH_INTENT}"],
                         f"intent of batch {intent.batch}")
        return 0

    def get_batch_intent(self) -> Versioned[BatchIntent] | None:
        """The pending batch intent, if a batch was started but not committed."""
        return self._get_typed(BATCH_INTENT, BatchIntent.from_json)

    def add_batch_attempt(self, found: Versioned[BatchIntent], attempt: str) -> int:
        """Record a new write attempt at the pending batch (compare-and-set on the intent
        read: :class:`StateConflict` if another tailer changed or committed it)."""
        updated = replace(found.value, attempts=(*found.value.attempts, attempt))
        tx: list[Op] = []
        ops = self._check_lock_in(tx)
        tx.append(SetData(self._abs(BATCH_INTENT), encode(updated.to_json(), BATCH_INTENT),
                          found.version))
        with state_errors("add a batch attempt"):
            results = self.backend.transaction(tx)
        self._raise_if_lock_lost(results, ops)
        raise_tx_failure(results, [*ops, f"set {BATCH_INTENT}"],
                         f"attempt at batch {found.value.batch}")
        return _version(results[-1])

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
        with state_errors(f"create {path}"):
            self.backend.ensure_path(self._abs(CAPTURES))
            tx: list[Op] = [Create(self._abs(path), encode(state.to_json(), path)),
                            Create(self._abs(f"{path}/ranges"))]
            for range_id, progress in (ranges or {}).items():
                rpath = _range_path(capture_id, range_id)
                tx.append(Create(self._abs(rpath), encode(progress.to_json(), rpath)))
                ops.append(f"create {rpath}")
            results = self.backend.transaction(tx)
        raise_tx_failure(results, ops)
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
        tx: list[Op] = []
        ops: list[str] = []

        def add(op: Op, path: str) -> None:
            tx.append(op)
            ops.append(f"{_OP_NAMES[type(op)]} {path}")

        position = encode(state.to_json(), POSITION)
        if expected_version is None:
            add(Create(self._abs(POSITION), position), POSITION)
        else:
            add(Check(self._abs(POSITION), expected_version), POSITION)
            add(SetData(self._abs(POSITION), position, expected_version), POSITION)
        for r in ranges:
            path = _range_path(r.capture_id, r.range_id)
            data = encode(r.progress.to_json(), path)
            if r.expected_version == ABSENT:
                add(Create(self._abs(path), data), path)
            else:
                add(SetData(self._abs(path), data, r.expected_version), path)
        written_windows: list[WindowUpdate] = []
        for w in windows:
            if w.expected_version is None and self.get_window(w.window_id) is None:
                continue  # settled and forgotten by its capture meanwhile: nothing to record
            new, version = self._window_update(w)
            path = _window_path(w.window_id)
            add(SetData(self._abs(path), encode(new.to_json(), path), version), path)
            written_windows.append(w)
        if clear_intent:
            intent = self.get_batch_intent()
            if intent is not None:
                if intent.value.batch != state.batch:
                    raise StateConflict(
                        f"batch intent is for batch {intent.value.batch}, "
                        f"not the committed batch {state.batch}"
                    )
                add(Delete(self._abs(BATCH_INTENT), intent.version), BATCH_INTENT)
        with state_errors("commit batch"):
            results = self.backend.transaction(tx)
        raise_tx_failure(results, ops, f"commit of batch {state.batch}")

        it = iter(results)
        if expected_version is not None:
            next(it)  # the check
        position_version = _version(next(it))
        range_versions = {(r.capture_id, r.range_id): _version(next(it)) for r in ranges}
        window_versions = {w.window_id: _version(next(it)) for w in written_windows}
        return CommitResult(position_version, range_versions, window_versions)

    # ---- helpers -----------------------------------------------------------------------

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



def _window_path(window_id: str) -> str:
    check_name(window_id, "window id")
    return window_path(window_id)


def _capture_path(capture_id: str) -> str:
    check_name(capture_id, "capture id")
    return capture_path(capture_id)


def _range_path(capture_id: str, range_id: str) -> str:
    check_name(capture_id, "capture id")
    check_name(range_id, "range id")
    return range_path(capture_id, range_id)


def _version(result: OpResult) -> int:
    """The new version a transaction's create or set reported."""
    if not isinstance(result, int):
        raise TypeError(f"a transaction reported {result!r} where a version was due")
    return result
