"""Committed transactions from the MariaDB/MySQL binlog.

mysql-replication holds the binlog connection and parses the rarer events; the events of row
transactions are read from their bytes by :mod:`dblog.sources.mysql.dumpstream` and their
row images by :mod:`dblog.sources.mysql.rowimage`.

The reader keeps one blocking binlog connection with a short server heartbeat, so
:meth:`MySqlLogReader.read` returns within about ``max_wait_s`` (+ one heartbeat). Rows are
buffered until their transaction commits (XID event or COMMIT query); a partial transaction
survives between calls. A connection lost while reading (errors 2013/2006) is re-opened by
the stream at the last event's position, as mysql-replication does; any other failure drops
the partial transaction, and the next call reconnects at the last transaction boundary, so
nothing is lost or repeated.

Row images are decoded with the columns of the TABLE_MAP event that precedes them
(``binlog_row_metadata=FULL``: names, signedness, ENUM/SET values, primary key), never from
``information_schema``: a reader behind a DDL still decodes old rows with the old columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pymysql
from pymysqlreplication.constants import NONE_SOURCE
from pymysqlreplication.event import (
    ExecuteLoadQueryEvent,
    FormatDescriptionEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    StopEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from dblog.core.errors import ConfigError, DblogError, LogPurgedError, SourceError
from dblog.core.events import ChangeEvent, Op, Position, TableId, WatermarkEvent
from dblog.sources.base import (
    Column,
    LogItem,
    SchemaChange,
    TableSchema,
    Transaction,
    UnloggedChange,
)
from dblog.sources.mysql.cascades import CascadeGraph, cascade_reason
from dblog.sources.mysql.connection import LogConnection, MySqlSettings, translate
from dblog.sources.mysql.dumpstream import (
    DumpStream,
    RawGtid,
    RawHeartbeat,
    RawRows,
    RawXid,
)
from dblog.sources.mysql.rowimage import ImageReader, compile_reader, full_bitmap
from dblog.sources.mysql.schema import no_primary_key
from dblog.sources.mysql.statements import statement_effect
from dblog.sources.mysql.types import Converter, binlog_converter, from_binlog_column

ONLY_EVENTS = [
    QueryEvent, XidEvent, RotateEvent, FormatDescriptionEvent, TableMapEvent, WriteRowsEvent,
    UpdateRowsEvent, DeleteRowsEvent, MariadbGtidEvent, HeartbeatLogEvent, StopEvent,
    XAPrepareEvent, NotImplementedEvent, PartialUpdateRowsEvent, ExecuteLoadQueryEvent,
]
UNREADABLE_EVENTS = {
    **{code: "a compressed binlog event: set log_bin_compress=OFF on the server"
       for code in range(165, 172)},  # MariaDB QUERY_COMPRESSED .. *_ROWS_COMPRESSED_V1
    40: "a compressed transaction payload: set binlog_transaction_compression=OFF",
    39: "a partial JSON update: set binlog_row_value_options='' on the server",
    26: "an INCIDENT event (the server may have lost changes it could not log)",
}
"""Events mysql-replication cannot decode (or that mean the log is incomplete): the reader
stops at them instead of skipping them, since a skipped event is a lost change."""
FL_STANDALONE = 0x01  # MariaDB GTID event flag: the group has no COMMIT/XID
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
WATERMARK_TABLE = "watermark"


def binlog_file_index(name: str) -> int:
    """The numeric suffix of a binlog file name (``mysql-bin.000042`` -> 42)."""
    _, dot, suffix = name.rpartition(".")
    if not dot or not suffix.isascii() or not suffix.isdigit():
        raise ConfigError(f"not a binlog file name: {name!r}")
    return int(suffix)


def native_position(native: Mapping[str, Any]) -> tuple[str, int]:
    """Validate a ``{"file": ..., "pos": ...}`` binlog position."""
    try:
        file, pos = native["file"], native["pos"]
    except (KeyError, TypeError):
        raise ConfigError(f"binlog position needs 'file' and 'pos': {native!r}") from None
    if not isinstance(file, str) or not isinstance(pos, int) or isinstance(pos, bool):
        raise ConfigError(f"binlog position needs a file name and an offset: {native!r}")
    binlog_file_index(file)
    if not 4 <= pos < 2**32:
        raise ConfigError(f"binlog offset out of range: {pos}")
    return file, pos


def _binlog_index(name: str) -> int | None:
    _, dot, suffix = name.rpartition(".")
    return int(suffix) if dot and suffix.isascii() and suffix.isdigit() else None


def binlog_lag_bytes(
    position: Mapping[str, Any], head: Mapping[str, Any], logs: Sequence[tuple[str, int]]
) -> int | None:
    """Bytes of binlog from ``position`` to ``head`` (both ``{"file", "pos"}``).

    ``logs`` are the server's binlog files and sizes in order (SHOW BINARY LOGS, listed
    after the head was read). Across files: the rest of the position's file, every file in
    between, and the head's file up to the head. None when a file of the span is not
    listed (purged, or a reset log) or the position is past the head.
    """
    try:
        file, pos = str(position["file"]), int(position["pos"])
        head_file, head_pos = str(head["file"]), int(head["pos"])
    except (KeyError, TypeError, ValueError):
        return None
    if file == head_file:
        return head_pos - pos if head_pos >= pos else None
    names = [name for name, _ in logs]
    if file not in names or head_file not in names:
        return None
    first, last = names.index(file), names.index(head_file)
    here_index, head_index = _binlog_index(file), _binlog_index(head_file)
    if first > last or here_index is None or head_index is None or here_index > head_index:
        return None
    size = int(logs[first][1])
    if pos > size:
        return None
    return (size - pos) + sum(int(s) for _, s in logs[first + 1:last]) + head_pos


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to decode rows of one TABLE_MAP: the schema and per-column converters."""

    table: TableId
    schema: TableSchema
    columns: tuple[tuple[str, Converter | None, bool], ...]  # name, converter, is SET
    watermark: bool
    image: ImageReader | None
    """The compiled reader of full row images (None: mysql-replication decodes them)."""
    full: bytes
    """The columns-present bitmap of a full image."""


