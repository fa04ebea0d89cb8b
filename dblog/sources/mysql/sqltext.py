"""Safe SQL text for MariaDB/MySQL: quoted identifiers and validated literals.

Spark JDBC's ``query`` option cannot bind parameters, so chunk selects carry values as
literals. Only values whose text cannot be influenced are rendered: integers via ``int``,
finite decimals and floats, strings and bytes as hex literals, dates and datetimes from
their validated ISO form. Anything else is a :class:`ConfigError`.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

from dblog.core.errors import ConfigError
from dblog.core.events import TableId


def quote_ident(name: str) -> str:
    """A backtick-quoted identifier (embedded backticks doubled)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ConfigError(f"invalid SQL identifier {name!r}")
    return "`" + name.replace("`", "``") + "`"


def quote_table(table: TableId) -> str:
    return f"{quote_ident(table.database)}.{quote_ident(table.table)}"


def literal(value: Any) -> str:
    """Render ``value`` as a MariaDB/MySQL literal that cannot change the statement."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ConfigError(f"cannot use {value!r} as a SQL value")
        return format(value, "f")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"cannot use {value!r} as a SQL value")
        return repr(float(value))
    if isinstance(value, str):
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError("cannot use a string with lone surrogates as a SQL value") from None
        return f"_utf8mb4 X'{data.hex()}'"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"X'{bytes(value).hex()}'"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return f"TIMESTAMP'{value.isoformat(sep=' ', timespec='microseconds')}'"
    if isinstance(value, dt.date):
        return f"DATE'{value.isoformat()}'"
    raise ConfigError(f"cannot use a {type(value).__name__} ({value!r}) as a SQL value")
