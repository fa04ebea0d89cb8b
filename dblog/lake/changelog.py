"""The changelog commit of a table's share of a micro-batch.

Each micro-batch is one commit per table, its rows tagged with the write attempt
(``_dblog_attempt``): the batch's log events (and truncates) as one file in log order, each
chunk emission's files as its capture wrote them (:mod:`dblog.lake.chunks`), and the
emission's capture deletes (:mod:`dblog.lake.coverage`). A replay first fences the earlier
attempts off (:mod:`dblog.lake.fencing`) and writes nothing where one of them landed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from dblog.core.errors import DblogError, LeadershipLost
from dblog.core.events import Op, TableId
from dblog.lake.batches import EmissionResult, TableBatch
from dblog.lake.coverage import CoverageDeletes
from dblog.lake.deltalog import DeltaTxn, action_rows, files_dataframe
from dblog.lake.fencing import WriteAttempt, WriteAttempts, fences_refusing
from dblog.lake.layout import LakeLayout
from dblog.lake.mirror_progress import MirrorProgress
from dblog.lake.predicates import commit_time
from dblog.lake.schemas import changelog_schema
from dblog.lake.tables import LakeTables
from dblog.lake.types import (
    ATTEMPT_COLUMN,
    TRUNCATE_OP,
    WINDOW_COLUMN,
    coerce,
    needs_coercion,
    spark_type,
)
from dblog.sources.base import Column

_READY_TYPES: dict[type[T.DataType], type] = {
    T.DecimalType: Decimal, T.DoubleType: float, T.FloatType: float,
    T.TimestampType: datetime, T.TimestampNTZType: datetime,
}
"""Per lake type, the Python type :func:`coerce` returns unchanged."""


def _image_array(images: Sequence[Mapping[str, Any] | None], columns: Sequence[Column],
                 arrow_type: pa.StructType) -> pa.StructArray:
    """Row images (``None`` = no image) as one Arrow struct column of the lake's types.

    Values follow the lake column's type: a batch can hold rows decoded with an older,
    narrower source type (a DATE before an ALTER to DATETIME, an INT before DOUBLE)."""
    children = []
    for i, col in enumerate(columns):
        dtype = spark_type(col.spark_type)
        name = col.name
        values = [None if img is None else img.get(name) for img in images]
        if needs_coercion(dtype):
            ready = _READY_TYPES.get(type(dtype))  # values of this type need nothing
            values = [v if v is None or type(v) is ready else coerce(v, dtype) for v in values]
        children.append(pa.array(values, arrow_type.field(i).type))
    mask = pa.array([img is None for img in images], pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(arrow_type), mask=mask)



def count_emitted(changes: DataFrame) -> dict[tuple[str, str], int]:
    """Rows per (window, op) among a batch's emissions."""
    counts = (changes.where(F.col(WINDOW_COLUMN).isNotNull())
              .groupBy(WINDOW_COLUMN, "op").count().collect())
    return {(r[WINDOW_COLUMN], r["op"]): int(r["count"]) for r in counts}


@dataclass(frozen=True)
class WrittenShare:
    """A table's share of a batch in the changelog: the metadata of its commit (the mirror's
    MERGE records it too) and each emission's row counts."""

    metadata: dict[str, Any]
    results: list[EmissionResult]


