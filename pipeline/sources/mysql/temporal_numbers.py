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
and Spark's arithmetic costs less than parsing the text (a 1M-row select with a DATETIME(6)
and a DATE column: MariaDB 0.51-0.52 CPU-s against 0.82-0.84, Spark's JVM 0.87-0.92 against
0.94-1.04). ``TO_DAYS``/``TO_SECONDS`` would be as cheap but move an invalid date to a valid
one ('2020-02-31' is March 2nd to them).

The SQL here is Spark SQL over a JDBC column's positional name (``_c<i>``, never a source
identifier).
"""

from __future__ import annotations

import re

_SPARK_NAME = re.compile(r"_c\d+")

_MICROS_PER_DAY = 86_400_000_000
_DAYS_BEFORE_EPOCH = 719_468
"""Days from 0000-03-01 to 1970-01-01 in the proleptic Gregorian calendar."""


def chunk_select_sql(base: str, precision: int, quoted: str) -> tuple[str, ...]:
    """The MariaDB expressions a chunk select sends for a temporal column ``quoted``."""
    if base not in ("date", "datetime", "timestamp"):
        raise ValueError(f"not a temporal type: {base!r}")
    number = f"CAST({quoted} AS SIGNED)"
    if base == "date" or precision == 0:
        return (number,)
    return (number, f"MICROSECOND({quoted})")


def spark_sql(base: str, number: str, micros: str | None) -> str:
    """Spark SQL giving the canonical value of a temporal column from the JDBC columns
    ``number`` and ``micros`` (None: no fraction) of :func:`chunk_select_sql`."""
    for name in (number, micros):
        if name is not None and not _SPARK_NAME.fullmatch(name):
            raise ValueError(f"not a positional column name: {name!r}")
    if base == "date":
        date, seconds = number, None
    elif base in ("datetime", "timestamp"):
        date, seconds = f"({number} div 1000000)", f"({number} % 1000000)"
    else:
        raise ValueError(f"not a temporal type: {base!r}")
    year, month, day = f"({date} div 10000)", f"({date} div 100 % 100)", f"({date} % 100)"
    valid = [f"{year} >= 1", f"{month} BETWEEN 1 AND 12",
             f"{day} BETWEEN 1 AND {_days_in_month(year, month)}"]
    days = _days_since_epoch(year, month, day)
    if seconds is None:
        value = f"date_from_unix_date(CAST({days} AS INT))"
    else:
        hour, minute, second = (f"({seconds} div 10000)", f"({seconds} div 100 % 100)",
                                f"({seconds} % 100)")
        valid += [f"{hour} < 24", f"{minute} < 60", f"{second} < 60"]
        micros_of_day = f"(({hour} * 3600 + {minute} * 60 + {second}) * 1000000)"
        total = f"{days} * {_MICROS_PER_DAY} + {micros_of_day}"
        if micros is not None:
            total += f" + {micros}"
        value = (f"timestamp_micros({total})" if base == "timestamp" else
                 f"timestampadd(MICROSECOND, {total}, TIMESTAMP_NTZ'1970-01-01 00:00:00')")
    return f"CASE WHEN {' AND '.join(valid)} THEN {value} END"


def _days_in_month(year: str, month: str) -> str:
    leap = f"({year} % 4 = 0 AND ({year} % 100 != 0 OR {year} % 400 = 0))"
    # 31 for January, March, May, July, August, October, December; 30 for the others.
    return (f"(CASE WHEN {month} = 2 THEN CASE WHEN {leap} THEN 29 ELSE 28 END"
            f" ELSE 30 + ({month} + {month} div 8) % 2 END)")


def _days_since_epoch(year: str, month: str, day: str) -> str:
    """Days from 1970-01-01 to a valid date of year >= 1 (H. Hinnant's ``days_from_civil``:
    years counted from March, so February's leap day ends the year)."""
    shifted = f"({year} - CASE WHEN {month} <= 2 THEN 1 ELSE 0 END)"
    era, year_of_era = f"({shifted} div 400)", f"({shifted} % 400)"
    day_of_year = f"((153 * (({month} + 9) % 12) + 2) div 5 + {day} - 1)"
    day_of_era = (f"({year_of_era} * 365 + {year_of_era} div 4 - {year_of_era} div 100"
                  f" + {day_of_year})")
    return f"({era} * 146097 + {day_of_era} - {_DAYS_BEFORE_EPOCH})"
