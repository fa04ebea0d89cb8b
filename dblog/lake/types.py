"""Canonical column types (Spark DDL names, see dblog.sources.base) as Spark types."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pyspark.sql import types as T

from dblog.sources.base import Column, element_type

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, SparkSession

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
    element = element_type(upper)
    if element is not None:
        return T.ArrayType(spark_type(element), True)
    raise ValueError(f"unknown canonical column type {name!r}")


def contains_type(dtype: T.DataType, kind: type[T.DataType]) -> bool:
    """Whether ``dtype`` is, or has elements of, ``kind``."""
    if isinstance(dtype, T.ArrayType):
        return contains_type(dtype.elementType, kind)
    return isinstance(dtype, kind)


WINDOW_COLUMN = "_dblog_window_id"
"""Changelog column: the capture window of a chunk row (null for log events)."""
ATTEMPT_COLUMN = "_dblog_attempt"
"""Changelog column: the write attempt that appended the row (see ``WriteAttempt``)."""
META_COLUMNS = ("_dblog_lsn", "_dblog_seq")
"""The position columns of the changelog and the mirror (a mirror row's is its last change's)."""
TRUNCATE_OP = "t"
"""Changelog ``op`` of a TRUNCATE / DROP: every row of the table before this position is
gone (``before``/``after`` null, ``_dblog_lsn``/``_dblog_seq`` = the statement's position)."""
MIRROR_LSN = "dblog.mirror_lsn"
"""Commit metadata of a mirror MERGE: every changelog row with ``_dblog_lsn`` at or below
this is in the mirror (a MERGE of the code before deferred merges recorded
``dblog.to_lsn``, the batch it merged, which means the same)."""
LSN_FLOOR = -(2**63)
"""Below every position: the mark of a mirror no merge has covered."""


def name_apart(name: str, taken: Iterable[str]) -> str:
    """``name``, with more leading underscores while it is one of ``taken`` (in any case):
    the name of a column of dblog's own work beside a table's columns."""
    lowered = {t.lower() for t in taken}
    while name.lower() in lowered:
        name = "_" + name
    return name


def same_shape(a: T.DataType, b: T.DataType) -> bool:
    """Whether two Spark types have the same fields and types, nullability aside."""
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and same_shape(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True))
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return same_shape(a.elementType, b.elementType)
    return a == b


def quote_ident(name: str) -> str:
    """A Spark SQL identifier in backticks (embedded backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def column_of(field: T.StructField) -> Column:
    """A Spark field back as a canonical column (the inverse of :func:`struct_of`)."""
    return Column(field.name, field.dataType.simpleString().upper())


def struct_of(columns: Iterable[Column]) -> T.StructType:
    """A struct with one nullable field per column (nullable: sources evolve)."""
    return T.StructType([T.StructField(c.name, spark_type(c.spark_type), True) for c in columns])


def coerce(value: Any, dtype: T.DataType) -> Any:
    """``value`` as a Python value of ``dtype``, for values decoded with an older, narrower
    source type than the lake column's (a batch can hold rows written before and after an
    ``ALTER``): DATE -> midnight for TIMESTAMP_NTZ (UTC for TIMESTAMP), integers -> Decimal
    or float, floats -> Decimal. Anything else is returned unchanged."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(dtype, T.TimestampNTZType | T.TimestampType):
        if isinstance(value, date) and not isinstance(value, datetime):
            tz = UTC if isinstance(dtype, T.TimestampType) else None
            return datetime.combine(value, time(), tzinfo=tz)
    elif isinstance(dtype, T.DecimalType):
        if isinstance(value, int):
            return Decimal(value)
        if isinstance(value, float):
            return Decimal(repr(value))
    elif isinstance(dtype, T.FloatType | T.DoubleType):
        if isinstance(value, int | Decimal):
            return float(value)
    return value


def needs_coercion(dtype: T.DataType) -> bool:
    """Whether :func:`coerce` can change a value for a column of ``dtype``."""
    return isinstance(
        dtype, T.TimestampNTZType | T.TimestampType | T.DecimalType | T.FloatType | T.DoubleType
    )


def frame_of_columns(spark: SparkSession, schema: T.StructType,
                     columns: Sequence[Sequence[Any]]) -> DataFrame:
    """A small DataFrame of ``schema`` from Python values (one sequence per column), sent to
    Spark as Arrow. ``createDataFrame`` of Python rows has Spark run its Python worker
    processes with ``$PYSPARK_PYTHON`` or ``python3`` from ``PATH`` (a local session of
    :func:`dblog.app.spark.build_spark_session` sets the former to this interpreter, a
    cluster's executors do not): a machine whose ``python3`` is another version fails the
    job, and the workers cost a process start. The values must already be of the columns'
    types: callers run :func:`coerce` where a lake type asks for it."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema)
    arrays = [pa.array(list(values), arrow.field(i).type) for i, values in enumerate(columns)]
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow), schema)
