"""Writes the tailer's ordered micro-batches into Delta: changelog append + mirror MERGE.

The log tailer is the only writer of ``changelog`` and ``mirror``. Each micro-batch is one
commit per table, its rows tagged with the write attempt (``_dblog_attempt``); a batch
replayed after a crash or a takeover first fences off the earlier attempts at it (a CHECK
constraint that refuses their rows) and is skipped where one of them landed
(:meth:`DeltaSink.write_table_batch`). The mirror's MERGE carries Delta's idempotent-write
markers (``txnAppId`` = the source, ``txnVersion`` = the batch). Chunk rows never pass
through Python, and are written once: the capture that selected them writes them as the
changelog's files for the tailer's pin (:mod:`dblog.lake.chunks`), and the batch's commit
adds those files as they are.

Changelog ``op`` values: ``c``/``u``/``d`` (log events), ``r`` (chunk rows at the high
watermark), ``d`` with a ``_dblog_window_id`` (a mirror row a complete chunk read proved gone,
at the high watermark, numbered with the chunk's ``r`` rows in key order) and ``t`` (TRUNCATE
or DROP: every row of the table before this position is gone). A capture's ``d`` rows are
numbered after every row its chunk selected.

:class:`DeltaSink` is a facade over the parts that do the work, each in its own module:

- :mod:`dblog.lake.tables`: creation, schema evolution, properties
  (:mod:`dblog.lake.schemas`: the tables' schemas and properties);
- :mod:`dblog.lake.changelog`: the changelog commit of a table's share of a batch
  (:mod:`dblog.lake.coverage`: its capture deletes);
- :mod:`dblog.lake.fencing`: write attempts, and fencing earlier ones off;
- :mod:`dblog.lake.mirror_merge`: the mirror MERGE (:mod:`dblog.lake.mirror_append`:
  chunk rows appended instead; :mod:`dblog.lake.survey`: what a merge plans with;
  :mod:`dblog.lake.mirror_progress`: how far the mirror is);
- :mod:`dblog.lake.maintenance`: compaction and VACUUM;
- :mod:`dblog.lake.predicates`: typed key literals and predicates.

The parts are composed, not inherited: each receives the shared state it needs (the two
Spark sessions, the mirror lock, the :class:`LakeTables` that owns the column and key caches
and the schema lock, the :class:`MirrorProgress` the tailer and the mirror merger share).
Every name other modules import from here is re-exported.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

from dblog.core.chunking import KeyRange
from dblog.core.events import TableId
from dblog.lake.batches import BatchResult, EmissionResult, TableBatch
from dblog.lake.changelog import Changelog
from dblog.lake.coverage import CoverageDeletes
from dblog.lake.deltalog import DeltaTxn, retry_concurrent_commits
from dblog.lake.fencing import WriteAttempt, WriteAttempts
from dblog.lake.layout import LakeLayout
from dblog.lake.maintenance import Maintenance, MaintenanceReport
from dblog.lake.mirror_merge import MirrorMerge
from dblog.lake.mirror_progress import MirrorProgress
from dblog.lake.predicates import epoch_micros, key_range_predicate
from dblog.lake.schemas import (
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
from dblog.lake.survey import Survey as _Survey
from dblog.lake.survey import fold_survey_groups
from dblog.lake.survey import survey as _survey
from dblog.lake.tables import LakeTables, SchemaEvolutionError
from dblog.sources.base import Column, TableSchema

__all__ = [
    "CHANGELOG_STATS", "COLUMN_MAPPING", "NO_CHANGE_FEED", "RESERVED_COLUMNS",
    "TABLE_PROPERTIES", "TIMESTAMP_NTZ_FEATURE", "TYPE_WIDENING", "BatchResult", "DeltaSink",
    "DeltaTxn", "EmissionResult", "MaintenanceReport", "SchemaEvolutionError", "TableBatch",
    "WriteAttempt", "_Survey", "_survey", "changelog_schema", "epoch_micros",
    "fold_survey_groups", "key_range_predicate", "mirror_schema", "needs_column_mapping",
    "retry_concurrent_commits", "table_properties", "widens",
]


class DeltaSink:
    """Delta writer for one source's tables (changelog, mirror).

    Its parts: ``tables`` (:class:`LakeTables`), ``attempts`` (:class:`WriteAttempts`),
    ``progress`` (:class:`MirrorProgress`), ``coverage`` (:class:`CoverageDeletes`),
    ``changelog`` (:class:`Changelog`), ``merger`` (:class:`MirrorMerge`) and
    ``maintenance`` (:class:`Maintenance`)."""

    def __init__(self, spark: SparkSession, layout: LakeLayout) -> None:
        # Sessions with their own SQL conf: the mirror's MERGE sets Delta's idempotent-DML
        # markers (session settings), which nothing else may see.
        self.spark = spark.newSession()
        # The mirror merges in a thread of its own (dblog.tail.merger), with its own session
        # for its idempotent-DML settings; the lock keeps ALTERs and compactions of the
        # mirror away from a running MERGE.
        self._mirror_spark = spark.newSession()
        self.mirror_lock = threading.RLock()
        self.layout = layout
        self.tables = LakeTables(self.spark, layout, self.mirror_lock)
        self.progress = MirrorProgress(self.spark, self._mirror_spark, layout)
        self.attempts = WriteAttempts(self.spark, layout, self.tables)
        self.coverage = CoverageDeletes(self.spark, layout, self.tables, self.progress)
        self.changelog = Changelog(self.spark, layout, self.tables, self.attempts,
                                   self.progress, self.coverage, self.app_id)
        self.merger = MirrorMerge(self._mirror_spark, layout, self.tables, self.progress,
                                  self.mirror_lock, self.app_id)
        self.maintenance = Maintenance(self.spark, layout, self.mirror_lock)

    @property
    def app_id(self) -> str:
        """The default idempotent-write application id (a tailer passes its own)."""
        return f"dblog:{self.layout.source}"

    # ---- tables and schema ------------------------------------------------------------

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

    def mirror_holds(self, table: TableId, key_range: KeyRange) -> bool:
        """Whether the mirror holds a row in ``key_range`` (a capture's coverage; see
        :meth:`dblog.lake.coverage.CoverageDeletes.mirror_holds`)."""
        return self.coverage.mirror_holds(table, key_range)

    def holds_changes_after(self, table: TableId, lsn: int) -> bool:
        """Whether ``table``'s changelog holds a row positioned after ``lsn``."""
        return self.changelog.holds_changes_after(table, lsn)

    def write_table_batch(
        self, tb: TableBatch, batch: int, metadata: Mapping[str, Any], *,
        attempt: WriteAttempt | None = None, app_id: str | None = None,
        merge_mirror: bool = True,
    ) -> tuple[int, list[EmissionResult]]:
        """Commit one table's share of batch ``batch`` to the changelog and, with
        ``merge_mirror``, merge every changelog row the mirror lacks into it.

        ``attempt`` tags the rows (a fresh one without it). A replay (``attempt.earlier``)
        first fences the earlier attempts off (:meth:`WriteAttempts.written_before`) and
        writes nothing when one of them had committed this table's share: that commit holds
        the same batch (its content is fixed by the batch intent) and gives the emission
        counts. ``app_id`` names the line of batches (commit metadata; the mirror MERGE's
        ``txnAppId``). Without ``merge_mirror`` the mirror follows later
        (:meth:`merge_mirror`), several batches at once. Every emission needs its chunk's
        files in ``tb.chunks``.

        Returns the number of log events written and each emission's row counts.
        """
        written = self.changelog.write(tb, batch, metadata, attempt=attempt, app_id=app_id)
        if written is None:
            return 0, []
        if merge_mirror:
            self.merge_mirror(tb.table, batch, written.metadata, app_id=app_id)
        return len(tb.events), written.results

    # ---- the mirror follows the changelog ------------------------------------------------

    def mirror_lsn(self, table: TableId) -> int:
        """Every changelog row of ``table`` at or below this ``_dblog_lsn`` is in the mirror
        (:meth:`MirrorProgress.mirror_lsn`)."""
        return self.progress.mirror_lsn(table)

    def merge_mirror(self, table: TableId, batch: int, metadata: Mapping[str, Any], *,
                     app_id: str | None = None, through_lsn: int | None = None) -> int:
        """Merge the changelog rows the mirror lacks (up to ``through_lsn``) in one MERGE;
        how many rows that was (:meth:`MirrorMerge.merge_mirror`)."""
        return self.merger.merge_mirror(table, batch, metadata, app_id=app_id,
                                        through_lsn=through_lsn)
