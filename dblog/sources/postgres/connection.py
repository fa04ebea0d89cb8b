"""Connection settings, psycopg2 connections and error translation for PostgreSQL."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from dblog.core.errors import DblogError, SourceError, SourceUnavailable
from dblog.core.events import TableId
from dblog.sources.postgres.types import SESSION_SETTINGS

_SLOT_CHARS = re.compile(r"[^a-z0-9_]")


def default_slot(source_name: str) -> str:
    """``dblog_<source name>`` in the characters a slot name allows (a-z, 0-9, _)."""
    return ("dblog_" + _SLOT_CHARS.sub("_", source_name.lower()))[:63]


@dataclass(frozen=True)
class PostgresSettings:
    """Where a PostgreSQL source is, how the pipeline logs in, and its replication slot and
    publication (created when missing; the publication lists ``tables`` and the watermark
    table)."""

    name: str
    host: str
    port: int
    user: str
    database: str
    password: str = field(repr=False)
    tables: tuple[TableId, ...] = ()
    watermark_schema: str = "dblog"
    slot: str = ""
    publication: str = ""
    connect_timeout: float = 10.0
    status_interval_s: float = 1.0

    @property
    def slot_name(self) -> str:
        return self.slot or default_slot(self.name)

    @property
    def publication_name(self) -> str:
        return self.publication or default_slot(self.name)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}/{self.database}"

    def options(self) -> str:
        """The ``options`` startup parameter: :data:`SESSION_SETTINGS` for every session."""
        return " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())

    def connect_kwargs(self) -> dict[str, Any]:
        return {
            "host": self.host, "port": self.port, "user": self.user,
            "password": self.password, "dbname": self.database,
            "connect_timeout": max(1, int(self.connect_timeout)),
            "options": self.options(), "application_name": f"dblog-{self.name}",
        }


UNREACHABLE_STATES = frozenset({"08000", "08001", "08003", "08004", "08006", "57P01", "57P02",
                                "57P03"})


def translate(exc: BaseException, settings: PostgresSettings, doing: str = "") -> DblogError:
    """Map a psycopg2 error to the engine's errors (one clear line, never the password)."""
    if isinstance(exc, DblogError):
        return exc
    where = f"PostgreSQL at {settings.address}"
    prefix = f"{doing}: " if doing else ""
    detail = (str(getattr(exc, "pgerror", None) or exc) or type(exc).__name__).strip()
    detail = detail.splitlines()[0] if detail else type(exc).__name__
    # psycopg2's errors carry ``pgcode``, a replication stream's (libpq.StreamError) ``sqlstate``
    code = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)
    if code == "28P01" or "password authentication failed" in detail:
        return SourceError(f"{prefix}access denied for user {settings.user!r} at "
                           f"{settings.address}: check the user name and password")
    if (isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError | OSError)
            and (code is None or code in UNREACHABLE_STATES)):
        return SourceUnavailable(f"{prefix}cannot reach {where}: {detail}")
    suffix = f" (SQLSTATE {code})" if code else ""
    return SourceError(f"{prefix}{where}: {detail}{suffix}")


def connect(settings: PostgresSettings, *, autocommit: bool = True) -> Any:
    """A psycopg2 connection (UTC, ISO dates, hex bytea) or a translated error."""
    try:
        conn = psycopg2.connect(**settings.connect_kwargs())
    except (psycopg2.Error, OSError) as exc:
        raise translate(exc, settings, "connect") from None
    conn.autocommit = autocommit
    return conn


def connect_replication(settings: PostgresSettings) -> Any:
    """A logical replication connection (psycopg2's ``LogicalReplicationConnection``)."""
    try:
        return psycopg2.connect(
            **settings.connect_kwargs(),
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
        )
    except (psycopg2.Error, OSError) as exc:
        raise translate(exc, settings, "opening the replication connection") from None
