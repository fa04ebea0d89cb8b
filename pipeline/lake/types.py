"""Canonical column types (Spark DDL names, see pipeline.sources.base) as Spark types."""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql import types as T

from pipeline.sources.base import Column

_SIMPLE: dict[str, T.DataType] = {
    "BOOLEAN": T.BooleanType(),
    "TINYINT": T.ByteType(),
    "SMALLINT": T.ShortType(),
    "INT": T.IntegerType(),
    "BIGINT": T.LongType(),
    "FLOAT": T.FloatType(),
    "DOUBLE": T.DoubleType(),
    "STRING": T.StringType(),
    "BINARY": T.BinaryType(),
    "DATE": T.DateType(),
    "TIMESTAMP": T.TimestampType(),
    "TIMESTAMP_NTZ": T.TimestampNTZType(),
}
_DECIMAL = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")


def spark_type(name: str) -> T.DataType:
    """The Spark type of a canonical type name; ValueError for an unknown one."""
    upper = name.strip().upper()
    if upper in _SIMPLE:
        return _SIMPLE[upper]
    match = _DECIMAL.match(upper)
    if match:
        return T.DecimalType(int(match.group(1)), int(match.group(2)))
    raise ValueError(f"unknown canonical column type {name!r}")


def quote_ident(name: str) -> str:
    """A Spark SQL identifier in backticks (embedded backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def column_of(field: T.StructField) -> Column:
    """A Spark field back as a canonical column (the inverse of :func:`struct_of`)."""
    return Column(field.name, field.dataType.simpleString().upper())


def struct_of(columns: Iterable[Column]) -> T.StructType:
    """A struct with one nullable field per column (nullable: sources evolve)."""
    return T.StructType([T.StructField(c.name, spark_type(c.spark_type), True) for c in columns])
