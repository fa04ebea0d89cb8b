"""Window bookkeeping: the chunk windows registered in ZooKeeper, as the window processor
follows them through the log, and the expiry of windows whose capture went away."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from dblog.core.errors import StateConflict
from dblog.core.window import WindowProcessor
from dblog.sources.base import SourceDialect
from dblog.state import PositionState, StateStore, Versioned, WindowState, WindowUpdate
from dblog.tail.batch import Pending

__all__ = ["EXPIRY_CHECK_S", "WindowBook"]

log = logging.getLogger("dblog.tail")  # one logger for the tailer, as operators know it

EXPIRY_CHECK_S = 30.0
"""How often the tailer looks for expired windows (besides once at each start)."""


class WindowBook:
    """One run's view of the chunk windows: the processor that follows them through the log,
    their ZooKeeper documents, where each was opened in the log, and which this run settled.
    A run starts with a new one: it trusts ZooKeeper alone."""

    def __init__(self, state: StateStore, dialect: SourceDialect, expiry_s: float) -> None:
        """``expiry_s``: :attr:`TailOptions.window_expiry_s`."""
        self.state = state
        self.dialect = dialect
        self.expiry_s = expiry_s
        self.proc = WindowProcessor()
        self.docs: dict[str, WindowState] = {}
        self.lw_resume: dict[str, Mapping[str, Any]] = {}
        """Per open window seen by this run: where a restart must read from to see its LW."""
        self.settled: set[str] = set()
        """Windows this tailer emitted or aborted; a repeated high watermark (a restarted
        capture writes it again) must never reopen them, even before ZooKeeper shows it."""
        self.replay_outcomes: dict[str, str] | None = None
        """While a recorded batch is rebuilt: the window outcomes it must hold."""
        self.last_expiry = 0.0

    def refresh(self) -> list[Versioned[WindowState]]:
        """Make the processor's windows match ZooKeeper's registered ones; returns the
        window documents read (for :meth:`expire`)."""
        docs = self.state.list_windows()
        self.settled &= {ws.value.window.window_id for ws in docs}
        registered = self.unsettled(docs)
        open_ids = {w.window_id for w in self.proc.open_windows}
        for wid in open_ids - registered.keys():
            self.proc.discard(wid)
        for wid in set(self.lw_resume) - registered.keys():
            del self.lw_resume[wid]
        for wid, ws in registered.items():
            self.docs[wid] = ws
            if ws.extra.get("lw_resume"):
                self.lw_resume[wid] = ws.extra["lw_resume"]
            if wid not in open_ids:
                try:
                    self.proc.register(ws.window)
                except ValueError as exc:  # clashing watermark values: never emit it
                    log.warning("window %s not registered: %s", wid, exc)
        return docs

    def unsettled(self, docs: list[Versioned[WindowState]]) -> dict[str, WindowState]:
        """The registered windows among ``docs`` this run has not settled, by id."""
        return {ws.value.window.window_id: ws.value for ws in docs
                if ws.value.status == "registered"
                and ws.value.window.window_id not in self.settled}

    def expire_if_due(self, docs: list[Versioned[WindowState]] | None = None) -> None:
        """:meth:`expire` once every ``EXPIRY_CHECK_S``."""
        if time.monotonic() - self.last_expiry >= EXPIRY_CHECK_S:
            self.expire(docs)

    def expire(self, docs: list[Versioned[WindowState]] | None = None) -> None:
        """Abort registered windows older than the expiry: their capture crashed, was
        cancelled or timed out; left open they would pin the restart position forever.
        ``docs``: the window documents if just read (versions guard every update)."""
        self.last_expiry = time.monotonic()
        expiry = self.expiry_s
        if expiry <= 0:
            return
        oldest = int((time.time() - expiry) * 1000)
        protected = set(self.settled) | set(self.replay_outcomes or ())
        for found in self.state.list_windows() if docs is None else docs:
            ws = found.value
            wid = ws.window.window_id
            if ws.status != "registered" or ws.created_at_ms > oldest or wid in protected:
                continue
            try:
                self.state.set_window_status(
                    wid, "aborted", f"expired: no high watermark within {expiry:g}s",
                    found.version,
                )
            except StateConflict:
                continue  # settled or noted meanwhile: looked at again next time
            log.warning("window %s of %s expired after %gs", wid, ws.window.table, expiry)
            self._forget(wid)

    def abort(self, wid: str, reason: str, pending: Pending) -> None:
        """Abort window ``wid`` with the batch ``pending``, unless this run settled it."""
        if wid in self.settled:
            return  # already emitted or aborted: a later verdict must not contradict it
        self.settled.add(wid)
        pending.window_updates[wid] = WindowUpdate(wid, "aborted", detail=reason)

    def committed(self, updates: Mapping[str, WindowUpdate]) -> None:
        """A batch committed ``updates``: the windows it settled are forgotten; the ones it
        registered are noted where their low watermark is."""
        for wid, update in updates.items():
            if update.status != "registered":
                self._forget(wid)
            elif (update.extra or {}).get("lw_resume"):
                self.lw_resume[wid] = (update.extra or {})["lw_resume"]

    def _forget(self, wid: str) -> None:
        self.proc.discard(wid)
        self.docs.pop(wid, None)
        self.lw_resume.pop(wid, None)

    def read_from(self, committed: Mapping[str, Any]) -> dict[str, Any]:
        """Where the run reads the log from: the ``committed`` position, or an open window's
        low watermark before it (warm-up re-reads from there)."""
        start = dict(committed)
        for ws in self.docs.values():
            lw_resume = ws.extra.get("lw_resume")
            if lw_resume and self.dialect.to_position(lw_resume) < self.dialect.to_position(start):
                start = dict(lw_resume)
        return start

    def log_needed_from(self, committed: PositionState) -> Mapping[str, Any]:
        """The earliest log position a restart may read from: the committed position, or
        an open window's low watermark before it (warm-up re-reads from there)."""
        keep = committed.source_position
        for lw_resume in self.lw_resume.values():
            if self.dialect.to_position(lw_resume) < self.dialect.to_position(keep):
                keep = lw_resume
        return keep
