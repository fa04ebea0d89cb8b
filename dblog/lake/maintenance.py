"""Maintenance of a table's changelog and mirror: compaction and VACUUM, by the one writer
(the tailer, or ``dblog maintain`` in its place)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from dblog.core.events import TableId
from dblog.lake.deltalog import DeltaTxn
from dblog.lake.layout import LakeLayout
from dblog.lake.tables import is_delta_table


@dataclass
class MaintenanceReport:
    """Data files of a table's changelog and mirror before and after a compaction."""

    table: TableId
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    not_vacuumed: list[str] = field(default_factory=list)
    """Tables left unvacuumed: they hold chunk files a pending batch will commit."""

    def summary(self) -> str:
        """One line for the operator: files before and after, per lake table."""
        parts = [f"{name} {a} -> {b} files" for name, (a, b) in self.files.items()]
        text = f"{self.table}: " + (", ".join(parts) if parts else "no Delta tables yet")
        if self.not_vacuumed:
            text += (f"; {', '.join(self.not_vacuumed)} not vacuumed: captures published chunk "
                     "files a pending batch commits (run `dblog tail --until-caught-up`, then "
                     "vacuum again)")
        return text


class Maintenance:
    """Compacts (and vacuums) a source's lake tables, the mirror's lock held."""

    def __init__(self, spark: SparkSession, layout: LakeLayout,
                 mirror_lock: threading.RLock) -> None:
        self.spark = spark
        self.layout = layout
        self._mirror_lock = mirror_lock

    def _file_count(self, path: str) -> int:
        return DeltaTxn(self.spark, path).file_count

    def maintain(self, table: TableId, *, vacuum: bool = False,
                 keep_uncommitted: bool = False) -> MaintenanceReport:
        """Compact the changelog's and the mirror's small files (one per batch otherwise);
        with ``vacuum`` also vacuum them (the table's retention, 7 days by default: time
        travel within it stays possible).

        ``keep_uncommitted``: captures have published chunk files of the table that a
        pending batch will commit (:func:`dblog.state.handoff.pending_chunk_tables`): the
        changelog is not vacuumed, since VACUUM deletes every file no commit added once
        it is older than the retention, and a retention shortened below a batch's wait
        (a tailer down for a while) would take files the replay commits.

        Only the ordered writer may call it (it rewrites files a MERGE would read)."""
        with self._mirror_lock:
            return self._compact(table, vacuum, keep_uncommitted)

    def _compact(self, table: TableId, vacuum: bool, keep_uncommitted: bool = False
                 ) -> MaintenanceReport:
        from delta.tables import DeltaTable

        report = MaintenanceReport(table)
        for name, path in (("changelog", self.layout.changelog(table)),
                           ("mirror", self.layout.mirror(table))):
            if not is_delta_table(self.spark, path):
                continue
            before = self._file_count(path)
            DeltaTable.forPath(self.spark, path).optimize().executeCompaction()
            report.files[name] = (before, self._file_count(path))
            if vacuum and name == "changelog" and keep_uncommitted:
                report.not_vacuumed.append(name)
            elif vacuum:
                DeltaTable.forPath(self.spark, path).vacuum()
        return report

