"""Connection settings, PyMySQL connections and error translation for MariaDB/MySQL."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pymysql

from dblog.core.errors import DblogError, SourceError, SourceUnavailable

# Client-side error codes meaning "cannot reach the server" (CR_* in errmsg.h).
UNREACHABLE_CODES = frozenset({2002, 2003, 2005, 2006, 2013, 2055})
ACCESS_DENIED = 1045
SAME_SERVER_ID = 4052  # MariaDB's ER_SLAVE_SAME_ID


@dataclass(frozen=True)
class MySqlSettings:
    """Where a MariaDB/MySQL source is and how the pipeline logs in.

    ``server_id`` identifies the binlog (replica) connection and must be unique among the
    server's replicas; ``heartbeat_s`` bounds how long an idle log read blocks, and how
    long a read that has something keeps it once the server has nothing more (a lone
    transaction on a quiet log, such as a capture's high watermark, is handed out then).
    """

    name: str
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    server_id: int = 5401
    watermark_database: str = "dblog"
    connect_timeout: float = 10.0
    heartbeat_s: float = 0.05
    read_timeout: float = 60.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def pymysql_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` (and mysql-replication)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "charset": "utf8mb4",
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "write_timeout": self.read_timeout,
        }


class _SteadyTimeoutSocket:
    """A socket whose ``settimeout`` does nothing when the timeout stays the same; every
    other attribute is the socket's own."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._timeout = sock.gettimeout()

    def settimeout(self, value: float | None) -> None:
        if value != self._timeout:
            self._sock.settimeout(value)
            self._timeout = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class LogConnection(pymysql.connections.Connection):  # type: ignore[misc]
    """The binlog connection (``pymysql_wrapper`` of mysql-replication).

    PyMySQL sets its socket's timeout before every packet it reads or writes, and CPython
    gives up the GIL around that call. The binlog is read in a thread of its own, so at
    every packet (several per row event) it waited for the GIL whenever another thread of
    the process was running Python: 14 times slower beside a busy thread, and the tailer's
    writer is one. Here the timeout is set only when it changes (once: reads and writes
    share one timeout); reading the socket still gives the GIL up, once per buffer.
    """

    def connect(self, sock: Any = None) -> None:
        super().connect(sock)
        connected: Any = getattr(self, "_sock", None)
        if connected is not None and not isinstance(connected, _SteadyTimeoutSocket):
            setattr(self, "_sock", _SteadyTimeoutSocket(connected))  # noqa: B010 - untyped base


def translate(exc: BaseException, settings: MySqlSettings, doing: str = "") -> DblogError:
    """Map a PyMySQL error to the engine's errors (one clear line, never the password)."""
    where = f"MariaDB/MySQL at {settings.address}"
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    detail = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    prefix = f"{doing}: " if doing else ""
    if code in UNREACHABLE_CODES or isinstance(exc, OSError | TimeoutError):
        return SourceUnavailable(f"{prefix}cannot reach {where}: {detail}")
    if code == SAME_SERVER_ID:
        return SourceError(
            f"{prefix}{where} ended this binlog connection because another replica connected "
            f"with the same server_id ({settings.server_id}): give each dblog source its own "
            "source.server_id, unused by the server's replicas"
        )
    if code == ACCESS_DENIED:
        return SourceError(
            f"{prefix}access denied for user {settings.user!r} at {settings.address}: "
            "check the user name and password"
        )
    if isinstance(exc, pymysql.err.InterfaceError):
        return SourceUnavailable(f"{prefix}connection to {where} is closed: {detail}")
    suffix = f" (error {code})" if code is not None else ""
    return SourceError(f"{prefix}{where}: {detail}{suffix}")


def connect(settings: MySqlSettings, *, autocommit: bool = True) -> Any:
    """A PyMySQL connection (utf8mb4, session time zone UTC) or a translated error."""
    try:
        return pymysql.connect(
            **settings.pymysql_kwargs(),
            autocommit=autocommit,
            init_command="SET time_zone = '+00:00'",
        )
    except pymysql.MySQLError as exc:
        raise translate(exc, settings, "connect") from None
    except OSError as exc:
        raise translate(exc, settings, "connect") from None
