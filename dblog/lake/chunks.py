"""A chunk's changelog rows, written once by the capture that selected them.

The capture holds the selected rows (tagged with their read order) until the tailer pins the
window (:class:`~dblog.state.handoff.ChunkPin`); then :func:`write_chunk_files` writes them as
the changelog's own files, uncommitted: ``op = 'r'``, the high watermark's position, row
``i`` in read order (the primary key's index order; read partitions in key order) at
``seq + 1 + i`` (the window's dropped keys leave their numbers unused), the pin's batch and
write attempt. The rows never pass through Python.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dblog.core.errors import DblogError
from dblog.core.events import Key, Op, TableId
from dblog.lake.deltalog import DeltaTxn, action_rows
from dblog.lake.types import (
    ATTEMPT_COLUMN,
    WINDOW_COLUMN,
    coerce,
    frame_of_columns,
    quote_ident,
)
from dblog.protocol.chunks import ChunkFiles, ChunkPin

__all__ = ["PARTITION_SHIFT", "keys_frame", "read_order_offsets", "write_chunk_files"]

PARTITION_SHIFT = 33
"""Spark's ``monotonically_increasing_id``: the partition index above this bit, the row's
index inside its partition below it."""
_ROW_MASK = (1 << PARTITION_SHIFT) - 1


def read_order_offsets(counts: Mapping[int, int]) -> dict[int, int]:
    """Rows read before each partition of a chunk, from the rows each one read (partitions
    read consecutive key ranges in index order): the base of its rows' numbers."""
    offsets: dict[int, int] = {}
    total = 0
    for part in sorted(counts):
        offsets[part] = total
        total += counts[part]
    return offsets


def keys_frame(spark: SparkSession, keys: Sequence[Key], key: Sequence[str],
               types: Mapping[str, T.DataType]) -> DataFrame:
    """Primary keys as a DataFrame of the key columns in the lake's types (through Arrow:
    :func:`~dblog.lake.types.frame_of_columns`)."""
    schema = T.StructType([T.StructField(k, types[k]) for k in key])
    columns = [[coerce(kv[i], types[k]) for kv in keys] for i, k in enumerate(key)]
    return frame_of_columns(spark, schema, columns)


_PIN_FIELDS = (
    ("lsn", T.LongType()), ("seq", T.LongType()), ("window", T.StringType()),
    ("batch", T.LongType()), ("attempt", T.StringType()), ("commit_ts_ms", T.LongType()),
    ("offsets", T.ArrayType(T.LongType())), ("source", T.StringType()),
    ("database", T.StringType()), ("table", T.StringType()),
)


def _pin_parameters(spark: SparkSession, pin: ChunkPin, offsets: Mapping[int, int],
                    taken: Sequence[str], source: str, table: TableId
                    ) -> tuple[DataFrame, dict[str, SparkColumn]]:
    """The pin's values (and the rows' source and table) as a one-row DataFrame to join to
    the chunk's rows, and a column for each: not literals, which Spark compiles into its
    generated code, so that every chunk would compile (and the JVM's JIT compile again) new
    classes; and nullable, as the changelog's ``source`` fields are, so that the struct
    built from them needs no cast (a cast struct is built twice a row, its strings copied).
    Named apart from the chunk's ``taken`` columns."""
    prefix = "_dblog_pin_"
    lowered = {c.lower() for c in taken}
    while any(c.lower().startswith(prefix) for c in lowered):
        prefix += "_"
    parts = max(offsets, default=-1) + 1
    row = (pin.lsn, pin.seq + 1, pin.window_id, pin.batch, pin.attempt, pin.commit_ts_ms,
           [offsets.get(p, 0) for p in range(parts)], source, table.database, table.table)
    schema = T.StructType([T.StructField(prefix + name, dtype) for name, dtype in _PIN_FIELDS])
    return (frame_of_columns(spark, schema, [[value] for value in row]),
            {name: F.col(quote_ident(prefix + name)) for name, _ in _PIN_FIELDS})


