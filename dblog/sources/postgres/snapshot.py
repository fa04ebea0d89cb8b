"""Chunk selects for PostgreSQL: SQL text and reading one chunk (or the greatest key) via
Spark JDBC in the canonical schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dblog.core.chunking import chunk_predicate_sql, limit_sql
from dblog.core.errors import ConfigError
from dblog.core.events import Key
from dblog.sources.base import ChunkSpec, Column, TableSchema, element_type
from dblog.sources.postgres.sqltext import literal, quote_ident, quote_table
from dblog.sources.postgres.types import TEMPORAL, projection

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

def column_projection(col: Column) -> str:
    return projection(quote_ident(col.name), col.source_type, col.spark_type)


def key_bounds_sql(schema: TableSchema, lower: Key | None, upper: Key | None,
                   doing: str) -> str | None:
    """``(lower, upper]`` over the key columns with safe literals (None: unbounded)."""
    if lower is None and upper is None:
        return None
    try:
        return chunk_predicate_sql(schema.key, lower, upper, quote_ident=quote_ident,
                                   literal=literal)
    except ValueError as exc:
        raise ConfigError(f"{doing} of {schema.table}: {exc}") from None


def _keys_predicate(key_cols: tuple[str, ...], keys: list[Key]) -> str:
    if not keys:
        return "FALSE"
    quoted = [quote_ident(c) for c in key_cols]
    for key in keys:
        if len(key) != len(key_cols) or any(v is None for v in key):
            raise ConfigError(f"key {key!r} does not match key columns {key_cols}")
    terms = ("(" + " AND ".join(f"{c} = {literal(v)}" for c, v in zip(quoted, k, strict=True))
             + ")" for k in keys)
    return "(" + " OR ".join(terms) + ")"


def _order_by(schema: TableSchema, *, descending: bool = False) -> str:
    table = quote_table(schema.table)
    return ", ".join(f"{table}.{quote_ident(k)}" + (" DESC" if descending else "")
                     for k in schema.key)


def build_chunk_sql(spec: ChunkSpec, schema: TableSchema) -> str:
    """SELECT of one chunk: every column projected to its canonical form, ``(after_key,
    upper_key]``, ``keys``, ``where``, in key order, ``LIMIT`` (none when ``spec.limit`` is
    None)."""
    limit = limit_sql(spec.limit)
    if not schema.key:
        raise ConfigError(f"table {schema.table} has no primary key")
    projections = [f"{column_projection(c)} AS {quote_ident(c.name)}" for c in schema.columns]
    conditions: list[str] = []
    bounds = key_bounds_sql(schema, spec.after_key, spec.upper_key, "chunk")
    if bounds is not None:
        conditions.append(bounds)
    if spec.keys is not None:
        conditions.append(_keys_predicate(schema.key, [tuple(k) for k in spec.keys]))
    if spec.where is not None and spec.where.strip():
        conditions.append(f"(\n{spec.where}\n)")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return (f"SELECT {', '.join(projections)} FROM {quote_table(schema.table)}"  # noqa: S608 - quoted identifiers and validated literals only
            f"{where} ORDER BY {_order_by(schema)}{limit}")


def _key_select(schema: TableSchema, after_key: Key | None, doing: str,
                upper_key: Key | None = None) -> str:
    projections = [f"{column_projection(schema.column(k))} AS {quote_ident(k)}"
                   for k in schema.key]
    bounds = key_bounds_sql(schema, after_key, upper_key, doing)
    where = "" if bounds is None else f" WHERE {bounds}"
    return (f"SELECT {', '.join(projections)} FROM {quote_table(schema.table)}"  # noqa: S608 - quoted identifiers and validated literals only
            f"{where}")


def max_key_sql(schema: TableSchema, after_key: Key | None) -> str:
    return (f"{_key_select(schema, after_key, 'max key')} "
            f"ORDER BY {_order_by(schema, descending=True)} LIMIT 1")


def key_at_offset_sql(schema: TableSchema, after_key: Key | None, offset: int,
                      upper_key: Key | None = None) -> str:
    if offset < 0:
        raise ValueError("offset must not be negative")
    return (f"{_key_select(schema, after_key, 'key range', upper_key)} "
            f"ORDER BY {_order_by(schema)} LIMIT 1 OFFSET {int(offset)}")


def canonical_frame(df: DataFrame, columns: Sequence[Column]) -> DataFrame:
    """A JDBC result (columns in select order) cast to the canonical types and names."""
    from pyspark.sql import functions as F

    from dblog.sources.spark_types import spark_data_type

    temp = [f"_c{i}" for i in range(len(df.columns))]
    df = df.toDF(*temp)
    selected = []
    for name, col in zip(temp, columns, strict=True):
        data_type = spark_data_type(col.spark_type)
        column = F.col(name)
        element = element_type(col.spark_type)
        if element == "BINARY":  # elements came as hex text
            cast = F.transform(column, lambda e: F.unhex(e))
        elif col.spark_type in TEMPORAL or element in TEMPORAL:
            cast = column.try_cast(data_type)
        else:
            cast = column.cast(data_type)
        selected.append(cast.alias(col.name))
    return df.select(*selected)


def read_query(spark: SparkSession, options: dict[str, str], sql: str,
               columns: Sequence[Column]) -> DataFrame:
    df = spark.read.format("jdbc").options(**options, query=sql).load()
    if len(df.columns) != len(columns):
        raise ConfigError(f"a select returned {len(df.columns)} columns, not {len(columns)}")
    return canonical_frame(df, columns)


def key_from_row(schema: TableSchema, values: Sequence[Any]) -> Key:
    """A key read with psycopg2 through :func:`key_at_offset_sql`, in canonical form."""
    from dblog.sources.postgres.types import converter

    key = []
    for name, value in zip(schema.key, values, strict=True):
        col = schema.column(name)
        conv = converter(col.spark_type)
        if isinstance(value, memoryview):
            value = bytes(value)
        if conv is not None and isinstance(value, str) and col.spark_type != "STRING":
            value = conv(value)
        key.append(value)
    return tuple(key)
