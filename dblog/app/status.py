"""``dblog status``: per table, capture ranges and chunks done, log position and lag."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from dblog.core.events import TableId, seconds_since_commit
from dblog.tail import MIRROR_DOC

if TYPE_CHECKING:
    from dblog.app.runtime import Runtime


@dataclass
class TableStatus:
    table: TableId
    ranges_done: int = 0
    ranges_total: int = 0
    chunks: int = 0
    rows_emitted: int = 0
    rows_dropped: int = 0
    captures: list[str] = field(default_factory=list)
    rows_deleted: int = 0
    repair_advised: str | None = None
    """A DDL that may have rewritten rows without row events, not yet followed by a finished
    capture of the table."""


@dataclass
class SourceStatus:
    """Everything ``dblog status`` shows, as data (Dagster checks reuse it)."""

    source: str
    position: dict[str, Any] | None
    lsn: int | None
    batch: int | None
    head: dict[str, Any] | None
    lag_bytes: int | None
    """Bytes of source log between the committed position and the head (across binlog
    files); None when unknown (a file in between is gone, or the source cannot tell)."""
    seconds_since_commit: float | None
    """Wall-clock seconds since the tailer last committed a batch."""
    tailer: str | None
    tables: list[TableStatus]
    lag_seconds: float | None = None
    """0 when caught up; else seconds since the source committed the last transaction the
    lake has (an upper bound of the lag); None when that commit time is not recorded."""
    mirror_batch: int | None = None
    """The committed batch every mirror has merged through (None: none recorded yet)."""


def lag_seconds(lag_bytes: int | None, commit_ts_ms: int | None, now_s: float
                ) -> float | None:
    """The lag in time: 0 when nothing is left to read; else the time since the source
    committed the last transaction the lake has (every unread transaction committed later,
    so the true lag is at most this); None when that commit time is unknown."""
    if lag_bytes == 0:
        return 0.0
    since = seconds_since_commit(commit_ts_ms, now_s)
    return None if since is None else max(0.0, since)


def _add_repair_notices(rt: Runtime, tables: dict[TableId, TableStatus]) -> None:
    """Notices the tailer left for DDL that may have rewritten rows, unless a capture of the
    table finished after the DDL was seen."""
    from dblog.tail import NOTICES

    repaired: dict[TableId, int] = {}
    for found in rt.state.list_captures():
        cap = found.value
        if cap.status == "done":
            for t in cap.tables:
                repaired[t] = max(repaired.get(t, 0), cap.updated_at_ms)
    for name in rt.state.children(NOTICES):
        notice = rt.state.get(f"{NOTICES}/{name}")
        if notice is None:
            continue
        table = TableId(*notice.value["table"])
        if repaired.get(table, 0) > int(notice.value.get("noted_at_ms", 0)):
            continue
        ts = tables.setdefault(table, TableStatus(table))
        ts.repair_advised = str(notice.value.get("statement", ""))[:80]


def collect_status(rt: Runtime) -> SourceStatus:
    """Read capture progress and the tailer's position from ZooKeeper, the head from the source."""
    tables = {t: TableStatus(t) for t in rt.config.table_ids}
    for found in rt.state.list_captures():
        cap = found.value
        for range_id, progress in rt.state.list_ranges(cap.capture_id).items():
            del range_id
            ts = tables.setdefault(progress.value.table, TableStatus(progress.value.table))
            ts.ranges_total += 1
            ts.ranges_done += int(progress.value.done)
            ts.chunks += progress.value.chunks_emitted
            ts.rows_emitted += progress.value.rows_emitted
            ts.rows_dropped += progress.value.rows_dropped
            ts.rows_deleted += progress.value.rows_deleted
            if f"{cap.capture_id} ({cap.status})" not in ts.captures:
                ts.captures.append(f"{cap.capture_id} ({cap.status})")
    _add_repair_notices(rt, tables)
    pos = rt.state.get_position()
    head = dict(rt.dialect.head_position())
    lag = None
    since = None
    lag_s = None
    if pos is not None:
        native = pos.value.source_position
        lag = rt.dialect.log_bytes_between(native, head)
        now = time.time()
        since = now - pos.value.updated_at_ms / 1000
        # The source commit time of the last committed transaction, where the tailer
        # records it with the position.
        lag_s = lag_seconds(lag, getattr(pos.value, "commit_ts_ms", None), now)
    mirror = rt.state.get(MIRROR_DOC)
    return SourceStatus(
        source=rt.config.source.name,
        position=dict(pos.value.source_position) if pos else None,
        lsn=pos.value.position.lsn if pos else None,
        batch=pos.value.batch if pos else None,
        head=head,
        lag_bytes=lag,
        seconds_since_commit=since,
        tailer=rt.state.lock_holder(),
        tables=list(tables.values()),
        lag_seconds=lag_s,
        mirror_batch=int(mirror.value["batch"]) if mirror is not None else None,
    )


def render_status(rt: Runtime, console: Console | None = None) -> SourceStatus:
    status = collect_status(rt)
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)  # pipes and logs: never wrap table names
    console.print(f"[bold]source[/bold] {status.source}  tailer: {status.tailer or 'not running'}")
    console.print(
        f"log position {status.position} (batch {status.batch}), head {status.head}, "
        f"lag {status.lag_bytes if status.lag_bytes is not None else '?'} bytes"
        f" / {f'{status.lag_seconds:.0f}' if status.lag_seconds is not None else '?'}s, "
        f"last commit {status.seconds_since_commit or 0:.0f}s ago, mirrors merged through "
        f"batch {status.mirror_batch if status.mirror_batch is not None else '-'}"
    )
    grid = Table("table", "ranges", "progress", "chunks", "rows emitted", "dropped", "deleted",
                 "captures")
    for ts in status.tables:
        total = max(ts.ranges_total, 1)
        grid.add_row(
            str(ts.table), f"{ts.ranges_done}/{ts.ranges_total}",
            ProgressBar(total=total, completed=ts.ranges_done, width=20),
            str(ts.chunks), str(ts.rows_emitted), str(ts.rows_dropped), str(ts.rows_deleted),
            ", ".join(ts.captures) or "-",
        )
    console.print(grid)
    for ts in status.tables:
        if ts.repair_advised is not None:
            console.print(f"[yellow]repair advised[/yellow] {ts.table}: "
                          f"{ts.repair_advised!r} may have changed rows without row events; "
                          f"run `dblog capture {ts.table}`")
    return status
