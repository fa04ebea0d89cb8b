"""The mirror follows the changelog: the changelog rows it lacks, merged in one MERGE.

The mirror's MERGE carries Delta's idempotent-write markers (``txnAppId`` = the source,
``txnVersion`` = the batch). The writer's idempotent-DML settings live in its own session
(the mirror merger's), set only around its MERGE. The merger runs in a thread of its own
(:mod:`dblog.tail.merger`); the mirror lock keeps ALTERs and compactions of the mirror away
from a running MERGE.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dblog.core.events import Position, TableId
from dblog.lake.current import after_position, change_key, newest_first
from dblog.lake.deltalog import retry_concurrent_commits
from dblog.lake.layout import LakeLayout
from dblog.lake.mirror_append import ChunkAppender
from dblog.lake.mirror_progress import MirrorProgress
from dblog.lake.predicates import between, newer
from dblog.lake.survey import Survey, survey
from dblog.lake.tables import LakeTables
from dblog.lake.types import (
    META_COLUMNS,
    MIRROR_LSN,
    TRUNCATE_OP,
    name_apart,
    quote_ident,
    spark_type,
)
from dblog.sources.base import Column

log = logging.getLogger(__name__)

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def _metadata_json(metadata: Mapping[str, Any]) -> str:
    return json.dumps(metadata, sort_keys=True, default=str)


class MirrorMerge:
    """Merges the changelog rows a table's mirror lacks into it (called through the sink,
    from the tailer or the mirror merger's thread, :class:`dblog.tail.merger.MirrorMerger`)."""

    def __init__(self, mirror_spark: SparkSession, layout: LakeLayout, tables: LakeTables,
                 progress: MirrorProgress, mirror_lock: threading.RLock, app_id: str) -> None:
        self._mirror_spark = mirror_spark
        self.layout = layout
        self._tables = tables
        self._progress = progress
        self._mirror_lock = mirror_lock
        self._app_id = app_id
        self._appender = ChunkAppender(mirror_spark, layout, tables)

    @contextmanager
    def _txn(self, batch: int, metadata: Mapping[str, Any], app_id: str | None = None
             ) -> Iterator[None]:
        """Delta's idempotent-DML markers as the writer session's settings (a MERGE takes no
        write options); set only around the statement that needs them. Staging work runs in
        another session and never sees them."""
        conf = self._mirror_spark.conf
        conf.set(_TXN_APP, app_id or self._app_id)
        conf.set(_TXN_VERSION, str(batch))
        conf.set(_USER_METADATA, _metadata_json(metadata))
        try:
            yield
        finally:
            for key in (_TXN_APP, _TXN_VERSION, _USER_METADATA):
                conf.unset(key)

    def merge_mirror(self, table: TableId, batch: int, metadata: Mapping[str, Any], *,
                     app_id: str | None = None, through_lsn: int | None = None) -> int:
        """Merge the changelog rows the mirror lacks (up to ``through_lsn``; all without
        it) in one MERGE; returns how many rows that was (0: nothing to do, no commit).

        The MERGE carries the idempotent-write markers of ``batch`` (the last batch it
        covers), so a tailer that lost its lock and merges late is skipped by Delta, and
        its commit metadata records what it covers (:data:`MIRROR_LSN`). A merge repeated
        after a crash changes nothing: only changes newer by position are applied."""
        with self._mirror_lock:
            return self._merge_unmerged(table, batch, metadata, app_id, through_lsn)

    def _merge_unmerged(self, table: TableId, batch: int, metadata: Mapping[str, Any],
                        app_id: str | None, through_lsn: int | None) -> int:
        if not self._tables.known_columns(table):
            return 0
        chunks_expected = self._progress.take_emissions_unsurveyed(table)
        changes = self._progress.unmerged(table, through_lsn, self._mirror_spark)
        first = self._tables.key_columns(table)[0]
        dtype = spark_type(next(c.spark_type for c in self._tables.known_columns(table)
                                if c.name == first))
        found = survey(changes, first, chunks_expected=chunks_expected, dtype=dtype)
        rows = found.rows
        if rows == 0:
            if through_lsn is not None:
                self._progress.set_mirror_lsn(
                    table, max(self._progress.mirror_lsn(table), through_lsn))
                self._progress.note_merged_through(table, through_lsn)
            return 0
        assert found.top is not None
        mark = int(through_lsn if through_lsn is not None else found.top)
        truncated = found.truncated
        if truncated is None and found.spans:
            remaining = self._append_chunks(table, changes, found, metadata, mark,
                                            (app_id or self._app_id, batch))
            if remaining is None:
                self._merged_through(table, mark)
                return rows
            changes = remaining

        def merge() -> None:
            with self._txn(batch, {**metadata, MIRROR_LSN: mark}, app_id):
                self._merge_mirror(
                    table, changes, self._tables.known_columns(table),
                    self._tables.key_columns(table),
                    Position(int(truncated[0]), int(truncated[1])) if truncated else None,
                    key_span=None if found.low is None else (found.low, found.high),
                )

        # Another writer of the mirror (a repair by hand) may commit first; the MERGE is
        # idempotent, so it runs again.
        retry_concurrent_commits(merge, pause_s=0.5)
        self._merged_through(table, mark)
        return rows

    def _append_chunks(self, table: TableId, changes: DataFrame, found: Survey,
                       metadata: Mapping[str, Any], mark: int, app: tuple[str, int]
                       ) -> DataFrame | None:
        """Append the new chunk rows among ``changes``
        (:meth:`ChunkAppender.append_new_chunk_rows`); the changes left to merge, None when
        the append took every one."""
        rows = found.rows
        began = time.monotonic()
        appended = self._appender.append_new_chunk_rows(table, changes, found.spans, metadata,
                                                        mark, rows, app)
        if appended.windows:
            log.info("mirror of %s: %d rows of %d chunks appended in %.2fs; %d changes "
                     "left to merge", table, appended.rows, len(appended.windows),
                     time.monotonic() - began, rows - appended.rows)
        if appended.rows == rows:
            return None
        return appended.remaining

    def _merged_through(self, table: TableId, mark: int) -> None:
        """The mirror holds every changelog row of ``table`` at or below ``mark``."""
        self._progress.set_mirror_lsn(table, mark)
        self._progress.note_merged_through(table, mark)

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
        last, op = _latest_per_key(changes, columns, key)
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


def _latest_per_key(changes: DataFrame, columns: list[Column], key: tuple[str, ...]
                    ) -> tuple[DataFrame, str]:
    """The latest of ``changes`` per key, flattened to the mirror's columns, its op in a
    column beside them; and that column's name."""
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
    return last, op
