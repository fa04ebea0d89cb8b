"""The high-watermark handoff: a chunk's rows reach the changelog written once.

A capture selects a chunk between its low and high watermark and keeps the rows in Spark
(a local checkpoint). At the high watermark the tailer knows everything the chunk's
changelog rows carry: the position (the high watermark's), the batch and write attempt that
will commit them, and the keys the window saw change (dropped from the chunk). It *pins*
the window with those; the capture writes the rows as final changelog files (uncommitted,
so invisible) and publishes their Delta ``add`` actions; the tailer commits them with its
batch, a commit that moves no data. ZooKeeper nodes, under the source's root::

    chunks/<window>            the chunk's description (capture, before its high watermark)
    chunks/<window>/holder     ephemeral: the capture holds the selected rows
    chunks/<window>/pin        the tailer's pin (:class:`ChunkPin`, without the keys)
    chunks/<window>/pin-<i>    the pin's dropped keys, in parts under ZooKeeper's 1 MB
    chunks/<window>/files      the capture's files for a pin (:class:`ChunkFiles`)

A holder that disappears before its files are published (the capture died) makes the
tailer abort the window; the capture selects the chunk again when resumed. Files written
for an earlier write attempt (the tailer died before its commit) are read again and
rewritten with the new attempt's tags: the rows are the same, since the high watermark's
position and the dropped keys come from the log.
"""

from __future__ import annotations

import json

from dblog.core.events import Key, TableId, key_from_json, key_to_json
from dblog.protocol.chunks import (
    ChunkDescription,
    ChunkFiles,
    ChunkPin,
    columns_from_json,
    columns_to_json,
)
from dblog.protocol.paths import CHUNKS, chunk_path
from dblog.state import ChangeSignal, StateStore

__all__ = [
    "CHUNKS",
    "ChunkDescription",
    "ChunkFiles",
    "ChunkPin",
    "chunk_path",
    "columns_from_json",
    "columns_to_json",
    "describe_chunk",
    "read_description",
    "hold",
    "is_held",
    "read_files",
    "read_pin",
    "release",
    "watch_files",
    "watch_pin",
    "write_files",
    "write_pin",
]

KEYS_PART_BYTES = 400_000
"""At most this much JSON of dropped keys per znode (ZooKeeper's limit is 1 MB)."""


def describe_chunk(state: StateStore, window_id: str, description: ChunkDescription) -> None:
    """Write the chunk's description (before its high watermark)."""
    state.put(chunk_path(window_id), description.to_json(), None)


def read_description(state: StateStore, table: TableId, window_id: str
                     ) -> ChunkDescription | None:
    """The chunk's description, or None (never written: its capture died first)."""
    found = state.get(chunk_path(window_id))
    return None if found is None else ChunkDescription.from_json(table, found.value)


def hold(state: StateStore, window_id: str) -> None:
    """Say this process holds the chunk's selected rows (until it ends or releases)."""
    state.hold(f"{chunk_path(window_id)}/holder")


def release(state: StateStore, window_id: str) -> None:
    """The rows are no longer held (published, or the window settled)."""
    state.delete(f"{chunk_path(window_id)}/holder")


def is_held(state: StateStore, window_id: str) -> bool:
    """Whether a live capture holds the chunk's selected rows."""
    return state.exists(f"{chunk_path(window_id)}/holder")


def watch_files(state: StateStore, window_id: str, signal: ChangeSignal) -> None:
    """Notify ``signal`` when the chunk's files are next published, its holder goes away,
    or its window changes (emitted, aborted, forgotten): what a tailer waiting for the
    files reads again."""
    base = chunk_path(window_id)
    state.watch([f"{base}/files", f"{base}/holder"], signal)
    state.watch_window(window_id, signal)


def watch_pin(state: StateStore, window_id: str, signal: ChangeSignal) -> None:
    """Notify ``signal`` when the window is next pinned (again) or changes: what a
    capture holding the chunk's rows reads again."""
    state.watch([f"{chunk_path(window_id)}/pin"], signal)
    state.watch_window(window_id, signal)


def write_pin(state: StateStore, pin: ChunkPin) -> None:
    """Pin the window: the dropped keys in parts first, then the pin naming them."""
    base = chunk_path(pin.window_id)
    parts: list[list[object]] = [[]]
    size = 0
    for key in pin.dropped_keys:
        encoded = key_to_json(key)
        length = len(json.dumps(encoded, default=str)) + 2
        if size + length > KEYS_PART_BYTES and parts[-1]:
            parts.append([])
            size = 0
        parts[-1].append(encoded)
        size += length
    for i, keys in enumerate(parts):
        state.put(f"{base}/pin-{i}", {"attempt": pin.attempt, "keys": keys}, None)
    state.put(f"{base}/pin", {
        "batch": pin.batch, "attempt": pin.attempt, "lsn": pin.lsn, "seq": pin.seq,
        "commit_ts_ms": pin.commit_ts_ms, "parts": len(parts),
        "dropped": len(pin.dropped_keys),
    }, None)


def read_pin(state: StateStore, window_id: str) -> ChunkPin | None:
    """The window's pin, or None (not pinned yet, or a new pin being written: ask again)."""
    base = chunk_path(window_id)
    found = state.get(f"{base}/pin")
    if found is None:
        return None
    doc = found.value
    keys: list[Key] = []
    for i in range(int(doc["parts"])):
        part = state.get(f"{base}/pin-{i}")
        if part is None or part.value.get("attempt") != doc["attempt"]:
            return None
        keys += [k for k in (key_from_json(v) for v in part.value["keys"]) if k is not None]
    if len(keys) != int(doc["dropped"]):
        return None
    again = state.get(f"{base}/pin")
    if again is None or again.version != found.version:
        return None  # re-pinned while read
    commit_ts = doc.get("commit_ts_ms")
    return ChunkPin(window_id, int(doc["batch"]), str(doc["attempt"]), int(doc["lsn"]),
                    int(doc["seq"]), None if commit_ts is None else int(commit_ts), tuple(keys))


def write_files(state: StateStore, files: ChunkFiles) -> None:
    """Publish the capture's files for a pin (replacing files of an earlier pin)."""
    state.put(f"{chunk_path(files.window_id)}/files", {
        "batch": files.batch, "attempt": files.attempt, "table_id": files.table_id,
        "actions": list(files.actions), "rows": files.rows, "selected": files.selected,
    }, None)


def pending_chunk_tables(state: StateStore) -> set[TableId] | None:
    """The tables with chunk files a capture published and no batch has committed yet (a
    window still registered); None when such files belong to a window no longer known
    (any table may then hold them)."""
    tables: set[TableId] = set()
    for window_id in state.children(CHUNKS):
        if read_files(state, window_id) is None:
            continue
        window = state.get_window(window_id)
        if window is None:
            return None
        if window.value.status == "registered":
            tables.add(window.value.window.table)
    return tables


def read_files(state: StateStore, window_id: str) -> ChunkFiles | None:
    """The files last published for the window, or None."""
    found = state.get(f"{chunk_path(window_id)}/files")
    if found is None:
        return None
    doc = found.value
    return ChunkFiles(window_id, int(doc["batch"]), str(doc["attempt"]), str(doc["table_id"]),
                      tuple(str(a) for a in doc["actions"]), int(doc["rows"]),
                      int(doc["selected"]))

