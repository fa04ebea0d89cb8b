"""What a capture is asked to do and how it runs: the request, the options, a range's
report, and the names of its ranges in ZooKeeper."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dblog.app.config import CAPTURE_DEFAULTS
from dblog.core.errors import ConfigError
from dblog.core.events import Key, TableId

LOOK_S = 1.0
"""A capture waiting for its window's pin or outcome reads them when their ZooKeeper watches
fire, and at least this often (a watch lost with an expired session)."""



@dataclass(frozen=True)
class CaptureOptions:
    """How a capture runs; the sizing defaults are the configuration's (``CaptureConfig``)."""

    chunk_size: int = CAPTURE_DEFAULTS.chunk_size
    """Rows of a range's first chunk (``chunk_sizes`` per table)."""
    chunk_max_rows: int = CAPTURE_DEFAULTS.chunk_max_rows
    """Chunks grow (2x-8x, toward the target) up to this while one takes under half
    ``chunk_target_seconds``."""
    chunk_target_seconds: float = CAPTURE_DEFAULTS.chunk_target_seconds
    max_in_flight: int = CAPTURE_DEFAULTS.max_in_flight
    parallel_ranges: int = CAPTURE_DEFAULTS.parallel_ranges
    """Ranges of a capture that run at once (:meth:`Capturer.run`)."""
    read_partitions: int = CAPTURE_DEFAULTS.read_partitions
    """A chunk of ``read_partitions * read_partition_rows`` rows or more is read by this
    many selects at once, each over its own key range (planned first)."""
    read_partition_rows: int = CAPTURE_DEFAULTS.read_partition_rows
    """A chunk is split into read partitions of at least this many rows."""
    max_rows_per_s: float | None = CAPTURE_DEFAULTS.max_rows_per_s
    """Rows a second the capture reads at most, all ranges of the process together (None:
    no limit); chunks then ask for at most ``chunk_target_seconds`` of them."""
    poll_seconds: float = 0.1
    """How often a waiting capture checks for a stop and the tailer's health; it reads the
    window's pin and outcome when their ZooKeeper watches fire (or every ``LOOK_S``)."""
    emission_timeout_s: float = 600.0
    position_timeout_s: float = 120.0
    """How long a range waits for the tailer's first committed position before it starts."""
    chunk_sizes: dict[TableId, int] = field(default_factory=dict)
    outage_patience_s: float = 120.0
    """How long a capture retries while the source or ZooKeeper cannot be reached."""


@dataclass(frozen=True)
class CaptureRequest:
    """What to capture: tables, optionally only some primary keys or a WHERE filter."""

    tables: tuple[TableId, ...]
    keys: tuple[Key, ...] | None = None
    where: str | None = None

    def __post_init__(self) -> None:
        if not self.tables:
            raise ConfigError("a capture needs at least one table")
        if self.keys is not None and len(self.tables) != 1:
            raise ConfigError("--keys selects rows of exactly one table")
        if self.where is not None and not self.where.strip():
            raise ConfigError("--where must not be empty")


@dataclass
class RangeReport:
    """How one range went (Dagster materialization metadata)."""

    capture_id: str
    range_id: str
    table: TableId
    status: str = "running"
    chunks: int = 0
    rows_selected: int = 0
    rows_emitted: int = 0
    rows_dropped: int = 0
    rows_deleted: int = 0
    """Mirror rows a complete chunk read proved gone from the source (written as deletes)."""
    retries: int = 0
    first_lsn: int | None = None
    last_lsn: int | None = None
    seconds: float = 0.0


def range_id_for(table: TableId, index: int) -> str:
    digest = hashlib.sha1(f"{table.database}\0{table.table}".encode()).hexdigest()[:12]
    return f"{digest}-{index:05d}"


def plan_request(tables: Sequence[str], keys: Sequence[str] | None, where: str | None
                 ) -> CaptureRequest:
    """Build a request from CLI-style strings (keys as comma-separated values per key)."""
    parsed = tuple(TableId.parse(t) for t in tables)
    key_tuples = None
    if keys:
        key_tuples = tuple(tuple(_literal(v) for v in k.split(",")) for k in keys)
    return CaptureRequest(parsed, key_tuples, where)


def _literal(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text