def _index_in_key_order(order: SparkColumn, offsets: SparkColumn) -> SparkColumn:
    """A row's 0-based index in the chunk's read order (the primary key's index order), from
    its read-order tag and the rows read before each read partition."""
    part = F.shiftright(order, PARTITION_SHIFT)
    index: SparkColumn = (F.element_at(offsets, (part + 1).cast(T.IntegerType()))
                          + order.bitwiseAND(F.lit(_ROW_MASK)))
    return index.cast(T.LongType())


def _after(columns: Sequence[str], after_type: T.StructType, table: TableId) -> SparkColumn:
    """The ``after`` struct in the lake's types from the chunk's ``columns``; lake columns
    the chunk lacks are null."""
    present = set(columns)
    missing = [c for c in columns if c not in {f.name for f in after_type.fields}]
    if missing:
        raise DblogError(
            f"{table}: the changelog lacks the chunk's column(s) {', '.join(missing)}; the "
            "tailer adds a chunk's columns before it pins the window")
    return F.struct(*[
        (F.col(quote_ident(f.name)) if f.name in present else F.lit(None))
        .cast(f.dataType).alias(f.name)
        for f in after_type.fields
    ])


def write_chunk_files(
    spark: SparkSession,
    changelog: str,
    *,
    source: str,
    table: TableId,
    chunk: DataFrame,
    key: Sequence[str],
    order_column: str,
    offsets: Mapping[int, int],
    selected: int,
    pin: ChunkPin,
) -> ChunkFiles:
    """Write ``chunk`` (the selected rows, with the read-order tag ``order_column``) as the
    changelog files ``pin`` asks for, committing nothing; returns their actions.

    ``offsets``: the rows read before each read partition (:func:`read_order_offsets`);
    ``selected``: the chunk's rows.
    The changelog must hold every column of the chunk (the tailer makes sure of it before
    it pins); lake columns the chunk lacks are written null, and values take the lake's
    types (a lake column may be wider than the source's)."""
    txn = DeltaTxn(spark, changelog)
    if not selected:
        return ChunkFiles(pin.window_id, pin.batch, pin.attempt, txn.table_id, (), 0, 0)
    schema = T.StructType.fromJson(json.loads(txn.schema_json))
    after_type = schema["after"].dataType
    assert isinstance(after_type, T.StructType)
    rows = chunk
    if pin.dropped_keys:
        types = {f.name: f.dataType for f in after_type.fields}
        dropped = keys_frame(spark, pin.dropped_keys, key, types)
        rows = rows.join(F.broadcast(dropped), on=list(key), how="left_anti")
    parameters, p = _pin_parameters(spark, pin, offsets, chunk.columns, source, table)
    rows = rows.crossJoin(F.broadcast(parameters))
    source_type = schema["source"].dataType
    assert isinstance(source_type, T.StructType)
    columns: dict[str, SparkColumn] = {
        "op": F.lit(Op.READ.value),
        "before": F.lit(None).cast(after_type),
        "after": _after([c for c in chunk.columns if c != order_column], after_type, table),
        "source": F.struct(
            p["source"].alias("name"), p["database"].alias("database"),
            p["table"].alias("table"), F.timestamp_millis(p["commit_ts_ms"])
            .alias("commit_ts")).cast(source_type),
        "_dblog_lsn": p["lsn"],
        "_dblog_seq": p["seq"] + _index_in_key_order(F.col(quote_ident(order_column)),
                                                     p["offsets"]),
        WINDOW_COLUMN: p["window"],
        "_dblog_batch": p["batch"],
        ATTEMPT_COLUMN: p["attempt"],
    }
    unknown = [f.name for f in schema.fields if f.name not in columns]
    if unknown:
        raise DblogError(f"{table}: the changelog has columns dblog does not write: {unknown}")
    shaped = rows.select(*[columns[f.name].alias(f.name) for f in schema.fields])
    actions = txn.write_files(shaped)
    return ChunkFiles(pin.window_id, pin.batch, pin.attempt, txn.table_id, tuple(actions),
                      action_rows(actions), selected)

