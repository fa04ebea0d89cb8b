"""``dblog status``: per table, capture ranges and chunks done, log position and lag."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from pipeline.events import TableId

if TYPE_CHECKING:
    from pipeline.runtime import Runtime


@dataclass
class TableStatus:
    table: TableId
    ranges_done: int = 0
    ranges_total: int = 0
    chunks: int = 0
    rows_emitted: int = 0
    rows_dropped: int = 0
    captures: list[str] = field(default_factory=list)


@dataclass
class SourceStatus:
    """Everything ``dblog status`` shows, as data (Dagster checks reuse it)."""

    source: str
    position: dict[str, Any] | None
    lsn: int | None
    batch: int | None
    head: dict[str, Any] | None
    lag_bytes: int | None
    seconds_since_commit: float | None
    tailer: str | None
    tables: list[TableStatus]


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
            if f"{cap.capture_id} ({cap.status})" not in ts.captures:
                ts.captures.append(f"{cap.capture_id} ({cap.status})")
    pos = rt.state.get_position()
    head = dict(rt.dialect.head_position())
    lag = None
    since = None
    if pos is not None:
        head_pos = rt.dialect.to_position(head)
        here = rt.dialect.to_position(pos.value.source_position)
        same_file = head_pos.lsn >> 32 == here.lsn >> 32
        lag = head_pos.lsn - here.lsn if same_file else None
        since = time.time() - pos.value.updated_at_ms / 1000
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
        f"lag {status.lag_bytes if status.lag_bytes is not None else '?'} bytes, "
        f"last commit {status.seconds_since_commit or 0:.0f}s ago"
    )
    grid = Table("table", "ranges", "progress", "chunks", "rows emitted", "dropped", "captures")
    for ts in status.tables:
        total = max(ts.ranges_total, 1)
        grid.add_row(
            str(ts.table), f"{ts.ranges_done}/{ts.ranges_total}",
            ProgressBar(total=total, completed=ts.ranges_done, width=20),
            str(ts.chunks), str(ts.rows_emitted), str(ts.rows_dropped),
            ", ".join(ts.captures) or "-",
        )
    console.print(grid)
    return status
