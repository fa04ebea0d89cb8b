"""Capture deletes: mirror keys a complete chunk read proved gone from the source.

An emission with coverage (the key range its chunk select read completely) deletes the mirror
rows in that range the chunk lacks: they are written to the changelog as ``d`` rows at the
high watermark, numbered in key order after every row the chunk selected.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dblog.core.chunking import KeyRange
from dblog.core.events import Op, TableId
from dblog.core.window import ChunkEmission
from dblog.lake.batches import TableBatch
from dblog.lake.chunks import keys_frame
from dblog.lake.current import change_key
from dblog.lake.deltalog import DeltaTxn, files_dataframe
from dblog.lake.layout import LakeLayout
from dblog.lake.mirror_progress import MirrorProgress
from dblog.lake.predicates import commit_time, key_range_predicate, maybe_in
from dblog.lake.tables import LakeTables
from dblog.lake.types import ATTEMPT_COLUMN, WINDOW_COLUMN, quote_ident, spark_type, struct_of
from dblog.protocol.chunks import ChunkFiles
from dblog.sources.base import Column


class CoverageDeletes:
    """Finds the mirror rows an emission's complete chunk read proved gone."""

    def __init__(self, spark: SparkSession, layout: LakeLayout, tables: LakeTables,
                 progress: MirrorProgress) -> None:
        self.spark = spark
        self.layout = layout
        self._tables = tables
        self._progress = progress

    def deletes(
        self, tb: TableBatch, em: ChunkEmission, files: ChunkFiles, columns: list[Column],
        key: tuple[str, ...], batch: int, attempt: str,
    ) -> DataFrame | None:
        """The ``d`` rows of an emission with coverage: mirror keys in the range its chunk
        read completely that the chunk lacks, at the high watermark, numbered in key order
        after every row the chunk selected. None when there can be none: no coverage, or a
        truncate before it. (The tailer gives no coverage where :meth:`mirror_holds` found
        no row when it pinned the window.)

        Keys the window dropped, keys this batch's log events change before the high
        watermark (the mirror row is stale for them; a log ``d`` already says when one went
        away) and keys deleted by changelog rows the mirror has not merged yet still exist
        or are gone already: they are left out."""
        table = tb.table
        coverage = tb.coverage.get(em.window.window_id)
        if coverage is None or any(t < em.position for t in tb.truncates) \
                or self._progress.truncated_unmerged(table):
            return None  # (after a truncate the mirror rows before it are gone already)
        types = {c.name: spark_type(c.spark_type) for c in columns}
        in_range = key_range_predicate(key, coverage, [types[k] for k in key])
        # Read before the mirror: a merge running meanwhile can only make this set larger
        # than needed.
        unmerged = (self._progress.unmerged(table).where(F.col("op") == Op.DELETE.value)
                    .select(*[change_key(k) for k in key]).where(in_range))
        in_mirror = self.spark.read.format("delta").load(self.layout.mirror(table)) \
            .where(in_range)
        chunk_keys = files_dataframe(self.spark, self.layout.changelog(table), files.actions) \
            .select(*[F.col("after").getField(k).alias(k) for k in key])
        gone = in_mirror.join(chunk_keys, on=list(key), how="left_anti")
        gone = gone.join(unmerged, on=list(key), how="left_anti")
        kept = set(em.dropped_keys) | {
            ev.key for ev in tb.events
            if ev.position < em.position and maybe_in(coverage, ev.key)}
        if kept:
            gone = gone.join(keys_frame(self.spark, list(kept), key, types),
                             on=list(key), how="left_anti")
        return self._delete_rows(gone, table, em, files, columns, key, batch, attempt)

    def _delete_rows(
        self, gone: DataFrame, table: TableId, em: ChunkEmission, files: ChunkFiles,
        columns: list[Column], key: tuple[str, ...], batch: int, attempt: str,
    ) -> DataFrame:
        """The mirror rows ``gone`` as changelog ``d`` rows of the emission, in one file."""
        types = {c.name: spark_type(c.spark_type) for c in columns}
        row_type = struct_of(columns)
        order = Window.orderBy(*[F.col(quote_ident(k)) for k in key])
        return gone.select(
            F.lit(Op.DELETE.value).alias("op"),
            F.struct(*[F.col(quote_ident(c.name)).cast(types[c.name]).alias(c.name)
                       for c in columns]).alias("before"),
            F.lit(None).cast(row_type).alias("after"),
            F.struct(
                F.lit(self.layout.source).alias("name"),
                F.lit(table.database).alias("database"),
                F.lit(table.table).alias("table"),
                F.lit(commit_time(em.commit_ts_ms)).cast(T.TimestampType()).alias("commit_ts"),
            ).alias("source"),
            F.lit(em.position.lsn).cast(T.LongType()).alias("_dblog_lsn"),
            (F.lit(em.position.seq + files.selected) + F.row_number().over(order))
            .cast(T.LongType()).alias("_dblog_seq"),
            F.lit(em.window.window_id).alias(WINDOW_COLUMN),
            F.lit(batch).cast(T.LongType()).alias("_dblog_batch"),
            F.lit(attempt).alias(ATTEMPT_COLUMN),
        ).coalesce(1)

    def mirror_holds(self, table: TableId, key_range: KeyRange) -> bool:
        """Whether the mirror holds a row in ``key_range`` (a capture's coverage).

        A mirror without one then never has a row a chunk of that range can prove gone:
        a merge that lands later only adds rows of keys the chunk holds, was told of
        (dropped, changed before its high watermark) or saw deleted, since every
        changelog row from before a gap in the log is merged before the tailer reads past
        it (``Tailer._merge_before_the_gap``). So the tailer may ask at any time between
        the chunk's pin and its batch's write: it asks in a thread of its own while the
        capture writes the chunk's files."""
        columns = self._tables.known_columns(table)
        if not columns or not self._tables.exists(self.layout.mirror(table)):
            return False
        key = self._tables.key_columns(table)
        types = {c.name: spark_type(c.spark_type) for c in columns}
        in_range = key_range_predicate(key, key_range, [types[k] for k in key])
        path = self.layout.mirror(table)
        # A mirror without files (a first capture) reads nothing; then only the files whose
        # key statistics admit the range are read: a capture into new keys reads none.
        txn = DeltaTxn(self.spark, path)
        return bool(txn.file_count) and txn.rows_exist_where(in_range)
