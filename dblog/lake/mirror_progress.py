"""How far the mirror follows the changelog: its mark, the changelog rows it lacks, and what
the writer knows of them (truncates not merged yet, chunk emissions not surveyed yet).

The tailer's thread adds to this state as it writes the changelog; the mirror merger's
thread takes off what its merges covered. :class:`MirrorProgress` is shared by both.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dblog.core.events import TableId
from dblog.lake.current import mirror_mark
from dblog.lake.layout import LakeLayout
from dblog.lake.tables import is_delta_table
from dblog.lake.types import LSN_FLOOR, TRUNCATE_OP


class MirrorProgress:
    """The mirror's position per table and the changelog rows it lacks."""

    def __init__(self, spark: SparkSession, mirror_spark: SparkSession,
                 layout: LakeLayout) -> None:
        self.spark = spark
        self._mirror_spark = mirror_spark
        self.layout = layout
        self._mirror_lsn: dict[TableId, int] = {}
        """Per table: every changelog row at or below this ``_dblog_lsn`` is in the mirror."""
        self._unmerged_truncates: dict[TableId, tuple[int, ...]] = {}
        """Per table: the ``_dblog_lsn`` of every truncate row the mirror lacks (absent: not
        known yet, read from the changelog once). Written truncates add to it, merges take
        off what they covered: the changelog is read again only after a restart."""
        self._truncates_lock = threading.Lock()
        """The tailer adds to :attr:`_unmerged_truncates` (and :attr:`_emissions_unsurveyed`)
        while the mirror merger trims it (and takes its table off)."""
        self._emissions_unsurveyed: set[TableId] = set()
        """Tables with a changelog commit of chunk emissions this sink wrote since a merge
        last surveyed them: their next merge surveys by chunk
        (:func:`dblog.lake.survey.survey`). Only a hint: a survey's figures never depend
        on it."""

    def mirror_lsn(self, table: TableId) -> int:
        """Every changelog row of ``table`` at or below this ``_dblog_lsn`` is in the mirror
        (read once from the mirror's commit history, then kept up to date)."""
        if table not in self._mirror_lsn:
            self._mirror_lsn[table] = self._recorded_mirror_lsn(table)
        return self._mirror_lsn[table]

    def _recorded_mirror_lsn(self, table: TableId) -> int:
        """The mark of the mirror's latest merge (:func:`dblog.lake.current.mirror_mark`)."""
        path = self.layout.mirror(table)
        if not is_delta_table(self.spark, path):
            return LSN_FLOOR
        return mirror_mark(self._mirror_spark, path)

    def unmerged(self, table: TableId, through_lsn: int | None = None,
                 spark: SparkSession | None = None) -> DataFrame:
        """The changelog rows the mirror lacks (up to ``through_lsn``), in no order.

        The changelog is appended in log order by one writer, so these are exactly the
        rows of the batches written since the mirror's last MERGE. (Read before the
        mirror they are compared with: a MERGE in between only makes them more.)"""
        rows = ((spark or self.spark).read.format("delta").load(self.layout.changelog(table))
                .where(F.col("_dblog_lsn") > F.lit(self.mirror_lsn(table))))
        if through_lsn is not None:
            rows = rows.where(F.col("_dblog_lsn") <= F.lit(through_lsn))
        return rows

    def set_mirror_lsn(self, table: TableId, lsn: int) -> None:
        """The mirror holds every changelog row of ``table`` at or below ``lsn``."""
        self._mirror_lsn[table] = lsn

    def truncated_unmerged(self, table: TableId) -> bool:
        """Whether a changelog row the mirror has not merged yet truncates the table."""
        with self._truncates_lock:
            known = self._unmerged_truncates.get(table)
        if known is None:
            # Read without the lock (a Spark job). Against a mirror position read before a
            # merge that lands meanwhile, it can only name more truncates than remain.
            found = tuple(int(r[0]) for r in self.unmerged(table)
                          .where(F.col("op") == TRUNCATE_OP).select("_dblog_lsn").collect())
            with self._truncates_lock:
                known = self._unmerged_truncates.setdefault(table, found)
        return bool(known)

    def note_truncates_written(self, table: TableId, lsns: Sequence[int]) -> None:
        """The changelog holds truncate rows of ``table`` at ``lsns``, not merged yet."""
        with self._truncates_lock:
            known = self._unmerged_truncates.get(table)
            if known is not None:
                self._unmerged_truncates[table] = (*known, *lsns)

    def note_merged_through(self, table: TableId, lsn: int) -> None:
        """The mirror holds every changelog row at or below ``lsn``."""
        with self._truncates_lock:
            known = self._unmerged_truncates.get(table)
            if known is not None:
                self._unmerged_truncates[table] = tuple(t for t in known if t > lsn)

    def note_emissions_written(self, table: TableId) -> None:
        """A changelog commit of ``table`` holds chunk emissions (its next merge surveys by
        chunk)."""
        with self._truncates_lock:
            self._emissions_unsurveyed.add(table)

    def take_emissions_unsurveyed(self, table: TableId) -> bool:
        """Whether chunk emissions were written since ``table``'s last survey; the merge
        that asks surveys them."""
        with self._truncates_lock:
            chunks_expected = table in self._emissions_unsurveyed
            self._emissions_unsurveyed.discard(table)
        return chunks_expected
