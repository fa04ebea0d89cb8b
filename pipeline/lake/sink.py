"""Writes the tailer's ordered micro-batches into Delta: changelog append + mirror MERGE.

The log tailer is the only writer of ``changelog`` and ``mirror``. Each micro-batch is one
commit per table, its rows tagged with the write attempt (``_dblog_attempt``); a batch
replayed after a crash or a takeover first fences off the earlier attempts at it (a CHECK
constraint that refuses their rows) and is skipped where one of them landed
(:meth:`DeltaSink.write_table_batch`). The mirror's MERGE carries Delta's idempotent-write
markers (``txnAppId`` = the source, ``txnVersion`` = the batch). Chunk rows never pass
through Python, and are written once: the capture that selected them writes them as the
changelog's files for the tailer's pin (:mod:`pipeline.lake.chunks`), and the batch's commit
adds those files as they are.

Changelog ``op`` values: ``c``/``u``/``d`` (log events), ``r`` (chunk rows at the high
watermark), ``d`` with a ``_dblog_window_id`` (a mirror row a complete chunk read proved gone,
at the high watermark, numbered with the chunk's ``r`` rows in key order) and ``t`` (TRUNCATE
or DROP: every row of the table before this position is gone). A capture's ``d`` rows are
numbered after every row its chunk selected.

The writer's idempotent-DML settings live in its own session, set only around its MERGE.
Schemas and table properties: :mod:`pipeline.lake.schemas`; typed literals and key
predicates: :mod:`pipeline.lake.predicates`; a merge's survey: :mod:`pipeline.lake.survey`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.chunking import KeyRange
from pipeline.errors import DblogError, LeadershipLost
from pipeline.events import Op, Position, TableId
from pipeline.handoff import ChunkFiles
from pipeline.lake.batches import BatchResult, EmissionResult, TableBatch
from pipeline.lake.chunks import keys_frame
from pipeline.lake.current import after_position, change_key, newest_first
from pipeline.lake.deltalog import (
    DeltaTxn,
    action_rows,
    files_dataframe,
    retry_concurrent_commits,
)
from pipeline.lake.fencing import WriteAttempt, WriteAttempts, fences_refusing
from pipeline.lake.layout import LakeLayout
from pipeline.lake.maintenance import Maintenance, MaintenanceReport
from pipeline.lake.mirror_progress import MirrorProgress
from pipeline.lake.predicates import (
    between,
    commit_time,
    epoch_micros,
    key_range_predicate,
    maybe_in,
    newer,
)
from pipeline.lake.schemas import (
    CHANGELOG_STATS,
    COLUMN_MAPPING,
    NO_CHANGE_FEED,
    RESERVED_COLUMNS,
    TABLE_PROPERTIES,
    TIMESTAMP_NTZ_FEATURE,
    TYPE_WIDENING,
    changelog_schema,
    mirror_schema,
    needs_column_mapping,
    table_properties,
    widens,
)
from pipeline.lake.survey import Survey as _Survey
from pipeline.lake.survey import fold_survey_groups, survey
from pipeline.lake.survey import survey as _survey
from pipeline.lake.tables import LakeTables, SchemaEvolutionError
from pipeline.lake.types import (
    ATTEMPT_COLUMN,
    META_COLUMNS,
    MIRROR_LSN,
    TRUNCATE_OP,
    WINDOW_COLUMN,
    coerce,
    name_apart,
    needs_coercion,
    quote_ident,
    spark_type,
    struct_of,
)
from pipeline.sources.base import Column, TableSchema
from pipeline.window import ChunkEmission

log = logging.getLogger(__name__)

__all__ = [
    "CHANGELOG_STATS", "COLUMN_MAPPING", "NO_CHANGE_FEED", "RESERVED_COLUMNS",
    "TABLE_PROPERTIES", "TIMESTAMP_NTZ_FEATURE", "TYPE_WIDENING", "BatchResult", "DeltaSink",
    "DeltaTxn", "EmissionResult", "MaintenanceReport", "SchemaEvolutionError", "TableBatch",
    "WriteAttempt", "_Survey", "_survey", "changelog_schema", "epoch_micros",
    "fold_survey_groups", "key_range_predicate", "mirror_schema", "needs_column_mapping",
    "retry_concurrent_commits", "table_properties", "widens",
]

_BROADCAST_KEYS = 200_000
"""At most this many keys that keep chunk rows out of a mirror's append are broadcast to the
join that finds them (a busy source's changes between two merges are far fewer)."""
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


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


@dataclass(frozen=True)
class _Appended:
    """What :meth:`DeltaSink._append_new_chunk_rows` appended to a mirror: the chunks
    (windows) it took rows of, how many rows, and the changes left to merge."""

    windows: set[str]
    rows: int
    remaining: DataFrame


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    return json.dumps(metadata, sort_keys=True, default=str)


class DeltaSink:
    """Delta writer for one source's tables (changelog, mirror)."""

    def __init__(self, spark: SparkSession, layout: LakeLayout) -> None:
        # Sessions with their own SQL conf: the mirror's MERGE sets Delta's idempotent-DML
        # markers (session settings), which nothing else may see.
        self.spark = spark.newSession()
        # The mirror merges in a thread of its own (pipeline.mirror), with its own session
        # for its idempotent-DML settings; the lock keeps ALTERs and compactions of the
        # mirror away from a running MERGE.
        self._mirror_spark = spark.newSession()
        self.mirror_lock = threading.RLock()
        self.layout = layout
        self.tables = LakeTables(self.spark, layout, self.mirror_lock)
        self.maintenance = Maintenance(self.spark, layout, self.mirror_lock)
        self.progress = MirrorProgress(self.spark, self._mirror_spark, layout)
        self.attempts = WriteAttempts(self.spark, layout, self.tables)

    # ---- tables and schema (pipeline.lake.tables) ---------------------------------------

    def known_columns(self, table: TableId) -> list[Column]:
        """The columns the lake holds for ``table`` (a superset of every schema seen)."""
        return self.tables.known_columns(table)

    def key_columns(self, table: TableId) -> tuple[str, ...]:
        """The table's key columns, as its lake tables record them."""
        return self.tables.key_columns(table)

    def ensure_tables(self, schema: TableSchema) -> None:
        """Create the table's Delta tables if the lake has none yet, and nothing else
        (:meth:`LakeTables.ensure_tables`)."""
        self.tables.ensure_tables(schema)

    def ensure_schema(self, schema: TableSchema) -> None:
        """Create the table's Delta tables, or add the columns they do not have yet
        (:meth:`LakeTables.ensure_schema`)."""
        self.tables.ensure_schema(schema)

    # ---- maintenance (by the one writer: the tailer, or `dblog maintain` in its place) --

    def maintain(self, table: TableId, *, vacuum: bool = False,
                 keep_uncommitted: bool = False) -> MaintenanceReport:
        """Compact (with ``vacuum`` also vacuum) the table's changelog and mirror
        (:meth:`Maintenance.maintain`)."""
        return self.maintenance.maintain(table, vacuum=vacuum,
                                         keep_uncommitted=keep_uncommitted)

    # ---- the ordered micro-batch -------------------------------------------------------

    @contextmanager
    def _txn(self, batch: int, metadata: Mapping[str, Any], app_id: str | None = None,
             spark: SparkSession | None = None) -> Iterator[None]:
        """Delta's idempotent-DML markers as the writer session's settings (a MERGE takes no
        write options); set only around the statement that needs them. Staging work runs in
        another session and never sees them."""
        conf = (spark or self.spark).conf
        conf.set(_TXN_APP, app_id or self.app_id)
        conf.set(_TXN_VERSION, str(batch))
        conf.set(_USER_METADATA, _metadata_json(metadata))
        try:
            yield
        finally:
            for key in (_TXN_APP, _TXN_VERSION, _USER_METADATA):
                conf.unset(key)

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

    def _coverage_deletes(
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
                or self.progress.truncated_unmerged(table):
            return None  # (after a truncate the mirror rows before it are gone already)
        types = {c.name: spark_type(c.spark_type) for c in columns}
        in_range = key_range_predicate(key, coverage, [types[k] for k in key])
        # Read before the mirror: a merge running meanwhile can only make this set larger
        # than needed.
        unmerged = (self.progress.unmerged(table).where(F.col("op") == Op.DELETE.value)
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
        columns = self.known_columns(table)
        if not columns or not self.tables.exists(self.layout.mirror(table)):
            return False
        key = self.key_columns(table)
        types = {c.name: spark_type(c.spark_type) for c in columns}
        in_range = key_range_predicate(key, key_range, [types[k] for k in key])
        path = self.layout.mirror(table)
        # A mirror without files (a first capture) reads nothing; then only the files whose
        # key statistics admit the range are read: a capture into new keys reads none.
        txn = DeltaTxn(self.spark, path)
        return bool(txn.file_count) and txn.rows_exist_where(in_range)

    def holds_changes_after(self, table: TableId, lsn: int) -> bool:
        """Whether ``table``'s changelog holds a row positioned after ``lsn`` (only the files
        whose statistics admit one are read)."""
        path = self.layout.changelog(table)
        if not self.tables.exists(path):
            return False
        return DeltaTxn(self.spark, path).rows_exist_where(F.col("_dblog_lsn") > F.lit(lsn))

    @property
    def app_id(self) -> str:
        """The default idempotent-write application id (a tailer passes its own)."""
        return f"dblog:{self.layout.source}"

    def write_table_batch(
        self, tb: TableBatch, batch: int, metadata: Mapping[str, Any], *,
        attempt: WriteAttempt | None = None, app_id: str | None = None,
        merge_mirror: bool = True,
    ) -> tuple[int, list[EmissionResult]]:
        """Commit one table's share of batch ``batch`` to the changelog and, with
        ``merge_mirror``, merge every changelog row the mirror lacks into it.

        ``attempt`` tags the rows (a fresh one without it). A replay (``attempt.earlier``)
        first fences the earlier attempts off (:meth:`_fence`) and writes nothing when one
        of them had committed this table's share: that commit holds the same batch (its
        content is fixed by the batch intent) and gives the emission counts. ``app_id``
        names the line of batches (commit metadata; the mirror MERGE's ``txnAppId``).
        Without ``merge_mirror`` the mirror follows later (:meth:`merge_mirror`), several
        batches at once. Every emission needs its chunk's files in ``tb.chunks``.

        Returns the number of log events written and each emission's row counts.
        """
        table = tb.table
        attempt = attempt or WriteAttempt()
        if not (tb.events or tb.truncates or tb.emissions):
            return 0, []
        missing = [em.window.window_id for em in tb.emissions
                   if em.window.window_id not in tb.chunks]
        if missing:
            raise DblogError(f"{table}: emissions without their chunk's files: {missing}")
        columns = self.known_columns(table)
        if not columns:
            raise DblogError(f"no schema known for {table}: ensure_schema first")
        key = self.key_columns(table)
        self.attempts.ensure_attempt_column(table)
        commit_metadata = {**metadata, "table": str(table), "dblog.app": app_id or self.app_id,
                           "dblog.attempt": attempt.id}
        counts: dict[str, tuple[int, int]] = {}
        if not self.attempts.written_before(table, attempt, commit_metadata):
            counts = self._commit_changelog(tb, columns, key, batch, attempt, commit_metadata)
        elif tb.emissions:
            # An earlier attempt's commit holds this share: the counts come from its rows.
            path = self.layout.changelog(table)
            emitted = self._count_emitted(self.attempts.committed_rows(
                table, self.attempts.commit_version(path, commit_metadata)))
            counts = {w: (emitted.get((w, Op.READ.value), 0), emitted.get((w, Op.DELETE.value), 0))
                      for w in tb.chunks}
        if tb.truncates:
            self.progress.note_truncates_written(table, [int(p.lsn) for p in tb.truncates])
        if tb.emissions:
            self.progress.note_emissions_written(table)
        if merge_mirror:
            self.merge_mirror(table, batch, commit_metadata, app_id=app_id)
        results = [
            EmissionResult(em.window.window_id, table, *counts.get(em.window.window_id, (0, 0)))
            for em in tb.emissions
        ]
        return len(tb.events), results

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
            if self.attempts.fenced_off(path, attempt.id):
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
            deletes = self._coverage_deletes(tb, em, files, columns, key, batch, attempt.id)
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

    # ---- the mirror follows the changelog ------------------------------------------------

    def mirror_lsn(self, table: TableId) -> int:
        """Every changelog row of ``table`` at or below this ``_dblog_lsn`` is in the mirror
        (:meth:`MirrorProgress.mirror_lsn`)."""
        return self.progress.mirror_lsn(table)

    def merge_mirror(self, table: TableId, batch: int, metadata: Mapping[str, Any], *,
                     app_id: str | None = None, through_lsn: int | None = None) -> int:
        """Merge the changelog rows the mirror lacks (up to ``through_lsn``; all without
        it) in one MERGE; returns how many rows that was (0: nothing to do, no commit).

        The MERGE carries the idempotent-write markers of ``batch`` (the last batch it
        covers), so a tailer that lost its lock and merges late is skipped by Delta, and
        its commit metadata records what it covers (:data:`MIRROR_LSN`). A merge repeated
        after a crash changes nothing: only changes newer by position are applied."""
        with self.mirror_lock:
            return self._merge_unmerged(table, batch, metadata, app_id, through_lsn)

    def _merge_unmerged(self, table: TableId, batch: int, metadata: Mapping[str, Any],
                        app_id: str | None, through_lsn: int | None) -> int:
        if not self.known_columns(table):
            return 0
        chunks_expected = self.progress.take_emissions_unsurveyed(table)
        changes = self.progress.unmerged(table, through_lsn, self._mirror_spark)
        first = self.key_columns(table)[0]
        dtype = spark_type(next(c.spark_type for c in self.known_columns(table)
                                if c.name == first))
        found = survey(changes, first, chunks_expected=chunks_expected, dtype=dtype)
        rows = found.rows
        if rows == 0:
            if through_lsn is not None:
                self.progress.set_mirror_lsn(table, max(self.mirror_lsn(table), through_lsn))
                self.progress.note_merged_through(table, through_lsn)
            return 0
        assert found.top is not None
        mark = int(through_lsn if through_lsn is not None else found.top)
        truncated = found.truncated
        if truncated is None and found.spans:
            began = time.monotonic()
            appended = self._append_new_chunk_rows(table, changes, found.spans, metadata,
                                                   mark, rows, (app_id or self.app_id, batch))
            if appended.windows:
                log.info("mirror of %s: %d rows of %d chunks appended in %.2fs; %d changes "
                         "left to merge", table, appended.rows, len(appended.windows),
                         time.monotonic() - began, rows - appended.rows)
            if appended.rows == rows:
                self.progress.set_mirror_lsn(table, mark)
                self.progress.note_merged_through(table, mark)
                return rows
            changes = appended.remaining

        def merge() -> None:
            with self._txn(batch, {**metadata, MIRROR_LSN: mark}, app_id, self._mirror_spark):
                self._merge_mirror(
                    table, changes, self.known_columns(table), self.key_columns(table),
                    Position(int(truncated[0]), int(truncated[1])) if truncated else None,
                    key_span=None if found.low is None else (found.low, found.high),
                )

        # Another writer of the mirror (a repair by hand) may commit first; the MERGE is
        # idempotent, so it runs again.
        retry_concurrent_commits(merge, pause_s=0.5)
        self.progress.set_mirror_lsn(table, mark)
        self.progress.note_merged_through(table, mark)
        return rows

    def _append_new_chunk_rows(self, table: TableId, changes: DataFrame, spans: list[Row],
                               metadata: Mapping[str, Any], mark: int, rows: int,
                               app: tuple[str, int]) -> _Appended:
        """Append the ``r`` rows of this merge's chunks whose keys the mirror lacks, in one
        commit, instead of merging them; the rest of ``changes`` is left to merge. That
        commit carries the merge's mark when it holds all ``rows``. ``spans``: each chunk's
        window, the least and greatest value of its rows' first key column, and how many
        rows it has (:func:`pipeline.lake.survey.survey`).

        A chunk whose key span holds no mirror file, or mirror files with fewer rows than
        half its own (a first capture while writers run: their changes reached the mirror
        first, scattered over the key space), has its rows appended but for those of keys
        the mirror holds or another of ``changes`` changes (merged with them, so that no
        change of this merge rewrites the appended files). Any other chunk (a capture over a
        mirror that holds most of its keys, such as a repair) is merged whole, as are chunks
        whose spans overlap another's of the same merge.

        ``changes`` may be read again after the append and then hold more rows (batches
        committed meanwhile): a row appended may then be merged as well, which changes
        nothing (its position is not newer than itself), and none is left out.

        The same as merging them: a MERGE would insert every appended row (no mirror row
        has its key), and the changes merged after them apply by position as they would
        have (older ones lose to a chunk row, newer ones win, a delete removes it). The
        mirror is read at the append's own snapshot and inside its transaction: a writer
        that adds a row in such a span meanwhile (a tailer that lost its lock, merging
        late) makes the commit fail, and then every change is merged. The append is also
        fenced like the MERGE (``app``: the line of batches and this merge's batch): it
        reads the line's recorded version, skips when another writer merged this far, and
        fails when one records a version meanwhile. A tailer that lost its lock could
        otherwise land a late append after the new leader merged deletes of the same keys
        (a MERGE of deletes of keys the mirror lacks changes no file in the span)."""
        nothing = _Appended(set(), 0, changes)
        key = self.key_columns(table)
        first = key[0]
        if not spans:
            return nothing
        columns = self.known_columns(table)
        dtype = spark_type(next(c.spark_type for c in columns if c.name == first))
        target = F.col(quote_ident(first))
        path = self.layout.mirror(table)
        txn = DeltaTxn(self._mirror_spark, path)
        if txn.app_version(app[0]) >= app[1]:
            return nothing  # merged this far by another writer: the MERGE is skipped too
        taken: dict[str, tuple[Any, Any]] = {}  # window -> span of the first key column
        crowded: list[tuple[Any, Any]] = []  # the spans of those that hold mirror files
        taken_count, crowded_rows = 0, 0
        for span in sorted(spans, key=lambda r: str(r["window"])):
            low, high = span["low"], span["high"]
            if any(not (high < lo or low > hi) for lo, hi in taken.values()):
                continue
            files, held = txn.records_where(between(target, low, high, dtype))
            if files and (held is None or 2 * held >= int(span["rows"])):
                continue
            taken[str(span["window"])] = (low, high)
            taken_count += int(span["rows"])
            if files:
                crowded.append((low, high))
                crowded_rows += held or 0
        if not taken:
            return nothing
        chosen = F.col(WINDOW_COLUMN).isin(sorted(taken)) & (F.col("op") == Op.READ.value)
        taken_rows = changes.where(chosen)
        others = changes.where(~chosen)
        new_rows, remaining = self._unblocked(
            taken_rows, others, rows - taken_count,
            crowded_keys=(self._mirror_keys_at(txn, key, crowded, dtype), crowded_rows)
            if crowded else None, key=key)
        schema = T.StructType.fromJson(json.loads(txn.schema_json))
        actions = txn.write_files(new_rows.select(*[
            (F.col(f.name) if f.name in META_COLUMNS
             else F.col("after").getField(f.name)).cast(f.dataType).alias(f.name)
            for f in schema.fields]))
        appended = action_rows(actions)
        if not appended:
            return nothing  # every row is merged: no empty commit
        whole = appended == rows
        meta = {**metadata, MIRROR_LSN: mark} if whole else dict(metadata)
        try:
            # Fenced as the MERGE is: a commit of another writer of this line of batches
            # (the tailer that took over, merging deletes of these keys) since this
            # transaction read the line's version makes it fail; a whole merge records the
            # batch, as the MERGE's own markers would.
            txn.commit(actions, meta, app=app if whole else None)
        except Exception as exc:
            if "Concurrent" not in type(exc).__name__ + str(exc):
                raise
            return nothing  # another writer in a span: everything is merged instead
        return _Appended(set(taken), appended, remaining)

    @staticmethod
    def _unblocked(taken_rows: DataFrame, others: DataFrame, others_count: int, *,
                   crowded_keys: tuple[DataFrame, int] | None, key: Sequence[str]
                   ) -> tuple[DataFrame, DataFrame]:
        """The chunk rows ``taken_rows`` split into those to append and those to merge
        (with ``others``): a row is kept out of the append by a key the mirror holds
        (``crowded_keys``: the mirror's keys in crowded spans and how many there are) or
        another change holds (``others``, ``others_count`` of them when counted; a later
        change would rewrite the appended file).

        Nothing can keep a row out when both are empty (a capture while the source is
        idle): then no join is planned. The keys are broadcast to the join when there are
        at most :data:`_BROADCAST_KEYS` of them; Spark would otherwise shuffle and sort
        every chunk row to find none. ``others`` may hold more rows than counted (batches
        committed meanwhile): a row appended then is merged as well, which changes
        nothing (see :meth:`_append_new_chunk_rows`)."""
        if not others_count and crowded_keys is None:
            return taken_rows, others
        blocking = others.select(*[change_key(k).alias(f"_held_{i}") for i, k in enumerate(key)])
        blocking_count = others_count
        if crowded_keys is not None:
            blocking = blocking.unionByName(crowded_keys[0])
            blocking_count += crowded_keys[1]
        if blocking_count <= _BROADCAST_KEYS:
            blocking = F.broadcast(blocking)
        same_key = reduce(lambda a, b: a & b, [
            F.col("after").getField(k) == F.col(f"_held_{i}") for i, k in enumerate(key)])
        return (taken_rows.join(blocking, same_key, "left_anti"),
                others.unionByName(taken_rows.join(blocking, same_key, "left_semi")))

    def _mirror_keys_at(self, txn: DeltaTxn, key: tuple[str, ...],
                        spans: Sequence[tuple[Any, Any]], dtype: T.DataType) -> DataFrame:
        """The keys of the mirror rows in ``spans`` (of the first key column) at ``txn``'s
        snapshot, as columns ``_held_0``, ``_held_1``, ...: the same rows however often
        the frame is computed, whatever is committed meanwhile."""
        target = F.col(quote_ident(key[0]))
        in_spans = reduce(lambda a, b: a | b, [between(target, low, high, dtype)
                                                for low, high in spans])
        return (self._mirror_spark.read.format("delta")
                .option("versionAsOf", txn.read_version).load(txn.path)
                .where(in_spans)
                .select(*[F.col(quote_ident(k)).alias(f"_held_{i}") for i, k in enumerate(key)]))

    @staticmethod
    def _count_emitted(changes: DataFrame) -> dict[tuple[str, str], int]:
        """Rows per (window, op) among a batch's emissions."""
        counts = (changes.where(F.col(WINDOW_COLUMN).isNotNull())
                  .groupBy(WINDOW_COLUMN, "op").count().collect())
        return {(r[WINDOW_COLUMN], r["op"]): int(r["count"]) for r in counts}

    def _merge_mirror(
        self,
        table: TableId,
        changes: DataFrame,
        columns: list[Column],
        key: tuple[str, ...],
        truncated: Position | None = None,
        *,
        key_span: tuple[Any, Any] | None = None,
    ) -> None:
        """One MERGE: the latest change per key wins if newer than the mirror row; with a
        truncate in the batch, only changes after the last one apply and every mirror row
        older than it is deleted.

        The target is pruned to the changes' span of the first key column (``key_span``):
        Delta then skips mirror files whose key statistics lie
        outside it (chunks and appends at the end of the key space touch few files). It
        changes nothing else: every source row's key lies in the span."""
        from delta.tables import DeltaTable

        changes = changes.where(F.col("op") != TRUNCATE_OP)
        if truncated is not None:
            changes = changes.where(after_position(truncated.lsn, truncated.seq))

        # The change's op and its rank beside the table's columns, named apart from them.
        names = [c.name for c in columns]
        op, rank = name_apart("_dblog_op", names), name_apart("_dblog_rank", names)
        flat = changes.select(
            *[change_key(k) for k in key],
            F.col("op").alias(op),
            *[F.col("after").getField(c.name).alias(c.name) for c in columns if c.name not in key],
            F.col("_dblog_lsn"),
            F.col("_dblog_seq"),
        )
        last = (flat.withColumn(rank, F.row_number().over(newest_first(key)))
                .where(F.col(quote_ident(rank)) == 1).drop(rank))
        on: str | SparkColumn = " AND ".join(
            f"t.{quote_ident(k)} <=> s.{quote_ident(k)}" for k in key)
        if truncated is None:
            first = key[0]
            if key_span is not None:
                dtype = spark_type(next(c.spark_type for c in columns if c.name == first))
                target = F.col(f"t.{quote_ident(first)}")
                on = F.expr(str(on)) & between(target, *key_span, dtype)
        values: dict[str, str | SparkColumn] = {
            quote_ident(c.name): f"s.{quote_ident(c.name)}" for c in columns
        }
        values.update({m: f"s.{m}" for m in META_COLUMNS})
        merge = (
            DeltaTable.forPath(self._mirror_spark, self.layout.mirror(table)).alias("t")
            .merge(last.alias("s"), on)
            .whenMatchedDelete(condition=f"s.{quote_ident(op)} = 'd' AND {newer('s', 't')}")
            .whenMatchedUpdate(condition=f"s.{quote_ident(op)} <> 'd' AND {newer('s', 't')}",
                               set=values)
            .whenNotMatchedInsert(condition=f"s.{quote_ident(op)} <> 'd'", values=values)
        )
        if truncated is not None:
            lsn, seq = int(truncated.lsn), int(truncated.seq)
            merge = merge.whenNotMatchedBySourceDelete(
                condition=f"t._dblog_lsn < {lsn} OR (t._dblog_lsn = {lsn} AND t._dblog_seq < {seq})"
            )
        merge.execute()
