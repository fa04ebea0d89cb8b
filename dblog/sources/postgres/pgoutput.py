"""Parse the messages of PostgreSQL's built-in ``pgoutput`` logical decoding plugin
(protocol version 1: whole transactions, sent at commit).

Pure functions over bytes: no connection, no type conversion. Column values stay the text
the server's output functions produced (``None`` for NULL, :data:`UNCHANGED_TOAST` for a
TOASTed value the update left unchanged and the server did not send).

See https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PG_EPOCH_US = 946_684_800_000_000
"""Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC)."""


class _Unchanged:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _Unchanged()
"""A TOASTed column an UPDATE did not change: its value is not in the message."""

Tuple = tuple[object, ...]
"""One row: per column its text, ``None`` (NULL) or :data:`UNCHANGED_TOAST`."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str
    """``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` index."""
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Insert:
    relation: int
    new: Tuple


@dataclass(frozen=True, slots=True)
class Update:
    relation: int
    old: Tuple | None
    """The old row (replica identity FULL: every column) or its key (``old_is_key``)."""
    old_is_key: bool
    new: Tuple


@dataclass(frozen=True, slots=True)
class Delete:
    relation: int
    old: Tuple
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Other:
    """A message the reader does not act on (origin, type, logical message)."""

    kind: str


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | Other

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")


class ProtocolError(ValueError):
    """A message that does not follow the pgoutput protocol."""


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes, start: int) -> None:
        self.data = data
        self.at = start

    def byte(self) -> str:
        if self.at >= len(self.data):
            raise ProtocolError("message ends early")
        value = chr(self.data[self.at])
        self.at += 1
        return value

    def fixed(self, fmt: struct.Struct) -> int:
        if self.at + fmt.size > len(self.data):
            raise ProtocolError("message ends early")
        (value,) = fmt.unpack_from(self.data, self.at)
        self.at += fmt.size
        return int(value)

    def string(self) -> str:
        end = self.data.find(b"\x00", self.at)
        if end < 0:
            raise ProtocolError("unterminated string")
        value = self.data[self.at:end].decode("utf-8")
        self.at = end + 1
        return value

    def tuple_data(self) -> Tuple:
        count = self.fixed(_I16)
        values: list[object] = []
        data = self.data
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED_TOAST)
            elif kind == "t":
                size = self.fixed(_I32)
                if self.at + size > len(data):
                    raise ProtocolError("column value ends early")
                values.append(data[self.at:self.at + size].decode("utf-8"))
                self.at += size
            else:
                raise ProtocolError(f"column value of kind {kind!r} (binary output is off)")
        return tuple(values)


def parse(data: bytes, start: int = 0) -> Message:
    """One pgoutput message (the one at ``start`` of ``data``, up to its end)."""
    if len(data) <= start:
        raise ProtocolError("empty message")
    r = _Reader(data, start)
    kind = r.byte()
    if kind == "B":
        return Begin(r.fixed(_U64), r.fixed(_I64), r.fixed(_U32))
    if kind == "C":
        r.byte()  # flags, unused
        return Commit(r.fixed(_U64), r.fixed(_U64), r.fixed(_I64))
    if kind == "R":
        oid, namespace, name = r.fixed(_U32), r.string(), r.string()
        identity = r.byte()
        columns = []
        for _ in range(r.fixed(_I16)):
            flags = r.fixed(_I8)
            columns.append(RelationColumn(r.string(), r.fixed(_U32), r.fixed(_I32),
                                          bool(flags & 1)))
        return Relation(oid, namespace, name, identity, tuple(columns))
    if kind == "I":
        oid = r.fixed(_U32)
        if r.byte() != "N":
            raise ProtocolError("insert without a new row")
        return Insert(oid, r.tuple_data())
    if kind == "U":
        oid = r.fixed(_U32)
        marker = r.byte()
        old: Tuple | None = None
        old_is_key = False
        if marker in ("K", "O"):
            old, old_is_key = r.tuple_data(), marker == "K"
            marker = r.byte()
        if marker != "N":
            raise ProtocolError("update without a new row")
        return Update(oid, old, old_is_key, r.tuple_data())
    if kind == "D":
        oid = r.fixed(_U32)
        marker = r.byte()
        if marker not in ("K", "O"):
            raise ProtocolError("delete without an old row")
        return Delete(oid, r.tuple_data(), marker == "K")
    if kind == "T":
        count = r.fixed(_I32)
        options = r.fixed(_I8)
        oids = tuple(r.fixed(_U32) for _ in range(count))
        return Truncate(oids, bool(options & 1), bool(options & 2))
    return Other(kind)


def lsn_text(lsn: int) -> str:
    """PostgreSQL's ``X/X`` form of an LSN."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """An LSN from its ``X/X`` form."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


__all__ = [
    "UNCHANGED_TOAST", "Begin", "Commit", "Delete", "Insert", "Message", "Other",
    "ProtocolError", "Relation", "RelationColumn", "Truncate", "Update", "lsn_text", "parse",
    "parse_lsn",
]
