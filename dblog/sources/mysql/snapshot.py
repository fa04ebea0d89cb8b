"""Chunk selects: the SQL text, the canonical Spark schema, and reading one chunk via JDBC."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dblog.core.chunking import chunk_predicate_sql, limit_sql
from dblog.core.errors import ConfigError
from dblog.core.events import Key, TableId
from dblog.sources.base import FETCH_ROWS, ChunkSpec, Column, SourceDialect, TableSchema
from dblog.sources.mysql import temporal_numbers
from dblog.sources.mysql.sqltext import literal, quote_ident, quote_table
from dblog.sources.mysql.types import TEMPORAL_TYPES, SourceType
from dblog.sources.spark_types import spark_data_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")



def _keys_predicate(key_cols: tuple[str, ...], keys: list[Key]) -> str:
    if not keys:
        return "1 = 0"
    quoted = [quote_ident(c) for c in key_cols]
    for key in keys:
        if len(key) != len(key_cols) or any(v is None for v in key):
            raise ConfigError(f"key {key!r} does not match key columns {key_cols}")
    if len(quoted) == 1:
        return f"{quoted[0]} IN ({', '.join(literal(k[0]) for k in keys)})"
    terms = (
        "(" + " AND ".join(f"{c} = {literal(v)}" for c, v in zip(quoted, k, strict=True)) + ")"
        for k in keys
    )
    return "(" + " OR ".join(terms) + ")"


def source_type_of(column_source_type: str, spark_type: str) -> SourceType:
    """Rebuild a :class:`SourceType` from a Column's ``source_type`` name."""
    name = column_source_type.strip().lower()
    unsigned = name.endswith(" unsigned")
    base = name.removesuffix(" unsigned")
    precision = scale = 0
    match = re.fullmatch(r"([a-z]+)\((\d+)(?:,(\d+))?\)", base)
    if match:
        base, precision, scale = match[1], int(match[2]), int(match[3] or 0)
    try:
        st = SourceType(base, unsigned=unsigned, precision=precision, scale=scale)
    except ValueError:
        raise ConfigError(f"unknown MariaDB/MySQL column type {column_source_type!r}") from None
    if st.spark_type != spark_type:
        raise ConfigError(f"column type {column_source_type!r} is not {spark_type}")
    return st


def column_projection(col: Column) -> str:
    """The SELECT expression giving ``col``'s canonical value (see ``SourceType.projection``)."""
    return source_type_of(col.source_type, col.spark_type).projection(quote_ident(col.name))


def chunk_projections(col: Column) -> tuple[str, ...]:
    """The SELECT expressions a chunk select sends for ``col`` (see
    ``SourceType.chunk_projections``), turned into its canonical value by
    :func:`_from_chunk_select`."""
    st = source_type_of(col.source_type, col.spark_type)
    return st.chunk_projections(quote_ident(col.name))


def key_bounds_sql(schema: TableSchema, lower: Key | None, upper: Key | None,
                   doing: str) -> str | None:
    """``(lower, upper]`` over the key columns as SQL with safe literals; ``None`` when
    unbounded on both sides. ``doing`` names the read in the error for a bad key."""
    if lower is None and upper is None:
        return None
    try:
        return chunk_predicate_sql(schema.key, lower, upper, quote_ident=quote_ident,
                                   literal=literal)
    except ValueError as exc:
        raise ConfigError(f"{doing} of {schema.table}: {exc}") from None


