"""The lake tables' schemas and properties: what a new changelog and mirror are made with,
and which type changes Delta can follow (pure definitions, no Spark job).

Readers: new tables use no Delta feature delta-rs refuses; type widening is enabled on a
table only when one of its columns widens (such a table needs a reader that supports it).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import types as T

from dblog.lake.types import (
    ATTEMPT_COLUMN,
    META_COLUMNS,
    WINDOW_COLUMN,
    contains_type,
    struct_of,
)
from dblog.sources.base import Column

RESERVED_COLUMNS = tuple(sorted({*META_COLUMNS, WINDOW_COLUMN}))
"""The lake's own columns beside a table's columns: the mirror's position, a chunk row's window.
A source column may not take one of these names (in any case: Spark compares names without
it)."""
TABLE_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    "delta.appendOnly": "false",
    "delta.checkpointInterval": "100",
}
"""Properties of every new changelog and mirror. Nothing a non-Spark reader
(delta-rs) refuses: type widening is enabled on a table only when one of its columns
widens, column mapping only where a name needs it. A checkpoint every 100 commits, not
Delta's 10: the commit that writes one waits for it (1-1.5 s), which on a tailer's
1k-row appends was a third of their mean time (0.33 -> 0.23 s), while reads, which replay
the commits after the checkpoint, did not slow (0.58 -> 0.51 s)."""
NO_CHANGE_FEED = {"delta.enableChangeDataFeed": "false"}
"""For the mirror: the changelog is the change feed. With Delta's feed on, each
mirror MERGE also wrote a pre- and a post-image of every row it updated or deleted (20-35%
of an update-heavy MERGE). Explicit, since the session's default turns the feed on."""
TYPE_WIDENING = {"delta.enableTypeWidening": "true"}
COLUMN_MAPPING = {
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "2",
    "delta.minWriterVersion": "5",
}
TIMESTAMP_NTZ_FEATURE = {"delta.feature.timestampNtz": "supported"}
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_PARQUET_UNSAFE = set(" ,;{}()\n\t=")


def needs_column_mapping(column_names: Sequence[str]) -> bool:
    """Whether a name is not Parquet-safe (spaces, commas, parentheses... are legal in
    MariaDB and PostgreSQL names), so the table needs column mapping."""
    return any(_PARQUET_UNSAFE & set(name) for name in column_names)


CHANGELOG_STATS = {
    "delta.dataSkippingStatsColumns": "op,_dblog_lsn,_dblog_seq,_dblog_window_id,_dblog_batch",
}
"""Statistics of a new changelog: its position and batch columns, whatever the table's width
(Delta's default, the first 32 leaf columns, misses ``_dblog_lsn`` behind the ``before`` and
``after`` structs of a table of more than 14 columns). The mirror reads the changelog rows it
has not merged yet by ``_dblog_lsn``, and these statistics let Delta skip every older file."""


def table_properties(column_names: Sequence[str]) -> dict[str, str]:
    """Delta properties for a new table; column mapping where a name is not Parquet-safe."""
    props = dict(TABLE_PROPERTIES)
    if needs_column_mapping(column_names):
        props.update(COLUMN_MAPPING)
    return props


def widens(old: T.DataType, new: T.DataType) -> bool:
    """Whether Delta type widening can turn ``old`` into ``new`` (lossless)."""
    names = [t.simpleString().upper() for t in (old, new)]
    if names[0] in _INTEGERS and names[1] in _INTEGERS:
        return _INTEGERS.index(names[1]) > _INTEGERS.index(names[0])
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale \
            and (new.precision, new.scale) != (old.precision, old.scale)
    return names in (["FLOAT", "DOUBLE"], ["DATE", "TIMESTAMP_NTZ"])


def changelog_schema(columns: Sequence[Column]) -> T.StructType:
    """A changelog's schema: ``op``, the row images, the source, position, window, batch and
    write attempt."""
    row = struct_of(columns)
    source = T.StructType([
        T.StructField("name", T.StringType()),
        T.StructField("database", T.StringType()),
        T.StructField("table", T.StringType()),
        T.StructField("commit_ts", T.TimestampType()),
    ])
    return T.StructType([
        T.StructField("op", T.StringType(), False),
        T.StructField("before", row),
        T.StructField("after", row),
        T.StructField("source", source),
        T.StructField("_dblog_lsn", T.LongType(), False),
        T.StructField("_dblog_seq", T.LongType(), False),
        T.StructField(WINDOW_COLUMN, T.StringType()),
        T.StructField("_dblog_batch", T.LongType()),
        T.StructField(ATTEMPT_COLUMN, T.StringType()),
    ])


def mirror_schema(columns: Sequence[Column]) -> T.StructType:
    """A mirror's schema: the table's columns and the position of each row's change."""
    fields = list(struct_of(columns).fields)
    fields += [T.StructField(c, T.LongType(), False) for c in META_COLUMNS]
    return T.StructType(fields)


def features_for(types: Sequence[T.DataType], names: Sequence[str]) -> dict[str, str]:
    """Table features an ALTER introducing these columns/types needs enabled first."""
    props: dict[str, str] = {}
    if any(contains_type(t, T.TimestampNTZType) for t in types):
        props.update(TIMESTAMP_NTZ_FEATURE)  # Delta requires enabling it by hand
    if needs_column_mapping(names):
        props.update(COLUMN_MAPPING)
    return props
