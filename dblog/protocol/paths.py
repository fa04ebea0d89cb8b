"""Every ZooKeeper path dblog uses, below one source's root (``<root>/<source>/``).

One place, so that what the capture, the tailer, the state store and the operators' tools
read and write can be seen at once (docs/design.md: "Exactly-once and crash safety")::

    position                    the committed log position (PositionState)
    batch-intent                what the batch being written holds, and its write attempts
    tailer-lock/                the tailer lock (kazoo's lock recipe: one child per contender)
    windows/<window>            a chunk window (WindowState)
    captures/<id>               a capture (CaptureState)
    captures/<id>/ranges/<r>    a capture range's progress (RangeProgress)
    captures/<id>/bounds/<r>    a range's upper bound, fixed before its first chunk
    chunks/<window>             a chunk's description, with its holder, pin and files
    mirror                      the position every mirror has merged through
    notices/<table digest>      a notice about a table (rows changed without row events)
    heals/<table digest>        a heal request for a table
"""

from __future__ import annotations

import hashlib

from dblog.core.events import TableId

POSITION = "position"
BATCH_INTENT = "batch-intent"
TAILER_LOCK = "tailer-lock"
WINDOWS = "windows"
CAPTURES = "captures"
CHUNKS = "chunks"
"""Where a capture describes each chunk before its high watermark."""
MIRROR_DOC = "mirror"
"""The committed position every mirror has merged through."""
NOTICES = "notices"
"""Per-table notices (a DDL that may have rewritten rows)."""
HEALS = "heals"
"""Heal requests, one per table."""


def table_digest(table: TableId) -> str:
    """A name ZooKeeper accepts for any table."""
    return hashlib.sha1(f"{table.database}\0{table.table}".encode()).hexdigest()[:16]


def window_path(window_id: str) -> str:
    return f"{WINDOWS}/{window_id}"


def capture_path(capture_id: str) -> str:
    return f"{CAPTURES}/{capture_id}"


def range_path(capture_id: str, range_id: str) -> str:
    return f"{capture_path(capture_id)}/ranges/{range_id}"


def bounds_path(capture_id: str, range_id: str) -> str:
    """Where a range notes that its upper bound was fixed (and to what)."""
    return f"{capture_path(capture_id)}/bounds/{range_id}"


def chunk_path(window_id: str) -> str:
    """The chunk description of ``window_id`` (the handoff's nodes are its children)."""
    return f"{CHUNKS}/{window_id}"


def notice_path(table: TableId) -> str:
    """Where the notice about ``table`` is kept."""
    return f"{NOTICES}/{table_digest(table)}"


def heal_path(table: TableId) -> str:
    """Where ``table``'s heal request is kept."""
    return f"{HEALS}/{table_digest(table)}"