def build_chunk_sql(spec: ChunkSpec, schema: TableSchema) -> str:
    """SELECT for one chunk: all columns in table order, ``(after_key, upper_key]``, ``keys``,
    ``where``, ordered by the primary key, ``LIMIT`` (none when ``spec.limit`` is None);
    values rendered as safe literals.

    Spark's JDBC reader wraps the select in a subquery. MariaDB materializes a subquery with
    a ``LIMIT`` (a temporary table, on disk for a large chunk) before the first row is sent,
    and merges one without into the outer query (then the range scan of the primary key
    gives the key order; its ``ORDER BY`` is dropped)."""
    limit = limit_sql(spec.limit)
    if not schema.key:
        raise ConfigError(f"table {schema.table} has no primary key")
    # Positional aliases: a column may take two expressions, and the names must not clash
    # in the derived table Spark wraps the select in (the result is renamed by position).
    expressions = [e for col in schema.columns for e in chunk_projections(col)]
    projections = [f"{e} AS `_c{i}`" for i, e in enumerate(expressions)]
    conditions: list[str] = []
    bounds = key_bounds_sql(schema, spec.after_key, spec.upper_key, "chunk")
    if bounds is not None:
        conditions.append(bounds)
    if spec.keys is not None:
        conditions.append(_keys_predicate(schema.key, [tuple(k) for k in spec.keys]))
    if spec.where is not None and spec.where.strip():
        # Newlines end a trailing "-- comment" in the operator's filter.
        conditions.append(f"(\n{spec.where}\n)")
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    table = quote_table(schema.table)
    return (
        f"SELECT {', '.join(projections)} FROM {table}"  # noqa: S608 - quoted identifiers and validated literals only
        f"{where} ORDER BY {_order_by(schema)}{limit}"
    )


def _order_by(schema: TableSchema, *, descending: bool = False) -> str:
    """The key order every chunk predicate agrees with.

    Columns are qualified: a bare name in ORDER BY would mean the projected alias (e.g.
    CAST(b AS CHAR), whose collation orders differently from the column's). ENUM and SET
    columns sort by their index (bitmask) but compare with a string literal as strings, in
    the column's collation: they are ordered by ``CONCAT(column)`` (the string, same
    collation) so that ``col > 'last'`` continues exactly where the previous chunk ended
    (this costs a sort: such keys cannot use the index order).
    """
    table = quote_table(schema.table)
    terms = []
    for k in schema.key:
        col = schema.column(k)
        term = f"{table}.{quote_ident(k)}"
        if source_type_of(col.source_type, col.spark_type).base in ("enum", "set"):
            term = f"CONCAT({term})"
        terms.append(term + (" DESC" if descending else ""))
    return ", ".join(terms)


def _key_select(schema: TableSchema, after_key: Key | None, doing: str,
                upper_key: Key | None = None) -> str:
    """``SELECT <key columns, temporal ones as text (column_projection)> FROM t [WHERE key >
    after_key [AND key <= upper_key]]``."""
    if not schema.key:
        raise ConfigError(f"table {schema.table} has no primary key")
    projections = [f"{column_projection(schema.column(name))} AS {quote_ident(name)}"
                   for name in schema.key]
    bounds = key_bounds_sql(schema, after_key, upper_key, doing)
    where = "" if bounds is None else f" WHERE {bounds}"
    return (f"SELECT {', '.join(projections)} FROM {quote_table(schema.table)}"  # noqa: S608 - quoted identifiers and validated literals only
            f"{where}")


def max_key_sql(schema: TableSchema, after_key: Key | None) -> str:
    """SELECT of the greatest key above ``after_key`` (None: of the whole table), in the
    database's key order; key columns only, temporal ones as text."""
    return (f"{_key_select(schema, after_key, 'max key')} "
            f"ORDER BY {_order_by(schema, descending=True)} LIMIT 1")


def key_at_offset_sql(schema: TableSchema, after_key: Key | None, offset: int,
                      upper_key: Key | None = None) -> str:
    """SELECT of the key at 0-based ``offset`` above ``after_key`` (None: from the table's
    start) and at or below ``upper_key`` (None: no limit), in the database's key order; key
    columns only, temporal ones as text (read with PyMySQL: :func:`key_from_text`)."""
    if offset < 0:
        raise ValueError("offset must not be negative")
    return (f"{_key_select(schema, after_key, 'key range', upper_key)} "
            f"ORDER BY {_order_by(schema)} LIMIT 1 OFFSET {int(offset)}")