def _decode(plan: _Plan, values: Mapping[str, Any], none_sources: Mapping[str, str]
            ) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name, conv, is_set in plan.columns:
        value = values[name]
        if value is None:
            if is_set and none_sources.get(name) == NONE_SOURCE.EMPTY_SET:
                value = ""
        elif conv is not None:
            value = conv(value)
        row[name] = value
    return row


def plan_from_table_map(event: Any, table: TableId, watermark: bool, *,
                        keyed: bool = True) -> _Plan:
    """Schema and converters from a TABLE_MAP event's own column metadata (``keyed``: a
    tracked table, which must have a primary key; a watched parent need not)."""
    where = f"binlog table map of {table}"
    columns: list[Column] = []
    decoders: list[tuple[str, Converter | None, bool]] = []
    mask = event.null_bitmask
    for i, col in enumerate(event.columns):
        if not col.name:
            raise SourceError(
                f"{where} has no column names: set binlog_row_metadata=FULL on the server"
            )
        st = from_binlog_column(col, f"{where} column {col.name!r}")
        nullable = bool(mask[i // 8] & (1 << (i % 8)))
        columns.append(Column(col.name, st.spark_type, nullable, st.name))
        conv = binlog_converter(st, col.set_values or ())
        decoders.append((col.name, conv, st.base == "set"))
    meta = event.optional_metadata
    indexes = list(meta.simple_primary_key_list or []) or list(meta.primary_keys_with_prefix)
    key = tuple(event.columns[i].name for i in indexes)
    if not key and not watermark and keyed:
        raise no_primary_key(table)
    schema = TableSchema(table, tuple(columns), key)
    image = compile_reader(event.columns, [conv for _, conv, _ in decoders])
    return _Plan(table, schema, tuple(decoders), watermark, image, full_bitmap(len(columns)))


def _present(names: Sequence[str], bitmap: bytes) -> set[str]:
    """The columns a columns-present bitmap marks."""
    return {name for i, name in enumerate(names) if bitmap[i // 8] & (1 << (i % 8))}


def _partial(plan: _Plan, event: Any) -> bool:
    """Whether a library ROWS event's images lack some of the table map's columns."""
    if event.columns_present_bitmap != plan.full:
        return True
    return isinstance(event, UpdateRowsEvent) and event.columns_present_bitmap2 != plan.full


def partial_image_reason(table: TableId, where: str) -> str:
    """What a partial row image means, and how to avoid it."""
    return (f"the row images at {where} hold only some of {table}'s columns: the session "
            "that wrote them had binlog_row_image MINIMAL or NOBLOB (dblog needs FULL), so "
            "the new values of the rows are not in the log. Keep binlog_row_image=FULL in "
            "every session: a session needs SUPER or BINLOG ADMIN to change it, so revoke "
            "those from the application's users")


def statement_dml_reason(where: str, query: str) -> str:
    """What a DML logged as text means, and how to avoid it."""
    return (f"the statement at {where} ({query[:120]!r}) was logged as text, without row "
            "events: the session that ran it had binlog_format STATEMENT or MIXED (dblog "
            "needs ROW), so the rows it changed are not in the log. Keep binlog_format=ROW "
            "in every session: a session needs SUPER or BINLOG ADMIN to change it, so revoke "
            "those from the application's users")


def _compiled(plan: _Plan, event: Any, update: bool) -> bytes | None:
    """The rows part of a library event when the compiled reader can decode it (full
    images)."""
    if (plan.image is None or not event.complete
            or event.columns_present_bitmap != plan.full
            or (update and event.columns_present_bitmap2 != plan.full)):
        return None
    body: bytes = event.packet.read(event.event_size - event.packet.read_bytes)
    return body


def _compiled_raw(plan: _Plan, event: RawRows) -> bool:
    """Whether the images of a raw ROWS event are full ones of the table map's columns
    (what the compiled reader, when the plan has one, decodes)."""
    return (event.columns == len(plan.columns) and event.present == plan.full
            and (event.present_before is None or event.present_before == plan.full))


def read_images(read: ImageReader, body: bytes) -> list[dict[str, Any]]:
    """Every row image of a WRITE or DELETE event's rows part."""
    pos, end, rows = 0, len(body), []
    while pos < end:
        row, pos = read(body, pos)
        rows.append(row)
    return rows


def read_image_pairs(read: ImageReader, body: bytes
                     ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (before, after) image pair of an UPDATE event's rows part."""
    pos, end, rows = 0, len(body), []
    while pos < end:
        before, pos = read(body, pos)
        after, pos = read(body, pos)
        rows.append((before, after))
    return rows


def row_images(plan: _Plan, event: Any) -> list[dict[str, Any]]:
    """The decoded rows of a library WRITE or DELETE rows event."""
    body = _compiled(plan, event, False)
    if body is None:
        return [_decode(plan, row["values"], row["none_sources"]) for row in event.rows]
    assert plan.image is not None
    return read_images(plan.image, body)


def update_images(plan: _Plan, event: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The decoded (before, after) rows of a library UPDATE rows event."""
    body = _compiled(plan, event, True)
    if body is None:
        return [(_decode(plan, row["before_values"], row["before_none_sources"]),
                 _decode(plan, row["after_values"], row["after_none_sources"]))
                for row in event.rows]
    assert plan.image is not None
    return read_image_pairs(plan.image, body)


class MySqlLogReader:
    """A :class:`dblog.sources.base.LogReader` over one server's binlog."""

    def __init__(
        self, settings: MySqlSettings, start: Mapping[str, Any], tables: Iterable[TableId],
        *, raw_events: bool = True, cascades: Callable[[], CascadeGraph] | None = None,
    ) -> None:
        """``raw_events=False`` has mysql-replication parse every event (the reader is
        then slower; tests compare both ways). ``cascades`` reads the foreign keys whose
        actions reach the tracked tables (:mod:`dblog.sources.mysql.cascades`): the
        reader watches their parents' row events, and reads the keys again after a DDL."""
        file, pos = native_position(start)
        self._settings = settings
        self._raw_events = raw_events
        self._tracked = frozenset(tables)
        self._load_cascades = cascades
        self._cascades = cascades() if cascades is not None else CascadeGraph()
        self._cascades_stale = False
        self._watermark = TableId(settings.watermark_database, WATERMARK_TABLE)
        self._boundary: dict[str, Any] = {"file": file, "pos": pos}
        self._file = file
        self._file_index = binlog_file_index(file)
        self._stream: DumpStream | None = None
        self._plans: dict[int, _Plan | None] = {}
        self._plan_cache: dict[tuple[Any, ...], _Plan] = {}
        self._closed = False
        self._reset_transaction()

    @property
    def resume(self) -> dict[str, Any]:
        """The position after the last complete transaction read (returned or skipped)."""
        return dict(self._boundary)

    def _reset_transaction(self) -> None:
        self._in_txn = False
        self._standalone = False
        self._buffer: list[tuple[Any, ...]] = []
        self._touched: dict[TableId, TableSchema] = {}
        self._cascaded: set[TableId] = set()
        """Tracked tables a cascade of this transaction reached (noted once each)."""

    def _open_stream(self) -> DumpStream:
        tables = self._tracked | self._cascades.parents | {self._watermark}
        kwargs = self._settings.pymysql_kwargs()
        return DumpStream(
            raw_events=self._raw_events,
            connection_settings=kwargs,
            pymysql_wrapper=LogConnection,
            server_id=self._settings.server_id,
            log_file=self._boundary["file"],
            log_pos=self._boundary["pos"],
            resume_stream=True,
            blocking=True,
            slave_heartbeat=self._settings.heartbeat_s,
            only_events=ONLY_EVENTS,
            filter_non_implemented_events=False,  # see UNREADABLE_EVENTS
            only_tables=sorted({t.table for t in tables}),
            only_schemas=sorted({t.database for t in tables}),
            # is_mariadb=True would make mysql-replication ignore log_file/log_pos (it then
            # dumps from the first binlog); the MySQL COM_BINLOG_DUMP path works on MariaDB.
            is_mariadb=False,
            enable_logging=False,
            use_column_name_cache=False,
            # Skip re-parsing a TABLE_MAP whose table id is known (the slowest part of the
            # library). Safe: a table gets a new id whenever its definition is reloaded (any
            # DDL), and the library forgets all ids at each real rotation (server restart).
            freeze_schema=True,
        )

    def _drop_stream(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # closing a broken connection
                pass
        self._stream = None
        self._file = self._boundary["file"]
        self._file_index = binlog_file_index(self._file)
        self._reset_transaction()

    def _translate(self, exc: BaseException) -> DblogError:
        if isinstance(exc, DblogError):
            return exc
        where = f"{self._boundary['file']}:{self._boundary['pos']}"
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if code == ER_MASTER_FATAL_ERROR_READING_BINLOG:
            text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
            if "purged" in text.lower() or "could not find first log file" in text.lower():
                return LogPurgedError(
                    f"binlog position {where} is no longer on {self._settings.address} "
                    f"({text}): run `dblog tail --from-head`, then `dblog capture` to re-snapshot"
                )
        if isinstance(exc, pymysql.MySQLError | OSError):
            return translate(exc, self._settings, f"reading the binlog at {where}")
        return SourceError(
            f"reading the binlog at {where} failed: {type(exc).__name__}: {exc}"
        )

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        """Up to ``max_transactions`` committed transactions touching the tracked tables
        or the watermark table. Returns early once the server is idle (heartbeat) and
        something was read; otherwise waits at most about ``max_wait_s``."""
        if self._closed:
            raise SourceError("the binlog reader is closed")
        out: list[Transaction] = []
        if max_transactions <= 0:
            return out
        deadline = time.monotonic() + max(0.0, max_wait_s)
        try:
            if self._stream is None:
                self._stream = self._open_stream()
            while len(out) < max_transactions and time.monotonic() < deadline:
                event = self._stream.next_event()
                if event is None:  # the server ended the dump: reconnect next time
                    self._drop_stream()
                    break
                if isinstance(event, HeartbeatLogEvent | RawHeartbeat):
                    if out:  # the server is idle: nothing more to wait for
                        break
                    continue
                txn = self._handle(event)
                if txn is not None:
                    out.append(txn)
                if self._cascades_stale and not self._in_txn:
                    if self._reload_cascades():
                        break  # the stream is reopened at the boundary with the new tables
        except Exception as exc:  # translated below
            self._drop_stream()
            if out:  # deliver what is complete; the error recurs on the next call
                return out
            raise self._translate(exc) from exc
        return out

    def close(self) -> None:
        self._closed = True
        self._drop_stream()

    def _reload_cascades(self) -> bool:
        """Read the foreign keys again (after a DDL, at a transaction boundary); True when
        the watched parents changed: then the stream is dropped, to be opened again with
        them at the boundary."""
        self._cascades_stale = False
        if self._load_cascades is None:
            return False
        graph = self._load_cascades()
        moved = graph.parents != self._cascades.parents
        self._cascades = graph
        if moved:
            self._drop_stream()
            self._plans.clear()
        return moved
    # -- event handling ---------------------------------------------------------------

    def _handle(self, event: Any) -> Transaction | None:
        kind = type(event)
        if kind is RawRows:
            self._in_txn = True
            self._on_raw_rows(event)
            return None
        if kind is RawXid:
            return self._commit(event.log_pos, event.timestamp)
        if kind is RawGtid:
            self._begin_group(event.flags)
            return None
        if isinstance(event, NotImplementedEvent | PartialUpdateRowsEvent):
            self._refuse_unreadable(event)
            return None
        if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            if not self._in_txn:
                self._in_txn = True
            self._on_rows(event)
            return None
        if isinstance(event, TableMapEvent):
            self._on_table_map(event)
            return None
        if isinstance(event, XidEvent):
            return self._commit(int(event.packet.log_pos), event.timestamp)
        if isinstance(event, MariadbGtidEvent):
            self._begin_group(event.flags)
            return None
        if isinstance(event, QueryEvent):
            return self._on_query(event)
        if isinstance(event, ExecuteLoadQueryEvent):
            return self._on_load_query(event)
        if isinstance(event, RotateEvent):
            moved = event.next_binlog != self._file
            self._file = event.next_binlog
            self._file_index = binlog_file_index(self._file)
            if moved or event.timestamp != 0:
                # Table ids hold within one binlog file: a restarted server numbers its
                # tables anew in the file it begins (the stream forgets them too).
                self._plans.clear()
            if event.timestamp != 0:  # a real rotation (not the dump's first event)
                if not self._in_txn:
                    self._boundary = {"file": self._file, "pos": int(event.position)}
            return None
        if isinstance(event, XAPrepareEvent):
            if self._buffer:
                raise SourceError(
                    "an XA transaction changed captured tables; XA is not supported"
                )
            self._boundary = {"file": self._file, "pos": int(event.packet.log_pos)}
            self._reset_transaction()
        return None

    def _refuse_unreadable(self, event: Any) -> None:
        why = UNREADABLE_EVENTS.get(int(event.event_type))
        if why is not None:
            at = int(event.packet.log_pos) - int(event.packet.event_size)
            raise SourceError(
                f"the binlog at {self._file}:{at} "
                f"holds {why}; the reader stopped there instead of skipping it. After fixing "
                "the setting, run `dblog tail --from-head`, then `dblog capture` to re-snapshot"
            )

    def _on_table_map(self, event: Any) -> None:
        table = TableId(event.schema, event.table)
        watermark = table == self._watermark
        if not watermark and table not in self._tracked and table not in self._cascades.parents:
            self._plans[event.table_id] = None
            return
        cols = event.columns
        signature = (
            table, bytes(event.null_bitmask),
            tuple((c.name, c.type, c.unsigned, c.character_set_name,
                   tuple(c.set_values or ()), getattr(c, "max_length", None),
                   getattr(c, "length_size", None), getattr(c, "fsp", None),
                   getattr(c, "precision", None), getattr(c, "decimals", None),
                   getattr(c, "bits", None)) for c in cols),
            tuple(event.optional_metadata.simple_primary_key_list or ()),
            tuple(event.optional_metadata.primary_keys_with_prefix or ()),
        )
        plan = self._plan_cache.get(signature)
        if plan is None:
            plan = plan_from_table_map(event, table, watermark,
                                       keyed=table in self._tracked)
            if len(self._plan_cache) > 1000:
                self._plan_cache.clear()
            self._plan_cache[signature] = plan
        self._plans[event.table_id] = plan

    def _on_rows(self, event: Any) -> None:
        """A ROWS event parsed by mysql-replication."""
        plan = self._plans.get(event.table_id)
        if plan is None:
            return
        self._check_columns(plan, int(event.number_of_columns))
        offset = int(event.packet.log_pos)
        if not plan.watermark and _partial(plan, event):
            self._take_partial(plan, event, offset)
            return
        if isinstance(event, UpdateRowsEvent):
            self._take_rows(plan, "u", offset, update_images(plan, event))
        elif isinstance(event, WriteRowsEvent):
            self._take_rows(plan, "w", offset, row_images(plan, event))
        elif not plan.watermark:
            self._take_rows(plan, "d", offset, row_images(plan, event))

    def _on_raw_rows(self, event: RawRows) -> None:
        """A ROWS event read by its header: the compiled reader decodes its rows, or the
        library does when the images are not full ones of the table map's columns."""
        plan = self._plans.get(event.table_id)
        if plan is None:
            return
        if plan.image is None or not _compiled_raw(plan, event):
            assert self._stream is not None
            parsed = self._stream.library_event(event)
            if parsed is None:
                raise SourceError(
                    f"the rows event at {self._file}:{event.log_pos} of {plan.table} "
                    "could not be parsed"
                )
            self._on_rows(parsed)
            return
        if event.kind == "u":
            self._take_rows(plan, "u", event.log_pos, read_image_pairs(plan.image, event.body))
        elif event.kind == "w" or not plan.watermark:
            self._take_rows(plan, event.kind, event.log_pos, read_images(plan.image, event.body))

    def _take_partial(self, plan: _Plan, event: Any, offset: int) -> None:
        """A ROWS event whose images hold only some columns (``binlog_row_image`` MINIMAL
        or NOBLOB in the session that wrote it). A delete's key is all it needs: it is
        buffered as a delete (its before image holds NULL in the columns the image lacks).
        An insert's or update's new row is unknown: its key is buffered as an unlogged
        change (healed by a capture of it), and an update that moved its key deletes the
        old one. Without the key columns, the whole table is unlogged."""
        names = [name for name, _, _ in plan.columns]
        key = plan.schema.key
        update = isinstance(event, UpdateRowsEvent)
        before_cols = _present(names, event.columns_present_bitmap)
        after_cols = _present(names, event.columns_present_bitmap2) if update else before_cols
        position_of = partial(Position.from_binlog, self._file_index, offset)
        images = []
        for row in event.rows:
            if update:
                images.append((_decode(plan, row["before_values"], row["before_none_sources"]),
                               _decode(plan, row["after_values"], row["after_none_sources"])))
            else:
                image = _decode(plan, row["values"], row["none_sources"])
                images.append((image, image))
        if plan.table in self._cascades.by_parent:
            kind = "u" if update else "d" if isinstance(event, DeleteRowsEvent) else "w"
            # An image without a referenced column counts as changing it.
            rows: Sequence[Any] = images
            if not update:
                rows = [b for b, _ in images]
            self._note_cascades(plan, kind, offset, rows)
        if plan.table not in self._tracked:
            return
        seq, changed, whole = 0, [], False
        for before, after in images:
            if not set(key) <= before_cols:
                whole = True
                continue
            old = tuple(before[k] for k in key)
            if isinstance(event, DeleteRowsEvent):
                new = None
            else:
                new = tuple(after[k] if k in after_cols else before[k] for k in key)
            if update and new != old or isinstance(event, DeleteRowsEvent):
                self._touched[plan.table] = plan.schema
                self._buffer.append(("c", plan.table, Op.DELETE, old, before, None,
                                     position_of(seq)))
                seq += 1
            if new is not None:
                changed.append(new)
        if whole or changed:
            reason = partial_image_reason(plan.table, f"{self._file}:{offset}")
            self._buffer.append(("x", plan.table, None if whole else tuple(changed), reason,
                                 position_of(seq)))

    def _note_cascades(self, plan: _Plan, kind: str, offset: int, images: Sequence[Any]
                       ) -> None:
        """A parent's ROWS event: the tracked tables a foreign-key action of it reaches
        are buffered as unlogged changes (once per transaction each)."""
        reached = self._cascades.affected(plan.table, kind, images) - self._cascaded
        if not reached:
            return
        self._cascaded |= reached
        where = f"{self._file}:{offset}"
        reason = cascade_reason(plan.table, reached, where)
        for table in sorted(reached, key=str):
            self._buffer.append(("x", table, None, reason,
                                 Position.from_binlog(self._file_index, offset)))

    def _check_columns(self, plan: _Plan, columns: int) -> None:
        if columns != len(plan.columns):
            raise SourceError(
                f"rows event for {plan.table} has {columns} columns, its "
                f"table map {len(plan.columns)}"
            )

    def _take_rows(self, plan: _Plan, kind: str, offset: int, images: Sequence[Any]) -> None:
        """Buffer the changes (or watermarks) of one ROWS event: ``images`` are row images
        (``w``, ``d``) or (before, after) pairs (``u``)."""
        lsn_index = self._file_index
        seq = 0
        if plan.watermark:  # a watermark is written or updated, never read from a delete
            for image in images:
                values = image[1] if kind == "u" else image
                value = values.get("value")
                if value is not None:
                    position = Position.from_binlog(lsn_index, offset, seq)
                    self._buffer.append(("w", str(value), position))
                    seq += 1
            return
        if plan.table in self._cascades.by_parent:
            self._note_cascades(plan, kind, offset, images)
        if plan.table not in self._tracked:
            return
        self._touched[plan.table] = plan.schema
        key_names = plan.schema.key
        table = plan.table
        buffer = self._buffer
        if kind == "u":
            for before, after in images:
                old_key = tuple(before[k] for k in key_names)
                new_key = tuple(after[k] for k in key_names)
                if old_key == new_key:
                    position = Position.from_binlog(lsn_index, offset, seq)
                    buffer.append(("c", table, Op.UPDATE, new_key, before, after, position))
                    seq += 1
                else:
                    position = Position.from_binlog(lsn_index, offset, seq)
                    buffer.append(("c", table, Op.DELETE, old_key, before, None, position))
                    position = Position.from_binlog(lsn_index, offset, seq + 1)
                    buffer.append(("c", table, Op.CREATE, new_key, None, after, position))
                    seq += 2
            return
        create = kind == "w"
        for image in images:
            key = tuple(image[k] for k in key_names)
            position = Position.from_binlog(lsn_index, offset, seq)
            if create:
                buffer.append(("c", table, Op.CREATE, key, None, image, position))
            else:
                buffer.append(("c", table, Op.DELETE, key, image, None, position))
            seq += 1

    def _on_query(self, event: Any) -> Transaction | None:
        query = str(event.query)
        word = query.strip().rstrip(";").strip().upper()
        if word == "BEGIN":
            self._reset_transaction()
            self._in_txn = True
            return None
        if word == "COMMIT":
            return self._commit(int(event.packet.log_pos), event.timestamp)
        if word == "ROLLBACK":
            self._boundary = {"file": self._file, "pos": int(event.packet.log_pos)}
            self._reset_transaction()
            return None
        default_db = event.schema.decode("utf-8", "replace") if event.schema else ""
        return self._on_statement(event, query, default_db)

    def _on_load_query(self, event: Any) -> Transaction | None:
        """A LOAD DATA logged as its statement (binlog_format=STATEMENT, or MIXED): the
        rows it loaded are in no row event. mysql-replication reads the event's fixed
        fields; its default database and statement text follow, as in a Query event."""
        rest = event.packet.read(event.event_size - 26)  # after the 26-byte post-header
        at = int(event.status_vars_length)
        default_db = rest[at:at + int(event.schema_length)].decode("utf-8", "replace")
        query = rest[at + int(event.schema_length) + 1:].decode("utf-8", "replace")
        return self._on_statement(event, query, default_db)

    def _on_statement(self, event: Any, query: str, default_db: str) -> Transaction | None:
        """A statement's event (Query or Execute_load_query): what it does is buffered, and
        outside a transaction it is one of its own."""
        self._take_statement(query, default_db, int(event.packet.log_pos))
        if self._in_txn and not self._standalone:
            return None
        return self._commit(int(event.packet.log_pos), event.timestamp)

    def _take_statement(self, query: str, default_db: str, offset: int) -> None:
        """Buffer what a statement (a Query event's text) does to tracked tables: schema
        changes (emptied or rewritten tables among them), or, for a DML logged as text, an
        unlogged change of every tracked table it names."""
        effect = statement_effect(query, default_db)
        if effect.dml:
            hits = [t for t in effect.rewrites if t in self._tracked]
            where = f"{self._file}:{offset}"
            for seq, table in enumerate(sorted(hits, key=str)):
                position = Position.from_binlog(self._file_index, offset, seq)
                self._buffer.append(("x", table, None, statement_dml_reason(where, query),
                                     position))
            return
        if effect.tables or effect.databases:
            self._cascades_stale = True  # read the foreign keys again after it
            self._note_dropped_foreign_keys(effect.tables, query, offset)
        hits = [t for t in effect.tables if t in self._tracked]
        hits += sorted((t for t in self._tracked
                        if t.database in effect.databases and t not in hits), key=str)
        for seq, table in enumerate(dict.fromkeys(hits)):
            position = Position.from_binlog(self._file_index, offset, seq)
            resets = table in effect.resets or table.database in effect.databases
            self._buffer.append(("s", SchemaChange(table, query, position, resets,
                                                   table in effect.rewrites)))

    def _note_dropped_foreign_keys(self, tables: Sequence[TableId], query: str,
                                   offset: int) -> None:
        """A DDL that may drop a cascading foreign key of ``tables``: the tracked tables
        it reached are healed (a reader opened after the DDL read the rows before it with
        the keys as they are now, without that one)."""
        words = [w.upper() for w in query.split()]
        drops = any(w == "DROP" and nxt in ("FOREIGN", "CONSTRAINT")
                    for w, nxt in zip(words, words[1:], strict=False))
        if not drops:
            return
        reached: set[TableId] = set()
        for table in tables:
            # The key may be gone from the graph already (read after the DDL): the table
            # itself, if tracked, and what it reaches now.
            reached |= {table} & self._tracked
            reached |= self._cascades.reaches.get(table, frozenset())
        if reached:
            reason = (f"{query[:120]!r} at {self._file}:{offset} may have dropped a foreign "
                      "key whose ON DELETE/ON UPDATE action changed rows before it")
            for table in sorted(reached, key=str):
                self._buffer.append(("x", table, None, reason,
                                     Position.from_binlog(self._file_index, offset)))

    def _begin_group(self, gtid_flags: int) -> None:
        """A MariaDB GTID event: a new event group (transaction) starts."""
        self._reset_transaction()
        self._in_txn = True
        self._standalone = bool(gtid_flags & FL_STANDALONE)

    def _commit(self, offset: int, timestamp: int) -> Transaction | None:
        self._boundary = {"file": self._file, "pos": offset}
        buffer, touched = self._buffer, self._touched
        self._reset_transaction()
        if not buffer:
            return None
        ts = int(timestamp) * 1000
        items: list[LogItem] = []
        for entry in buffer:
            kind = entry[0]
            if kind == "c":
                _, table, op, key, before, after, position = entry
                items.append(ChangeEvent(table=table, op=op, key=key, position=position,
                                         before=before, after=after, commit_ts_ms=ts))
            elif kind == "w":
                items.append(WatermarkEvent(entry[1], entry[2], ts))
            elif kind == "x":
                _, table, keys, reason, position = entry
                items.append(UnloggedChange(table, position, reason, keys))
            else:
                items.append(entry[1])
        return Transaction(
            items=tuple(items),
            resume=dict(self._boundary),
            position=Position.from_binlog(self._file_index, offset),
            commit_ts_ms=ts,
            schemas=touched,
        )
