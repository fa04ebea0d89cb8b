"""Compare a table's Delta mirror (or its current state, mirror and unmerged changelog)
with the source, row for row, inside Spark."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import functions as F

from dblog.core.events import TableId
from dblog.lake.current import current_state
from dblog.lake.sink import DeltaSink
from dblog.lake.types import META_COLUMNS, quote_ident
from dblog.sources.base import ChunkSpec, SourceDialect

FULL_TABLE = 10**15


@dataclass
class VerifyReport:
    """The outcome of one table's comparison; ``ok`` when mirror == source (``lake``:
    what was compared, the mirror or the ``current state``)."""

    table: TableId
    source_rows: int
    mirror_rows: int
    missing_keys: list[tuple[Any, ...]] = field(default_factory=list)
    extra_keys: list[tuple[Any, ...]] = field(default_factory=list)
    different_keys: list[tuple[Any, ...]] = field(default_factory=list)
    differing: int = 0
    lake: str = "mirror"

    @property
    def ok(self) -> bool:
        return self.differing == 0 and self.source_rows == self.mirror_rows

    def summary(self) -> str:
        if self.ok:
            return f"{self.table}: OK ({self.source_rows} rows)"
        parts = [f"{self.table}: MISMATCH source={self.source_rows} "
                 f"{self.lake.replace(' ', '_')}={self.mirror_rows}"]
        for name, keys in ((f"missing in {self.lake}", self.missing_keys),
                           ("not in source", self.extra_keys),
                           ("different values", self.different_keys)):
            if keys:
                parts.append(f"  {name}: {', '.join(map(str, keys[:10]))}"
                             + (" ..." if len(keys) > 10 else ""))
        return "\n".join(parts)


def verify_table(dialect: SourceDialect, sink: DeltaSink, table: TableId,
                 sample: int = 50, *, current: bool = False) -> VerifyReport:
    """Compare mirror and source on the source's current columns; list differing keys.
    ``current``: compare the table's current state instead (the mirror with the changelog
    rows it has not merged yet applied, :func:`current_state`)."""
    spark = sink.spark
    schema = dialect.table_schema(table)
    source = dialect.read_chunk(spark, ChunkSpec(table, FULL_TABLE), schema).localCheckpoint()
    cols = [quote_ident(c) for c in schema.names]
    keys = [quote_ident(k) for k in schema.key]
    if sink.known_columns(table):
        mirror = (current_state(spark, sink.layout, table, sink.key_columns(table)) if current
                  else spark.read.format("delta").load(sink.layout.mirror(table)))
        present = set(mirror.columns)
        mirror = mirror.select(*[
            (F.col(quote_ident(c.name)) if c.name in present else F.lit(None))
            .cast(source.schema[c.name].dataType).alias(c.name)
            for c in schema.columns
        ]).drop(*META_COLUMNS)
    else:
        mirror = source.limit(0)
    source_only = source.select(*cols).exceptAll(mirror.select(*cols))
    mirror_only = mirror.select(*cols).exceptAll(source.select(*cols))
    src_keys = {tuple(r) for r in source_only.select(*keys).limit(10 * sample).collect()}
    mir_keys = {tuple(r) for r in mirror_only.select(*keys).limit(10 * sample).collect()}
    report = VerifyReport(table, source.count(), mirror.count(),
                          lake="current state" if current else "mirror")
    report.different_keys = sorted(src_keys & mir_keys, key=repr)[:sample]
    report.missing_keys = sorted(src_keys - mir_keys, key=repr)[:sample]
    report.extra_keys = sorted(mir_keys - src_keys, key=repr)[:sample]
    report.differing = source_only.count() + mirror_only.count()
    return report
