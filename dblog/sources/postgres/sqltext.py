"""Safe SQL text for PostgreSQL: quoted identifiers and literals that cannot change a
statement (Spark JDBC's ``query`` option cannot bind parameters).

Strings are Unicode-escaped literals (``U&'a\0027b'``): only ASCII letters and digits stay
as they are, every other character is an escape, so no quote or backslash can end the
literal (every session runs with ``standard_conforming_strings = on``, which ``U&`` needs).
Such a literal has no type of its own, so PostgreSQL reads it with the compared column's
input function: a uuid, enum, interval, time, unconstrained numeric or char(n) key (a
string in the lake) compares in its own type's order. Bytes travel as hex digits; numbers
are rendered from validated Python values, dates and timestamps from their ISO form.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

from dblog.core.errors import ConfigError
from dblog.core.events import TableId


def quote_ident(name: str) -> str:
    """A double-quoted identifier (embedded double quotes doubled)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ConfigError(f"invalid SQL identifier {name!r}")
    return '"' + name.replace('"', '""') + '"'


def quote_table(table: TableId) -> str:
    return f"{quote_ident(table.database)}.{quote_ident(table.table)}"


def unicode_literal(text: str) -> str:
    """``text`` as an untyped ``U&'...'`` literal of ASCII letters, digits and escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("cannot use a string with lone surrogates as a SQL value") from None
    if "\x00" in text:
        raise ConfigError("cannot use a string with a NUL character as a SQL value")
    out = []
    for ch in text:
        code = ord(ch)
        if ch.isascii() and ch.isalnum():
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\{code:04X}")
        else:
            out.append(f"\\+{code:06X}")
    return "U&'" + "".join(out) + "'"


def literal(value: Any) -> str:
    """Render ``value`` as a PostgreSQL literal that cannot change the statement."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"({int(value)})"
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ConfigError(f"cannot use {value!r} as a SQL value")
        return f"({format(value, 'f')}::numeric)"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"cannot use {value!r} as a SQL value")
        return f"({float(value)!r}::float8)"
    if isinstance(value, str):
        return unicode_literal(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return f"decode('{bytes(value).hex()}', 'hex')"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            text = value.astimezone(dt.UTC).isoformat(sep=" ", timespec="microseconds")
            return f"('{text}'::timestamptz)"
        return f"('{value.isoformat(sep=' ', timespec='microseconds')}'::timestamp)"
    if isinstance(value, dt.date):
        return f"('{value.isoformat()}'::date)"
    raise ConfigError(f"cannot use a {type(value).__name__} ({value!r}) as a SQL value")
