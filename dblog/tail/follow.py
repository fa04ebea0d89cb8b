"""A long-running tailer that follows the configuration's table set.

Adding a table to the YAML config must not need a tailer restart by hand, and must not open a
gap or write a duplicate for the tables already served. The supervisor holds the tailer lock
for its whole life and, when the configured table set changes, stops the current tailer at a
batch boundary (everything it read is committed) and starts a new one with the new set from
the committed position: exactly-once resume, as after any restart. A new table's rows before
that position reach the lake through a capture (its ``full_state``), as for any new table.

An invalid new config (unknown table, no primary key, a YAML error) is reported through
``on_notice`` and ignored: the tailer keeps serving the tables it has.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dblog.app.runtime import Runtime
from dblog.core.errors import DblogError
from dblog.core.events import TableId
from dblog.tail import BatchReport, TailSummary

log = logging.getLogger(__name__)


@dataclass
class FollowSummary:
    """What a supervised tail did over all its table sets."""

    batches: int = 0
    events: int = 0
    restarts: int = 0
    tables: tuple[TableId, ...] = ()


def _changed(current: tuple[TableId, ...], wanted: Sequence[TableId]) -> bool:
    return set(current) != set(wanted)


def tail_following_config(
    rt: Runtime,
    configured_tables: Callable[[], Sequence[TableId]],
    *,
    stop: threading.Event,
    on_batch: Callable[[BatchReport], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    check_every_s: float = 5.0,
    lock_timeout: float = 5.0,
    identifier: str | None = None,
) -> FollowSummary:
    """Tail ``rt``'s source until ``stop``, switching table sets as ``configured_tables``
    (re-read every ``check_every_s``) changes. Raises ``LockHeld`` if another tailer runs."""
    notice = on_notice or (lambda text: log.warning("%s", text))
    summary = FollowSummary(tables=tuple(rt.config.table_ids))
    tailer = rt.tailer(tables=summary.tables, on_batch=on_batch)
    with rt.state.tailer_lock(identifier or tailer.identifier, timeout=lock_timeout):
        while not stop.is_set():
            switch_to: list[tuple[TableId, ...]] = []
            inner = threading.Event()
            watcher = threading.Thread(
                target=_watch, name="dblog-config-watch", daemon=True,
                args=(rt, configured_tables, summary.tables, stop, inner, switch_to, notice,
                      check_every_s),
            )
            watcher.start()
            try:
                done: TailSummary = tailer.run_locked(stop=inner)
            finally:
                inner.set()
                watcher.join()
            summary.batches += done.batches
            summary.events += done.events
            if stop.is_set() or not switch_to:
                break
            added = sorted(map(str, set(switch_to[0]) - set(summary.tables)))
            removed = sorted(map(str, set(summary.tables) - set(switch_to[0])))
            summary.tables = switch_to[0]
            summary.restarts += 1
            notice(f"the configured tables changed (added: {', '.join(added) or 'none'}; "
                   f"removed: {', '.join(removed) or 'none'}): tailing "
                   f"{len(summary.tables)} tables from the committed position; capture the "
                   "added tables to bring their full state")
            tailer = rt.tailer(tables=summary.tables, on_batch=on_batch)
    return summary


def _watch(rt: Runtime, configured_tables: Callable[[], Sequence[TableId]],
           current: tuple[TableId, ...], stop: threading.Event, inner: threading.Event,
           switch_to: list[tuple[TableId, ...]], notice: Callable[[str], None],
           every: float) -> None:
    """Set ``inner`` when ``stop`` is set or a valid new table set is configured."""
    reported: str | None = None
    while not inner.is_set():
        if stop.wait(every):
            inner.set()
            return
        try:
            wanted = tuple(configured_tables())
            if not _changed(current, wanted):
                continue
            for table in set(wanted) - set(current):
                rt.dialect.table_schema(table)  # refuses unknown tables and missing keys
        except DblogError as exc:
            text = f"the new configuration is not used, the tailer keeps its tables: {exc}"
            if text != reported:
                notice(text)
                reported = text
            continue
        switch_to.append(wanted)
        inner.set()
        return
