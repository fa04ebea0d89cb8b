"""Spark's arithmetic from a chunk select's temporal numbers to DATE, TIMESTAMP_NTZ and
TIMESTAMP, against Spark's own calendar for every date of every year and against Python's
for random date-times (fields out of range included)."""

from __future__ import annotations

import datetime as dt
import random
from typing import TYPE_CHECKING

import pytest

from dblog.sources.mysql.temporal_numbers import chunk_select_sql, field_sql, value_sql

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def decoded(frame: DataFrame, base: str, number: str, micros: str | None
            ) -> tuple[DataFrame, Column]:
    """``frame`` with the fields of ``number`` beside its columns, and the value's column."""
    from pyspark.sql import functions as F

    fields = [F.expr(sql).alias(name) for name, sql in field_sql(base, number).items()]
    return frame.select("*", *fields), F.expr(value_sql(base, number, micros))


def test_every_year_month_and_day_field_against_sparks_calendar(spark: SparkSession) -> None:
    """All YYYYMMDD numbers with year 0-9999, month 0-12 and day 0-31 (4.16M): valid dates
    read as that date, the rest (year 0, a zero month or day, a day past the month's end)
    as NULL."""
    from pyspark.sql import functions as F

    numbers = spark.range(10000 * 13 * 32).select(
        ((F.col("id") / 416).cast("long") * 10000 + (F.col("id") / 32).cast("long") % 13 * 100
         + F.col("id") % 32).alias("_c0"))
    with_fields, value = decoded(numbers, "date", "_c0", None)
    got = with_fields.select(F.col("_c0"), value.alias("d"))
    expected = numbers.select(F.col("_c0"), F.expr(
        "CASE WHEN _c0 div 10000 >= 1 THEN CAST(try_make_timestamp_ntz(CAST(_c0 div 10000 AS INT),"
        " CAST(_c0 div 100 % 100 AS INT), CAST(_c0 % 100 AS INT), 0, 0, 0) AS DATE) END"
    ).alias("d"))
    assert got.exceptAll(expected).count() == 0 and expected.exceptAll(got).count() == 0
    valid = got.where(F.col("d").isNotNull()).count()
    assert valid == (dt.date(9999, 12, 31) - dt.date(1, 1, 1)).days + 1


def _python_value(base: str, fields: tuple[int, ...], micros: int) -> dt.datetime | None:
    try:
        value = dt.datetime(*fields, micros)  # type: ignore[misc]
    except ValueError:
        return None
    return value.replace(tzinfo=dt.UTC) if base == "timestamp" else value


@pytest.mark.parametrize("base", ["datetime", "timestamp"])
def test_random_date_times_against_python(spark: SparkSession, base: str) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        LongType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    rng = random.Random(20261129)
    rows = []
    for _ in range(20000):
        fields = (rng.choice([0, 1, 2, 1582, 1900, 1969, 1970, 2000, 2024, 2038, 9999,
                              rng.randint(0, 9999)]),
                  rng.randint(0, 13), rng.randint(0, 32), rng.randint(0, 23),
                  rng.randint(0, 59), rng.randint(0, 59))
        micros = rng.choice([0, 1, 999999, rng.randint(0, 999999)])
        number = int("".join(f"{v:0{w}d}" for v, w in zip(fields, (4, 2, 2, 2, 2, 2),
                                                           strict=True)))
        expected = _python_value(base, fields, micros) if fields[0] >= 1 else None
        rows.append((number, micros, expected))
    kind = TimestampType() if base == "timestamp" else TimestampNTZType()
    schema = StructType([StructField("_c0", LongType()), StructField("_c1", LongType()),
                         StructField("expected", kind)])
    frame = spark.createDataFrame(rows, schema)
    with_fields, value = decoded(frame, base, "_c0", "_c1")
    got = with_fields.select(value.alias("v"), "expected")
    assert got.schema["v"].dataType == kind
    wrong = got.where(~F.col("v").eqNullSafe(F.col("expected"))).limit(5).collect()
    assert wrong == []
    assert got.where(F.col("v").isNotNull()).count() > 5000


def test_whole_seconds_and_the_select_expressions() -> None:
    assert chunk_select_sql("date", 0, "`d`") == ("CAST(`d` AS SIGNED)",)
    assert chunk_select_sql("datetime", 0, "`d`") == ("CAST(`d` AS SIGNED)",)
    assert chunk_select_sql("timestamp", 3, "`t```") == ("CAST(`t``` AS SIGNED)",
                                                        "MICROSECOND(`t```)")
    with pytest.raises(ValueError, match="not a temporal type"):
        chunk_select_sql("time", 0, "`t`")
    with pytest.raises(ValueError, match="not a positional column name"):
        field_sql("date", "`d`; DROP")
    with pytest.raises(ValueError, match="not a positional column name"):
        value_sql("datetime", "_c1", "us")
    assert set(field_sql("datetime", "_c1")) == {"_c1_y", "_c1_m", "_c1_d", "_c1_h", "_c1_mi",
                                                 "_c1_s"}
    assert "timestampadd" in value_sql("datetime", "_c1", None)
