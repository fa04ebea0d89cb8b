"""The COPY BOTH stream of a psycopg2 replication connection, read and written through
libpq's own calls.

Why not psycopg2's ``read_message``/``send_feedback``: on each keepalive psycopg2 moves
the position it reports as flushed to the keepalive's WAL end by itself whenever the
position last passed to ``send_feedback`` is at or past the start of the last message
received (``pq_read_replication_message`` in psycopg2 2.9's ``pqpath.c``), and sends it
on the server's request or every status interval. Inside a long transaction the last
message is one of its changes, whose LSN can lie far before the confirmed position while
the keepalive's position lies past transactions the reader read and the lake does not
hold yet: the slot would release them. Here psycopg2 opens the connection and starts
replication; then its ``read_message`` is never called, so it never sends a status update
of its own, and every update the server gets carries the reader's explicit position.

The functions come from the libpq psycopg2 is linked with (``psycopg2._psycopg``'s own
handle resolves them through its dependencies): the connection's ``PGconn`` is that
library's.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any, NoReturn, cast

import psycopg2
import psycopg2._psycopg

_PG_DIAG_SQLSTATE = ord("C")
_PGRES_FATAL_ERROR = 7


class StreamError(psycopg2.OperationalError):  # type: ignore[misc]
    """The replication stream failed or ended (``sqlstate``: the server's error code, if
    it sent one)."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@cache
def _lib() -> Any:
    lib = ctypes.CDLL(psycopg2._psycopg.__file__)
    conn = ctypes.c_void_p
    lib.PQgetCopyData.argtypes = [conn, ctypes.POINTER(ctypes.POINTER(ctypes.c_char)),
                                  ctypes.c_int]
    lib.PQgetCopyData.restype = ctypes.c_int
    lib.PQputCopyData.argtypes = [conn, ctypes.c_char_p, ctypes.c_int]
    lib.PQputCopyData.restype = ctypes.c_int
    lib.PQflush.argtypes = [conn]
    lib.PQflush.restype = ctypes.c_int
    lib.PQconsumeInput.argtypes = [conn]
    lib.PQconsumeInput.restype = ctypes.c_int
    lib.PQfreemem.argtypes = [ctypes.c_void_p]
    lib.PQfreemem.restype = None
    lib.PQerrorMessage.argtypes = [conn]
    lib.PQerrorMessage.restype = ctypes.c_char_p
    lib.PQgetResult.argtypes = [conn]
    lib.PQgetResult.restype = ctypes.c_void_p
    lib.PQresultStatus.argtypes = [ctypes.c_void_p]
    lib.PQresultStatus.restype = ctypes.c_int
    lib.PQresultErrorField.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.PQresultErrorField.restype = ctypes.c_char_p
    lib.PQresultErrorMessage.argtypes = [ctypes.c_void_p]
    lib.PQresultErrorMessage.restype = ctypes.c_char_p
    lib.PQclear.argtypes = [ctypes.c_void_p]
    lib.PQclear.restype = None
    return lib


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace").strip()


class CopyBoth:
    """The CopyData messages of ``conn`` (a psycopg2 connection that started replication)."""

    def __init__(self, conn: Any) -> None:
        self._lib = lib = _lib()
        self._pgconn = ctypes.c_void_p(conn.pgconn_ptr)
        self._buffer = ctypes.POINTER(ctypes.c_char)()
        self._buffer_ref = ctypes.byref(self._buffer)
        self._get, self._free = lib.PQgetCopyData, lib.PQfreemem

    def receive(self) -> bytes | None:
        """The next message, or None when none has arrived (never blocks)."""
        size = self._get(self._pgconn, self._buffer_ref, 1)
        if size == 0:  # nothing buffered: read what the socket holds, without waiting
            if not self._lib.PQconsumeInput(self._pgconn):
                self._failed()
            size = self._get(self._pgconn, self._buffer_ref, 1)
            if size == 0:
                return None
        if size > 0:
            message = cast(bytes, self._buffer[:size])  # a copy; slicing beats string_at
            self._free(self._buffer)
            return message
        if size == -1:
            self._ended()
        self._failed()

    def _failed(self) -> NoReturn:
        raise StreamError(_text(self._lib.PQerrorMessage(self._pgconn)) or "connection lost")

    def _ended(self) -> NoReturn:
        """The server ended the stream: its error, if it sent one."""
        lib, pgconn = self._lib, self._pgconn
        result = lib.PQgetResult(pgconn)
        if not result:
            raise StreamError("the server ended the replication stream")
        try:
            if lib.PQresultStatus(result) == _PGRES_FATAL_ERROR:
                code = _text(lib.PQresultErrorField(result, _PG_DIAG_SQLSTATE)) or None
                raise StreamError(_text(lib.PQresultErrorMessage(result)), code)
        finally:
            lib.PQclear(result)
        raise StreamError("the server ended the replication stream")

    def send(self, message: bytes) -> None:
        """Send one message now (the connection blocks until it is written)."""
        lib, pgconn = self._lib, self._pgconn
        if lib.PQputCopyData(pgconn, message, len(message)) != 1 or lib.PQflush(pgconn) != 0:
            self._failed()