class Changelog:
    """Writes each table's share of a micro-batch to its changelog, in one commit."""

    def __init__(self, spark: SparkSession, layout: LakeLayout, tables: LakeTables,
                 attempts: WriteAttempts, progress: MirrorProgress, coverage: CoverageDeletes,
                 app_id: str) -> None:
        self.spark = spark
        self.layout = layout
        self._tables = tables
        self._attempts = attempts
        self._progress = progress
        self._coverage = coverage
        self._app_id = app_id

    def write(self, tb: TableBatch, batch: int, metadata: Mapping[str, Any], *,
              attempt: WriteAttempt | None = None, app_id: str | None = None
              ) -> WrittenShare | None:
        """Commit one table's share of batch ``batch`` (None: the share is empty), or find
        the commit an earlier attempt made of it (see ``DeltaSink.write_table_batch``)."""
        table = tb.table
        attempt = attempt or WriteAttempt()
        if not (tb.events or tb.truncates or tb.emissions):
            return None
        missing = [em.window.window_id for em in tb.emissions
                   if em.window.window_id not in tb.chunks]
        if missing:
            raise DblogError(f"{table}: emissions without their chunk's files: {missing}")
        columns = self._tables.known_columns(table)
        if not columns:
            raise DblogError(f"no schema known for {table}: ensure_schema first")
        key = self._tables.key_columns(table)
        self._attempts.ensure_attempt_column(table)
        commit_metadata = {**metadata, "table": str(table),
                           "dblog.app": app_id or self._app_id, "dblog.attempt": attempt.id}
        counts: dict[str, tuple[int, int]] = {}
        if not self._attempts.written_before(table, attempt, commit_metadata):
            counts = self._commit_changelog(tb, columns, key, batch, attempt, commit_metadata)
        elif tb.emissions:
            counts = self._earlier_counts(tb, commit_metadata)
        if tb.truncates:
            self._progress.note_truncates_written(table, [int(p.lsn) for p in tb.truncates])
        if tb.emissions:
            self._progress.note_emissions_written(table)
        results = [
            EmissionResult(em.window.window_id, table, *counts.get(em.window.window_id, (0, 0)))
            for em in tb.emissions
        ]
        return WrittenShare(commit_metadata, results)

    def _earlier_counts(self, tb: TableBatch, commit_metadata: Mapping[str, Any]
                        ) -> dict[str, tuple[int, int]]:
        """Each emission's ``r`` and ``d`` rows, from the rows of the commit an earlier
        attempt made of this share."""
        # An earlier attempt's commit holds this share: the counts come from its rows.
        table = tb.table
        path = self.layout.changelog(table)
        emitted = count_emitted(self._attempts.committed_rows(
            table, self._attempts.commit_version(path, commit_metadata)))
        return {w: (emitted.get((w, Op.READ.value), 0), emitted.get((w, Op.DELETE.value), 0))
                for w in tb.chunks}

    def _commit_changelog(
        self, tb: TableBatch, columns: list[Column], key: tuple[str, ...], batch: int,
        attempt: WriteAttempt, metadata: Mapping[str, Any],
    ) -> dict[str, tuple[int, int]]:
        """One changelog commit of the table's share: its log events (and truncates) written
        as one file in log order, each chunk's files as its capture wrote them for this
        attempt (files written for another attempt are read and written again with this
        one's tags), and capture deletes. Returns each emission's ``r`` and ``d`` rows.

        Delta's ``txnAppId`` is not used: it reconstructs the table's whole snapshot state on
        every commit (two thirds of a warm append's JVM time); write attempts guard replays.
        """
        table = tb.table
        path = self.layout.changelog(table)
        try:
            return self._write_share(tb, columns, key, batch, attempt, metadata)
        except Exception as exc:
            if self._attempts.fenced_off(path, attempt.id):
                raise LeadershipLost(
                    f"batch {batch} of {table} was fenced off: another tailer took this "
                    "batch over, so this one stops writing") from exc
            raise

    def _write_share(
        self, tb: TableBatch, columns: list[Column], key: tuple[str, ...], batch: int,
        attempt: WriteAttempt, metadata: Mapping[str, Any],
    ) -> dict[str, tuple[int, int]]:
        """:meth:`_commit_changelog`'s transaction (the fence's refusal raises)."""
        path = self.layout.changelog(tb.table)
        txn = DeltaTxn(self.spark, path)
        actions: list[str] = []
        counts: dict[str, tuple[int, int]] = {}
        if tb.events or tb.truncates:
            events = self._events_df(tb, columns, batch, attempt.id)
            # One file in position order: log events come in log order, partition after
            # partition (joined without a shuffle); truncates are sorted in among them.
            events = (events.repartition(1).sortWithinPartitions("_dblog_lsn", "_dblog_seq")
                      if tb.truncates else events.coalesce(1))
            actions += txn.write_files(events)
        for em in tb.emissions:
            wid = em.window.window_id
            files = tb.chunks[wid]
            if (files.batch, files.attempt, files.table_id) == (batch, attempt.id, txn.table_id):
                chunk = list(files.actions)
            else:
                chunk = txn.write_files(
                    files_dataframe(self.spark, path, files.actions)
                    .withColumn("_dblog_batch", F.lit(batch).cast(T.LongType()))
                    .withColumn(ATTEMPT_COLUMN, F.lit(attempt.id)))
            deletes = self._coverage.deletes(tb, em, files, columns, key, batch, attempt.id)
            deleted = txn.write_files(deletes) if deletes is not None else []
            actions += chunk + deleted
            counts[wid] = (action_rows(chunk), action_rows(deleted))
        if not actions:
            return counts  # nothing to add (chunks without rows): no commit
        # A chunk's files are added without passing through the writer, which enforces the
        # fence on the rows it writes: the transaction's own metadata says it here (a fence
        # added after it read conflicts with its commit).
        fences = fences_refusing(txn.configuration(), attempt.id)
        if fences:
            raise DblogError(f"{path} refuses attempt {attempt.id} ({fences[0]})")
        txn.commit(actions, metadata)
        return counts

    def _events_df(self, tb: TableBatch, columns: list[Column], batch: int,
                   attempt: str) -> DataFrame:
        """The batch's log events (and truncates) as changelog rows, handed to Spark as one
        Arrow table: column by column, no per-row Python objects on the JVM side."""
        schema = changelog_schema(columns)
        arrow_schema = to_arrow_schema(schema)
        events = tb.events
        n_truncates = len(tb.truncates)
        rows = len(events) + n_truncates
        source_type = arrow_schema.field("source").type
        source = pa.StructArray.from_arrays(
            [pa.array([self.layout.source] * rows, pa.string()),
             pa.array([tb.table.database] * rows, pa.string()),
             pa.array([tb.table.table] * rows, pa.string()),
             pa.array([commit_time(ev.commit_ts_ms) for ev in events] + [None] * n_truncates,
                      source_type.field("commit_ts").type)],
            fields=list(source_type),
        )
        arrays = [
            pa.array([ev.op.value for ev in events] + [TRUNCATE_OP] * n_truncates, pa.string()),
            _image_array([ev.before for ev in events] + [None] * n_truncates, columns,
                         arrow_schema.field("before").type),
            _image_array([ev.after for ev in events] + [None] * n_truncates, columns,
                         arrow_schema.field("after").type),
            source,
            pa.array([ev.position.lsn for ev in events] + [p.lsn for p in tb.truncates],
                     pa.int64()),
            pa.array([ev.position.seq for ev in events] + [p.seq for p in tb.truncates],
                     pa.int64()),
            pa.array([ev.window_id for ev in events] + [None] * n_truncates, pa.string()),
            pa.array([batch] * rows, pa.int64()),
            pa.array([attempt] * rows, pa.string()),
        ]
        table = pa.Table.from_arrays(arrays, schema=arrow_schema)
        return self.spark.createDataFrame(table, schema)

    def holds_changes_after(self, table: TableId, lsn: int) -> bool:
        """Whether ``table``'s changelog holds a row positioned after ``lsn`` (only the files
        whose statistics admit one are read)."""
        path = self.layout.changelog(table)
        if not self._tables.exists(path):
            return False
        return DeltaTxn(self.spark, path).rows_exist_where(F.col("_dblog_lsn") > F.lit(lsn))

