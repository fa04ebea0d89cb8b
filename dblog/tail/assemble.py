"""Assembling a micro-batch: each transaction's items go through the window processor into
the batch being built; truncates, changes made without row events and aborted windows are
handled on the way."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from dblog.core.events import ChangeEvent, TableId, WatermarkEvent
from dblog.core.window import ChunkEmission, UnknownWatermark, WindowAborted
from dblog.protocol.paths import NOTICES, notice_path
from dblog.sources.base import SchemaChange, Transaction, UnloggedChange
from dblog.state import StateStore, WindowUpdate
from dblog.tail.batch import Pending
from dblog.tail.emissions import Emissions
from dblog.tail.heal import request_heal
from dblog.tail.windows import WindowBook

__all__ = ["NOTICES", "Assembler", "notice_path"]

log = logging.getLogger("dblog.tail")  # one logger for the tailer, as operators know it

class Assembler:
    """Feeds transactions of the tracked tables to the window processor and puts what comes
    out (log changes, chunk emissions, aborted windows) into the batch being built."""

    def __init__(self, *, state: StateStore, tracked: set[TableId], windows: WindowBook,
                 emissions: Emissions, healing: bool) -> None:
        """``healing``: a heal is asked for when rows change without row events."""
        self.state = state
        self.tracked = tracked
        self.windows = windows
        self.emissions = emissions
        self.healing = healing

    def consume(
        self, tx: Transaction, pending: Pending, resume_before: Mapping[str, Any], warm: bool
    ) -> None:
        """Feed one transaction's items to the window processor (warm-up: keys only)."""
        proc = self.windows.proc
        for item in tx.items:
            if isinstance(item, SchemaChange):
                if item.resets_rows and item.table in self.tracked:
                    self._table_reset(item, pending, warm)
                if item.rewrites_rows and item.table in self.tracked:
                    self._unlogged(UnloggedChange(
                        item.table, item.position,
                        f"{item.statement[:200]!r} may have changed rows without row events"),
                        pending, warm)
                continue
            if isinstance(item, UnloggedChange):
                if item.table in self.tracked:
                    self._unlogged(item, pending, warm)
                continue
            if isinstance(item, ChangeEvent) and item.table not in self.tracked:
                continue
            was_active = {w.window_id for w in proc.active_windows}
            outputs = proc.process(item)
            if any(isinstance(o, UnknownWatermark) for o in outputs):
                self.windows.refresh()
                outputs = proc.process(item)
            if warm:
                continue
            if isinstance(item, WatermarkEvent):
                for w in proc.active_windows:
                    if w.window_id not in was_active:
                        pending.window_updates[w.window_id] = WindowUpdate(
                            w.window_id, "registered",
                            extra={"lw_resume": dict(resume_before), "lw_lsn": item.position.lsn},
                        )
            for out in outputs:
                if isinstance(out, ChangeEvent):
                    pending.table(out.table).events.append(out)
                    pending.add_change()
                elif isinstance(out, ChunkEmission):
                    self.emissions.accept_emission(out, pending)
                elif isinstance(out, WindowAborted):
                    self.windows.abort(out.window.window_id, out.reason, pending)
        if not warm:
            for table, schema in tx.schemas.items():
                if table in self.tracked:
                    seen = pending.schemas.setdefault(table, [])
                    if not seen or seen[-1] != schema:  # in order, each change once
                        seen.append(schema)
            pending.end = tx.resume
            pending.end_position = tx.position
            pending.commit_ts_ms = tx.commit_ts_ms

    def _table_reset(self, change: SchemaChange, pending: Pending, warm: bool) -> None:
        """TRUNCATE / DROP of a tracked table: every row before it is gone. A chunk of that
        table selected inside an open window may hold rows from before it: abort those."""
        proc = self.windows.proc
        for w in proc.active_windows:
            if w.table == change.table:
                proc.discard(w.window_id)
                if not warm:
                    self.windows.abort(w.window_id, "the table was truncated or dropped "
                                       "inside the window", pending)
        if not warm:
            log.warning("%s: %s at %s; the lake table is emptied at that position",
                        change.table, change.statement[:80], change.position)
            pending.table(change.table).truncates.append(change.position)
            pending.add_change()

    def _unlogged(self, change: UnloggedChange, pending: Pending, warm: bool) -> None:
        """Rows of a tracked table changed without the row events that say how. An open
        window on the table must not emit them: their keys count as changed in it, or, when
        the log does not name them, the window is aborted (its capture selects the chunk
        again). Outside warm-up, the change is noted where operators look, and a heal is
        asked for (:mod:`dblog.tail.heal`), unless healing is off."""
        proc = self.windows.proc
        if change.keys is None:
            for w in proc.active_windows:
                if w.table == change.table:
                    proc.discard(w.window_id)
                    if not warm:
                        self.windows.abort(w.window_id, "rows of the table changed inside "
                                           "the window without row events", pending)
        else:
            proc.touch(change.table, change.keys)
        if warm:
            return
        healing = self.healing
        what = ("the whole table" if change.keys is None
                else f"{len(change.keys)} key{'s' if len(change.keys) != 1 else ''}")
        log.warning("%s at %s: %s; %s", change.table, change.position, change.reason,
                    f"healing it: a capture of {what}" if healing
                    else f"capture it to repair the lake (`dblog capture {change.table}`)")
        self.state.put(notice_path(change.table), {
            "table": [change.table.database, change.table.table],
            "statement": change.reason[:2000], "lsn": change.position.lsn,
            "noted_at_ms": int(time.time() * 1000), "healing": healing,
        }, None)
        if healing:
            request_heal(self.state, change.table, change.reason, change.keys)
