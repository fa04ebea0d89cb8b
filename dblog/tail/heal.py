"""Healing: captures the tailer asks for when rows changed without the row events that say how.

Some source features change rows the log does not describe: a DDL that fills or rewrites a
column, a statement-format DML, a partial row image, a foreign-key cascade. The tailer then
records a *heal request* for the table (``heals/<table digest>`` in ZooKeeper: the keys
known to have changed, or the whole table, and why) and aborts the table's open chunk windows
where needed. A :class:`Healer`, run beside the leading tailer, captures what each request
names (a DBLog capture, so the rows it brings are current at their high watermark whatever
changes meanwhile, and a whole-table capture also deletes the keys the source lost) and
removes the request once the capture is done.

A request is written before the batch that holds its cause is committed: a crash in between
makes the replay ask again (requests merge), never forget. Requests that arrive while their
table's heal runs bump the request's generation; the heal's end then keeps it, and the
table is healed again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dblog.core.errors import DblogError, StateConflict
from dblog.core.events import Key, TableId, key_from_json, key_to_json
from dblog.protocol.paths import HEALS, heal_path

if TYPE_CHECKING:
    from dblog.capture import Capturer
    from dblog.state import StateStore, Versioned

log = logging.getLogger(__name__)

MAX_KEYS = 2000
"""A request naming more keys heals the whole table instead (ZooKeeper documents stay
small, and a capture of that many keys is no cheaper than a table's)."""
MAX_REASONS = 5
"""How many of the latest reasons a request keeps."""
RETRY_S = 30.0
"""How long a heal that failed waits before it is tried again."""


@dataclass(frozen=True)
class HealRequest:
    """What to capture again for one table, and why."""

    table: TableId
    keys: tuple[Key, ...] | None
    """The keys whose rows changed (None: any row of the table may have)."""
    reasons: tuple[str, ...]
    """The latest reasons, newest last."""
    generation: int = 1
    """Bumped by every request merged into this one."""
    requested_at_ms: int = 0
    capture_id: str | None = None
    """The capture healing it now."""
    capture_generation: int | None = None
    """The generation that capture heals: a request merged after it is healed again."""
    error: str | None = None
    """Why the last attempt failed (tried again after :data:`RETRY_S`)."""
    failed_at_ms: int | None = None

    @property
    def whole_table(self) -> bool:
        return self.keys is None

    def merged(self, keys: Sequence[Key] | None, reason: str, now_ms: int) -> HealRequest:
        """This request with another one's keys (None: the whole table) and reason."""
        new_keys: tuple[Key, ...] | None = None
        if keys is not None and self.keys is not None:
            union = tuple(dict.fromkeys((*self.keys, *keys)))
            new_keys = union if len(union) <= MAX_KEYS else None
        reasons = self.reasons if reason in self.reasons else (*self.reasons, reason)
        return replace(self, keys=new_keys, reasons=reasons[-MAX_REASONS:],
                       generation=self.generation + 1, requested_at_ms=now_ms)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": [self.table.database, self.table.table],
            "keys": None if self.keys is None else [key_to_json(k) for k in self.keys],
            "reasons": list(self.reasons), "generation": self.generation,
            "requested_at_ms": self.requested_at_ms, "capture_id": self.capture_id,
            "capture_generation": self.capture_generation, "error": self.error,
            "failed_at_ms": self.failed_at_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HealRequest:
        keys = data.get("keys")
        return cls(
            TableId(*data["table"]),
            None if keys is None else tuple(tuple(key_from_json(k) or ()) for k in keys),
            tuple(str(r) for r in data.get("reasons") or ()),
            int(data.get("generation", 1)), int(data.get("requested_at_ms", 0)),
            data.get("capture_id"), data.get("capture_generation"), data.get("error"),
            data.get("failed_at_ms"),
        )


def request_heal(state: StateStore, table: TableId, reason: str,
                 keys: Sequence[Key] | None = None) -> HealRequest:
    """Ask for ``table`` (or only ``keys`` of it) to be captured again; merged into a
    request already waiting. Returns the request as stored."""
    if keys is not None and len(keys) > MAX_KEYS:
        keys = None
    path = heal_path(table)
    for _ in range(20):
        now = int(time.time() * 1000)
        found = state.get(path)
        if found is None:
            request = HealRequest(table, None if keys is None else tuple(dict.fromkeys(keys)),
                                  (reason,), requested_at_ms=now)
            expected = -1
        else:
            request = HealRequest.from_json(found.value).merged(keys, reason, now)
            expected = found.version
        try:
            from dblog.state import ABSENT

            state.put(path, request.to_json(), ABSENT if expected < 0 else expected)
            return request
        except StateConflict:
            continue  # another writer (the healer settling it): read again
    raise DblogError(f"could not record the heal request of {table}: it keeps changing")


def pending_heals(state: StateStore) -> list[Versioned[HealRequest]]:
    """Every heal request, oldest first."""
    from dblog.state import Versioned

    found = []
    for name in state.children(HEALS):
        doc = state.get(f"{HEALS}/{name}")
        if doc is not None:
            found.append(Versioned(HealRequest.from_json(doc.value), doc.version))
    return sorted(found, key=lambda f: (f.value.requested_at_ms, str(f.value.table)))


class Healer:
    """Runs the captures of heal requests, one at a time, in a thread of its own beside a
    leading tailer (whose run emits their chunks). Only requests of ``tables`` are healed.

    :meth:`idle` says whether nothing is left to heal (``dblog tail --until-caught-up``
    ends only then). A failed heal is recorded in its request (``dblog status`` shows it)
    and tried again after :data:`RETRY_S`; the tailer goes on meanwhile."""

    def __init__(self, state: StateStore, capturer: Callable[[], Capturer],
                 tables: Iterable[TableId], *, poll_s: float = 0.5,
                 retry_s: float = RETRY_S) -> None:
        self.state = state
        self._capturer = capturer
        self.tables = frozenset(tables)
        self.poll_s = poll_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None
        self.healed: list[TableId] = []
        """Tables healed by this healer, in order (tests, reports)."""

    def start(self) -> Healer:
        self._thread = threading.Thread(target=self._main, name="dblog-healer", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 120.0) -> None:
        """Stop at once: a heal capture under way stops as a stopped capture does (its
        next run goes on from its progress)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def idle(self) -> bool:
        """Whether no heal runs and none of this healer's tables waits for one that could
        run now (a failed one waiting for its retry counts as waiting)."""
        if self._busy.is_set():
            return False
        return not self._due(pending_heals(self.state), include_retries=True)

    def _due(self, heals: list[Versioned[HealRequest]], *, include_retries: bool = False
             ) -> list[Versioned[HealRequest]]:
        now = time.time() * 1000
        return [h for h in heals if h.value.table in self.tables
                and (include_retries or h.value.failed_at_ms is None
                     or now - h.value.failed_at_ms >= self.retry_s * 1000)]

    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                due = self._due(pending_heals(self.state))
            except DblogError as exc:
                log.warning("healer: could not read the heal requests (%s); trying again", exc)
                due = []
            if not due:
                self._stop.wait(self.poll_s)
                continue
            self._busy.set()
            try:
                self._heal(due[0])
            except DblogError as exc:
                log.warning("healer: healing %s failed: %s", due[0].value.table, exc)
                self._record_failure(due[0].value.table, str(exc))
            finally:
                self._busy.clear()

    def _heal(self, found: Versioned[HealRequest]) -> None:
        from dblog.capture import CaptureRequest
        from dblog.capture.range_capture import paused_captures

        request = found.value
        table = request.table
        paused = paused_captures(self.state, table)
        if paused:
            raise DblogError(f"capture {', '.join(paused)} of {table} is paused: run `dblog "
                             f"resume {table}` (or `dblog cancel {table}`) so that it heals")
        capturer = self._capturer()
        capture_id = request.capture_id
        existing = self.state.get_capture(capture_id) if capture_id else None
        if existing is None or existing.value.status not in ("running", "done"):
            capture_id = capturer.plan(CaptureRequest((table,), keys=request.keys))
            claimed = self._claim(table, capture_id)
            if claimed is None:
                return
            request = claimed.value
        assert capture_id is not None
        log.warning("healing %s (%s): capture %s of %s", table, "; ".join(request.reasons),
                    capture_id, "the whole table" if request.keys is None
                    else f"{len(request.keys)} keys")
        reports = capturer.run(capture_id, stop=self._stop)
        statuses = {r.status for r in reports}
        if statuses == {"done"}:
            self._settle(table, capture_id)
            self.healed.append(table)
            log.warning("healed %s: capture %s done", table, capture_id)
        elif statuses & {"cancelled"}:
            self._forget(table, capture_id, "its capture was cancelled")
        elif not self._stop.is_set():
            raise DblogError(f"its capture {capture_id} ended {sorted(statuses)}")

    def _claim(self, table: TableId, capture_id: str) -> Versioned[HealRequest] | None:
        """Record that ``capture_id`` heals the request as it stands now."""
        for _ in range(20):
            doc = self.state.get(heal_path(table))
            if doc is None:
                return None
            request = HealRequest.from_json(doc.value)
            claimed = replace(request, capture_id=capture_id,
                              capture_generation=request.generation, error=None,
                              failed_at_ms=None)
            try:
                version = self.state.put(heal_path(table), claimed.to_json(), doc.version)
            except StateConflict:
                continue
            from dblog.state import Versioned

            return Versioned(claimed, version)
        raise DblogError(f"the heal request of {table} keeps changing")

    def _settle(self, table: TableId, capture_id: str) -> None:
        """The capture is done: the request goes, unless another was merged into it since
        the capture began (then it waits for the next heal)."""
        for _ in range(20):
            doc = self.state.get(heal_path(table))
            if doc is None:
                return
            request = HealRequest.from_json(doc.value)
            try:
                if request.capture_generation == request.generation:
                    self.state.delete(heal_path(table), doc.version)
                else:
                    self.state.put(heal_path(table), replace(
                        request, capture_id=None, capture_generation=None).to_json(),
                        doc.version)
                return
            except StateConflict:
                continue
        raise DblogError(f"the heal request of {table} keeps changing")

    def _forget(self, table: TableId, capture_id: str, why: str) -> None:
        """An operator cancelled the heal's capture: the request goes (a notice stays in
        ``dblog status`` until a capture of the table is done)."""
        log.warning("heal of %s dropped: %s (capture %s); `dblog capture %s` heals it",
                    table, why, capture_id, table)
        doc = self.state.get(heal_path(table))
        if doc is not None:
            try:
                self.state.delete(heal_path(table), doc.version)
            except StateConflict:
                pass  # asked again meanwhile: healed next time

    def _record_failure(self, table: TableId, error: str) -> None:
        for _ in range(5):
            doc = self.state.get(heal_path(table))
            if doc is None:
                return
            request = replace(HealRequest.from_json(doc.value), error=error[:2000],
                              failed_at_ms=int(time.time() * 1000))
            try:
                self.state.put(heal_path(table), request.to_json(), doc.version)
                return
            except StateConflict:
                continue
