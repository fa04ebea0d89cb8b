"""Telling a passing outage (the source or ZooKeeper restarting, a network cut) from a real
failure, and riding one out for a bounded time."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dblog.core.errors import SourceUnavailable
from dblog.state import StateUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

_JAVA_UNREACHABLE = (
    "java.net.ConnectException", "java.net.SocketException", "java.io.EOFException",
    "java.net.SocketTimeoutException", "java.net.NoRouteToHostException",
    "java.sql.SQLTransientConnectionException",
    "java.sql.SQLNonTransientConnectionException",
)
_TEXT_UNREACHABLE = re.compile(
    r"java\.net\.ConnectException|Connection refused|Communications link failure|"
    r"Socket fail to connect|SQLNonTransientConnectionException|"
    r"An I/O error occurred while sending to the backend|This connection has been closed|"
    r"terminating connection due to administrator command|"
    r"the database system is (?:starting up|shutting down)")


def _java_chain(exc: BaseException) -> list[Any]:
    """The Java exception behind a Py4J/PySpark error and its causes (empty if none)."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    chain: list[Any] = []
    while java is not None and len(chain) < 20:
        chain.append(java)
        try:
            java = java.getCause()
        except Exception:  # noqa: BLE001 - the JVM side went away: stop walking
            break
    return chain


def unreachable(exc: BaseException) -> str | None:
    """Why ``exc`` means "cannot reach the source or ZooKeeper" (one line), or ``None``.

    The JDBC drivers report a lost or refused connection as SQLState class 08 (the SQL
    standard's "connection exception") or as a socket exception, whichever the database."""
    if isinstance(exc, SourceUnavailable | StateUnavailable):
        return str(exc)
    for java in _java_chain(exc):
        try:
            name = str(java.getClass().getName())
        except Exception:  # noqa: BLE001 - the JVM side went away
            break
        state = None
        if "SQL" in name:
            try:
                state = java.getSQLState()
            except Exception:  # noqa: BLE001 - not an SQLException after all
                state = None
        if name in _JAVA_UNREACHABLE or (isinstance(state, str) and state.startswith("08")):
            try:
                message = str(java.getMessage() or "")
            except Exception:  # noqa: BLE001
                message = ""
            return f"{name}: {message}".strip(": ")
    match = _TEXT_UNREACHABLE.search(str(exc))
    return match.group(0) if match else None


def ride_out(call: Callable[[], T], *, patience_s: float, what: str,
             stop: threading.Event | None = None, pause_s: float = 2.0) -> T:
    """``call()``, called again while it fails with an outage, for up to ``patience_s``
    seconds in a row; then the outage error with ``what`` to do about it."""
    first: float | None = None
    while True:
        began = time.monotonic()
        try:
            return call()
        except Exception as exc:
            reason = unreachable(exc)
            if reason is None:
                raise
            now = time.monotonic()
            if first is None or now - began > 4 * pause_s:
                first = now  # a new outage: the call had been working meanwhile
            if now - first >= patience_s or (stop is not None and stop.is_set()):
                raise SourceUnavailable(
                    f"{reason} (for {now - first:.0f}s); {what}") from exc
            log.warning("%s; retrying for up to %.0fs more", reason,
                        patience_s - (now - first))
            if stop is not None:
                stop.wait(pause_s)
            else:
                time.sleep(pause_s)