def key_from_text(schema: TableSchema, values: Sequence[Any]) -> Key:
    """A key read through :func:`key_at_offset_sql` with PyMySQL, in the engine's canonical
    form (what Spark's canonical cast and the log decoder give)."""
    import datetime as dt

    key = []
    for name, value in zip(schema.key, values, strict=True):
        kind = schema.column(name).spark_type
        if value is None:
            raise ConfigError(f"{schema.table}: key column {name} holds a value dblog cannot "
                              "read (a zero date?)")
        if kind == "DATE":
            value = dt.date.fromisoformat(str(value))
        elif kind == "TIMESTAMP_NTZ":
            value = dt.datetime.fromisoformat(str(value))
        elif kind == "TIMESTAMP":
            value = dt.datetime.fromisoformat(str(value).removesuffix("Z")).replace(
                tzinfo=dt.UTC)
        key.append(value)
    return tuple(key)


def read_max_key(
    spark: SparkSession, dialect: SourceDialect, schema: TableSchema, after_key: Key | None
) -> DataFrame:
    """The greatest key above ``after_key`` as a DataFrame of the key columns in their
    canonical types: one row, or none when no key lies above ``after_key``."""
    sql = max_key_sql(schema, after_key)
    df = spark.read.format("jdbc").options(**dialect.jdbc_options(), query=sql).load()
    return _canonical(df, tuple(schema.column(k) for k in schema.key), schema.table)


def spark_schema(schema: TableSchema) -> StructType:
    """The canonical Spark schema of a table (columns in table order)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([
        StructField(c.name, spark_data_type(c.spark_type), c.nullable) for c in schema.columns
    ])


def read_chunk(
    spark: SparkSession, dialect: SourceDialect, spec: ChunkSpec, schema: TableSchema
) -> DataFrame:
    """One chunk as a DataFrame with the canonical schema, rows in the database's key order
    (one JDBC partition). Zero dates read as NULL, as the log decodes them."""
    sql = dialect.chunk_sql(spec, schema)
    df = (spark.read.format("jdbc").options(**dialect.jdbc_options(), query=sql)
          .option("fetchsize", str(FETCH_ROWS)).load())
    return _from_chunk_select(df, schema.columns, schema.table)


def _from_chunk_select(df: DataFrame, columns: Sequence[Column], table: TableId) -> DataFrame:
    """A chunk select's JDBC result (:func:`chunk_projections` of ``columns``) with the
    columns' canonical types and names."""
    from pyspark.sql import functions as F

    types = [source_type_of(col.source_type, col.spark_type) for col in columns]
    widths = [len(st.chunk_projections(quote_ident(col.name)))
              for st, col in zip(types, columns, strict=True)]
    if len(df.columns) != sum(widths):
        raise ConfigError(f"chunk select of {table} returned {len(df.columns)} columns")
    temp = [f"_c{i}" for i in range(len(df.columns))]
    df = df.toDF(*temp)
    fields = []
    selected = []
    at = 0
    for col, st, width in zip(columns, types, widths, strict=True):
        if st.base in TEMPORAL_TYPES:
            fields += [F.expr(sql).alias(name)
                       for name, sql in temporal_numbers.field_sql(st.base, temp[at]).items()]
            micros = temp[at + 1] if width == 2 else None
            column = F.expr(temporal_numbers.value_sql(st.base, temp[at], micros))
        else:
            column = F.col(temp[at]).cast(spark_data_type(col.spark_type))
        selected.append(column.alias(col.name))
        at += width
    if fields:
        df = df.select(*temp, *fields)
    return df.select(*selected)


def _canonical(df: DataFrame, columns: Sequence[Column], table: TableId) -> DataFrame:
    """A JDBC result of :func:`column_projection` (key selects) with the columns' canonical
    types and names (given in select order)."""
    from pyspark.sql import functions as F

    if len(df.columns) != len(columns):
        raise ConfigError(f"key select of {table} returned {len(df.columns)} columns")
    # Rename positionally: no Spark name parsing of hostile column names.
    temp = [f"_c{i}" for i in range(len(df.columns))]
    df = df.toDF(*temp)
    selected = []
    for name, col in zip(temp, columns, strict=True):
        data_type = spark_data_type(col.spark_type)
        base = col.source_type.split("(")[0].strip().lower()
        column = F.col(name)
        cast = column.try_cast(data_type) if base in TEMPORAL_TYPES else column.cast(data_type)
        selected.append(cast.alias(col.name))
    return df.select(*selected)
