"""DATE, DATETIME and TIMESTAMP values in a chunk select, sent as numbers.

A chunk select sends a temporal column as the server's own number for it,
``CAST(column AS SIGNED)`` (``YYYYMMDD`` for a DATE, ``YYYYMMDDhhmmss`` for a DATETIME or a
TIMESTAMP in the session's time zone, UTC; fractions truncated), and ``MICROSECOND(column)``
beside it when the column has fractional seconds. The fields are exactly the stored ones,
whatever the value: a zero date is 0, a partial zero date ('2020-00-15') keeps its zero
month, an invalid date stored under ALLOW_INVALID_DATES ('2020-02-31') keeps its day.
Spark turns the numbers into the canonical DATE, TIMESTAMP_NTZ or TIMESTAMP with integer
arithmetic, and a value the lake cannot hold (year 0, a zero field, a day past its month's
end) becomes NULL, as the log decodes it.

Formatting the value as text on the server (``DATE_FORMAT``) cost MariaDB most of a chunk
select's work beyond the bare columns; the numbers cost it about what the bare columns do,
and Spark's arithmetic about what parsing the text did (a 1M-row select of the capture
bench's table, a DATETIME(6) and a DATE among its ten columns: MariaDB 0.51-0.54 CPU-s
against 0.82-0.91, the bare columns 0.45; the JVM's CPU the same). ``TO_DAYS`` and
``TO_SECONDS`` would be as cheap but move an invalid date to a valid one ('2020-02-31' is
March 2nd to them).

The SQL here is Spark SQL over a JDBC column's positional name (``_c<i>``, never a source
identifier).
"""

from __future__ import annotations

import re

_SPARK_NAME = re.compile(r"_c\d+")
"""A JDBC column's positional name: the only names the SQL here refers to."""

_MICROS_PER_DAY = 86_400_000_000
_LEAP_DAYS_BEFORE_1970 = 477
"""Leap days in years 1-1969 of the proleptic Gregorian calendar (492 - 19 + 4)."""
_DAYS_BEFORE_MONTH = "0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334"
"""Days before each month's first in a common year."""


def chunk_select_sql(base: str, precision: int, quoted: str) -> tuple[str, ...]:
    """The MariaDB expressions a chunk select sends for a temporal column ``quoted``."""
    if base not in ("date", "datetime", "timestamp"):
        raise ValueError(f"not a temporal type: {base!r}")
    number = f"CAST({quoted} AS SIGNED)"
    if base == "date" or precision == 0:
        return (number,)
    return (number, f"MICROSECOND({quoted})")


def field_sql(base: str, number: str) -> dict[str, str]:
    """Spark SQL of the calendar fields in the JDBC column ``number`` of
    :func:`chunk_select_sql`, by name (``<number>_y``, ``_m``, ``_d``, and for a DATETIME or
    a TIMESTAMP ``_h``, ``_mi``, ``_s``): the first of two projections, so that each field
    is computed once (Spark keeps a projection of costly expressions that the next one
    uses more than once)."""
    _check_name(number)
    if base == "date":
        date = number
    elif base in ("datetime", "timestamp"):
        date = f"({number} div 1000000)"
    else:
        raise ValueError(f"not a temporal type: {base!r}")
    fields = {f"{number}_y": f"{date} div 10000", f"{number}_m": f"{date} div 100 % 100",
              f"{number}_d": f"{date} % 100"}
    if base != "date":
        fields |= {f"{number}_h": f"{number} div 10000 % 100",
                   f"{number}_mi": f"{number} div 100 % 100", f"{number}_s": f"{number} % 100"}
    return fields


def value_sql(base: str, number: str, micros: str | None) -> str:
    """Spark SQL of the canonical value, over the fields of :func:`field_sql` and the
    JDBC column ``micros`` (None: no fraction): NULL for year 0, a zero field or a day past
    its month's end."""
    for name in (number, micros):
        if name is not None:
            _check_name(name)
    y, m, d = f"{number}_y", f"{number}_m", f"{number}_d"
    leap = f"({y} % 4 = 0 AND ({y} % 100 != 0 OR {y} % 400 = 0))"
    # 31 days for January, March, May, July, August, October, December; 30 for the others.
    days_in_month = (f"CASE WHEN {m} = 2 THEN CASE WHEN {leap} THEN 29 ELSE 28 END"
                     f" ELSE 30 + ({m} + {m} div 8) % 2 END")
    valid = [f"{y} >= 1", f"{m} BETWEEN 1 AND 12", f"{d} BETWEEN 1 AND {days_in_month}"]
    leap_days_before_year = f"(({y} - 1) div 4 - ({y} - 1) div 100 + ({y} - 1) div 400)"
    days = (f"(({y} - 1970) * 365 + {leap_days_before_year} - {_LEAP_DAYS_BEFORE_1970}"
            f" + element_at(array({_DAYS_BEFORE_MONTH}), CAST({m} AS INT))"
            f" + CASE WHEN {m} > 2 AND {leap} THEN 1 ELSE 0 END + {d} - 1)")
    if base == "date":
        value = f"date_from_unix_date(CAST({days} AS INT))"
    elif base in ("datetime", "timestamp"):
        h, mi, s = f"{number}_h", f"{number}_mi", f"{number}_s"
        valid += [f"{h} < 24", f"{mi} < 60", f"{s} < 60"]
        total = f"{days} * {_MICROS_PER_DAY} + ({h} * 3600 + {mi} * 60 + {s}) * 1000000"
        if micros is not None:
            total += f" + {micros}"
        value = (f"timestamp_micros({total})" if base == "timestamp" else
                 f"timestampadd(MICROSECOND, {total}, TIMESTAMP_NTZ'1970-01-01 00:00:00')")
    else:
        raise ValueError(f"not a temporal type: {base!r}")
    return f"CASE WHEN {' AND '.join(valid)} THEN {value} END"


def _check_name(name: str) -> None:
    if not _SPARK_NAME.fullmatch(name):
        raise ValueError(f"not a positional column name: {name!r}")
