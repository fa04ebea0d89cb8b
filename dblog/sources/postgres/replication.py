"""The streaming replication protocol's CopyData messages around the ``pgoutput`` ones:
XLogData and the server's keepalives (received), the standby status update (sent).

Pure functions over bytes. See
https://www.postgresql.org/docs/15/protocol-replication.html ("START_REPLICATION").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from dblog.sources.postgres.pgoutput import PG_EPOCH_US, ProtocolError

XLOG_DATA_HEADER = 1 + 8 + 8 + 8
"""``w``, the data's start LSN, the server's WAL end, its clock: the payload follows."""

_KEEPALIVE = struct.Struct(">cQqB")
_STATUS = struct.Struct(">cQQQqB")


@dataclass(frozen=True, slots=True)
class Keepalive:
    """The server's primary keepalive message."""

    wal_end: int
    """The walsender's position: the end of the last WAL record it decoded (and sent, if
    it held a change of the publication), or of a transaction it skipped whole."""
    reply_requested: bool


XLOG_DATA = ord("w")
"""The first byte of an XLogData message (its ``pgoutput`` message starts at
:data:`XLOG_DATA_HEADER`); every other message the server sends is a keepalive."""


def parse_keepalive(message: bytes) -> Keepalive:
    if message[:1] != b"k" or len(message) < _KEEPALIVE.size:
        raise ProtocolError(f"not a keepalive message: {message[:1]!r}, {len(message)} bytes")
    _, wal_end, _, reply = _KEEPALIVE.unpack_from(message)
    return Keepalive(int(wal_end), bool(reply))


def standby_status(*, confirmed: int, now_us: int, reply: bool = False) -> bytes:
    """A standby status update reporting ``confirmed`` as written, flushed and applied
    (``now_us``: microseconds since the Unix epoch). A logical slot's server takes the
    flushed position as the slot's confirmed one; 0 leaves the slot where it is."""
    return _STATUS.pack(b"r", confirmed, confirmed, confirmed, now_us - PG_EPOCH_US,
                        1 if reply else 0)


__all__ = ["XLOG_DATA", "XLOG_DATA_HEADER", "Keepalive", "parse_keepalive", "standby_status"]
