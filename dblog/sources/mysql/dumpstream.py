"""The binlog dump stream, with the events of a row transaction read straight from its bytes.

mysql-replication builds, for every binlog event, a packet wrapper and an event object whose
constructor parses the event through many small reads (and asks the control connection which
server it is, every time). For an OLTP stream of single-row transactions that was about 40%
of the log reader's time, more than decoding the rows. :class:`DumpStream` keeps the
library's connection handling and its parsing of every other event, and reads these itself:

* a ROWS event (v1: MariaDB's) of a table the library has a table map for: only its header
  (table id, column count, columns-present bitmaps) is read, the rows are left as bytes for
  the compiled row-image reader; :meth:`DumpStream.library_event` still gives the library's
  event for rows the compiled reader does not read;
* XID, MariaDB GTID and heartbeat events: the few fields the reader uses;
* a TABLE_MAP of a table id the library already maps (``freeze_schema``): skipped, as the
  library skips it.

Everything the library does per event that the reader relies on is kept: its position for
its own reconnects (lost connection), its table map (cleared whenever the stream moves to
another binlog file: table ids start over when a server restarts), the
server version and post-header lengths of the FORMAT_DESCRIPTION.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.binlogstream import MYSQL_EXPECTED_ERROR_CODES
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.packet import BinLogPacketWrapper

ROWS_V1 = {BINLOG.WRITE_ROWS_EVENT_V1: "w", BINLOG.UPDATE_ROWS_EVENT_V1: "u",
           BINLOG.DELETE_ROWS_EVENT_V1: "d"}
"""ROWS event types read here, and what they do (v2 events, MySQL's, go to the library)."""
ROWS_V1_POST_HEADER = 8  # table id (6), flags (2)
_HEADER = struct.Struct("<xIBIIIH")  # OK byte, then the 19-byte event header
_HEADER_END = 20
_PRIVATE = "_BinLogStreamReader__"

# The Raw* events are built once per binlog event and read once: plain slotted classes,
# since a frozen dataclass's __init__ costs six times as much (~3.7 against 0.6 us).


@dataclass(slots=True)
class RawRows:
    """A ROWS event read by its header only: the rows are still bytes."""

    kind: str
    """``w`` (write), ``u`` (update: before and after images) or ``d`` (delete)."""
    table_id: int
    columns: int
    present: bytes
    """The columns-present bitmap (of the after image, for an update)."""
    present_before: bytes | None
    """For an update, the columns-present bitmap of the before image."""
    body: bytes
    """The row images."""
    log_pos: int
    packet: Any
    """The packet, for :meth:`DumpStream.library_event`."""


@dataclass(slots=True)
class RawXid:
    """The XID event that commits a transaction."""

    log_pos: int
    timestamp: int


@dataclass(slots=True)
class RawGtid:
    """A MariaDB GTID event (the start of an event group)."""

    flags: int


@dataclass(slots=True)
class RawHeartbeat:
    """The server's heartbeat: it has nothing to send."""


HEARTBEAT = RawHeartbeat()


def _length_coded(data: bytes, pos: int) -> tuple[int, int] | None:
    """A length-coded integer at ``pos`` and the offset after it (None: NULL marker)."""
    first = data[pos]
    if first < 251:
        return first, pos + 1
    if first == 252:
        return int.from_bytes(data[pos + 1:pos + 3], "little"), pos + 3
    if first == 253:
        return int.from_bytes(data[pos + 1:pos + 4], "little"), pos + 4
    if first == 254:
        return int.from_bytes(data[pos + 1:pos + 9], "little"), pos + 9
    return None


class DumpStream(BinLogStreamReader):  # type: ignore[misc]
    """mysql-replication's stream with :meth:`next_event` reading the common events itself.

    It reads the library's private state (name-mangled attributes of ``BinLogStreamReader``)
    the way its own ``fetchone`` does; mysql-replication's version is pinned in
    ``pyproject.toml``, and ``tests/integration/test_dumpstream.py`` reads the same binlog
    both ways and compares every transaction."""

    table_map: dict[int, Any]
    mysql_version: Any
    log_file: Any
    log_pos: Any

    def __init__(self, *args: Any, raw_events: bool = True, **kwargs: Any) -> None:
        """``raw_events=False``: the library parses every event (for comparison)."""
        super().__init__(*args, **kwargs)
        self._raw_events = raw_events
        self._checksum_bytes = 0
        """The CRC32 at the end of every event (when the server writes checksums)."""
        self._rows_v1_post_header = True
        """Whether the FORMAT_DESCRIPTION gives ROWS v1 events the post-header read here."""

    def _private(self, name: str) -> Any:
        """A private attribute of the library's ``BinLogStreamReader``."""
        return getattr(self, _PRIVATE + name)

    def next_event(self) -> Any:
        """The next event the reader wants: a ``Raw*`` event, or the library's event for
        any other; None when the server ended the dump (the stream is then closed)."""
        while True:
            if not self._private("connected_stream"):
                self._private("connect_to_stream")()
                self._checksum_bytes = 4 if self._private("use_checksum") else 0
            if not self._private("connected_ctl"):
                self._private("connect_to_ctl")()
            try:
                pkt = self._stream_connection._read_packet()
            except pymysql.OperationalError as error:
                if error.args and error.args[0] in MYSQL_EXPECTED_ERROR_CODES:
                    # As the library does: reconnect at the last event's position.
                    self._stream_connection.close()
                    setattr(self, _PRIVATE + "connected_stream", False)
                    continue
                raise
            if pkt.is_eof_packet():
                self.close()
                return None
            if not pkt.is_ok_packet():
                continue
            event = self._read_raw(pkt)
            if event is not None:
                if event is not _SKIP:
                    return event
                continue
            event = self._library_read(pkt)
            if event is not None:
                return event

    def library_event(self, raw: RawRows) -> Any:
        """The library's event for a ROWS event read raw (its rows decoded by the library)."""
        pkt = raw.packet
        pkt._position = 0
        return self._wrap(pkt).event

    # -- raw events -------------------------------------------------------------------

    def _read_raw(self, pkt: Any) -> Any:
        """A ``Raw*`` event, ``_SKIP`` for an event the library would skip, or None when the
        library is to read this one."""
        data: bytes = pkt._data
        if not self._raw_events or len(data) < _HEADER_END:
            return None
        timestamp, event_type, _, event_size, log_pos, _ = _HEADER.unpack_from(data)
        if event_size != len(data) - 1:
            return None  # not the event its header describes: the library reads it
        kind = ROWS_V1.get(event_type)
        if kind is not None:
            return self._raw_rows(pkt, data, kind, log_pos)
        if event_type == BINLOG.TABLE_MAP_EVENT:
            if self._private("freeze_schema") and self._table_id(data) in self.table_map:
                self._advance(log_pos)
                return _SKIP
            return None
        if event_type == BINLOG.XID_EVENT:
            self._advance(log_pos)
            return RawXid(log_pos, timestamp)
        if event_type == BINLOG.MARIADB_GTID_EVENT:
            if len(data) < _HEADER_END + 13:
                return None
            self._advance(log_pos)
            return RawGtid(data[_HEADER_END + 12])
        if event_type == BINLOG.HEARTBEAT_LOG_EVENT:
            self._advance(log_pos)
            return HEARTBEAT
        return None

    def _raw_rows(self, pkt: Any, data: bytes, kind: str, log_pos: int) -> Any:
        if not self._rows_v1_post_header:
            return None  # a post-header this reader does not know: the library reads it
        table_id = self._table_id(data)
        if table_id not in self.table_map:  # a table the library filtered out
            self._advance(log_pos)
            return _SKIP
        end = len(data) - self._checksum_bytes
        coded = _length_coded(data, _HEADER_END + ROWS_V1_POST_HEADER)
        if coded is None:
            return None
        columns, pos = coded
        width = (columns + 7) // 8
        present_before = None
        if kind == "u":
            present_before, pos = data[pos:pos + width], pos + width
        present, pos = data[pos:pos + width], pos + width
        if pos > end:
            return None
        self._advance(log_pos)
        return RawRows(kind, table_id, columns, present, present_before, data[pos:end],
                       log_pos, pkt)

    @staticmethod
    def _table_id(data: bytes) -> int:
        return int.from_bytes(data[_HEADER_END:_HEADER_END + 6], "little")

    def _advance(self, log_pos: int) -> None:
        if log_pos:
            self.log_pos = log_pos

    # -- the library's events -----------------------------------------------------------

    def _wrap(self, pkt: Any) -> BinLogPacketWrapper:
        return BinLogPacketWrapper(
            pkt, self.table_map, self._ctl_connection, self.mysql_version,
            self._private("use_checksum"),
            self._private("allowed_events_in_packet"),
            self._private("only_tables"),
            self._private("ignored_tables"),
            self._private("only_schemas"),
            self._private("ignored_schemas"),
            self._private("freeze_schema"),
            self._private("ignore_decode_errors"),
            self._private("verify_checksum"),
            self._private("optional_meta_data"),
            self._private("enable_logging"),
            self._private("use_column_name_cache"),
            self._private("post_header_lengths"),
        )

    def _library_read(self, pkt: Any) -> Any:
        """The library's ``fetchone`` for one packet (without its end position and
        skip-to-timestamp options, which dblog does not use): the event, or None."""
        wrapped = self._wrap(pkt)
        event = wrapped.event
        if wrapped.event_type == BINLOG.ROTATE_EVENT:
            # Table ids hold within one binlog file. The library forgets them at a real
            # rotation only; but a restarted server begins a new file, numbering its tables
            # anew, and the dump enters it with a fake rotation (timestamp 0). A fake
            # rotation to the file being read (a reconnect, maybe mid-transaction) keeps them.
            if wrapped.timestamp != 0 or event.next_binlog != self.log_file:
                self.table_map = {}
            self.log_pos = event.position
            self.log_file = event.next_binlog
        elif wrapped.log_pos:
            self.log_pos = wrapped.log_pos
        if wrapped.event_type == BINLOG.FORMAT_DESCRIPTION_EVENT and event is not None:
            self.mysql_version = event.mysql_version
            lengths = event.post_header_len
            setattr(self, _PRIVATE + "post_header_lengths", lengths)
            self._rows_v1_post_header = not lengths or all(
                len(lengths) < kind or lengths[kind - 1] == ROWS_V1_POST_HEADER
                for kind in ROWS_V1)
        if wrapped.event_type == BINLOG.TABLE_MAP_EVENT and event is not None:
            self.table_map[event.table_id] = event.get_table()
        if event is None or event.__class__ not in self._private("allowed_events"):
            return None
        return event


_SKIP: Any = object()
