"""Write attempts: each attempt at a batch tags its changelog rows with its id, and a replay
(after a crash or a takeover) fences the earlier attempts at the batch off before it writes.

The fence is a CHECK constraint on the changelog that refuses the earlier attempts' rows
(:meth:`WriteAttempts.written_before`); a batch whose share one of them landed is not written
again, and its emission counts are read back from that commit.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dblog.core.errors import DblogError
from dblog.core.events import TableId
from dblog.lake.deltalog import retry_concurrent_commits
from dblog.lake.layout import LakeLayout
from dblog.lake.tables import LakeTables
from dblog.lake.types import ATTEMPT_COLUMN, quote_ident

_ATTEMPT_ID = re.compile(r"[0-9a-f]{32}")
_FENCE_PREFIX = "dblog_fence_"
_COMMIT_IDENTITY = ("dblog.app", "dblog.batch", "dblog.from_lsn", "dblog.to_lsn", "table")
"""What identifies one batch's changelog commit (``dblog.app`` may be absent: older runs)."""



@dataclass(frozen=True, slots=True)
class WriteAttempt:
    """One attempt at writing a batch: ``id`` tags its changelog rows; ``earlier`` are the
    attempts at the same batch recorded before it (a replay after a crash or a takeover),
    whose commits must be found or fenced off before this one writes. ``legacy_replay``: the
    batch was recorded by a version that wrote without attempt ids (found by its commit
    metadata instead)."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    earlier: tuple[str, ...] = ()
    legacy_replay: bool = False

    def __post_init__(self) -> None:
        for attempt in (self.id, *self.earlier):
            if not _ATTEMPT_ID.fullmatch(attempt):
                raise ValueError(f"not a write attempt id: {attempt!r}")



def fences_refusing(configuration: Mapping[str, str], attempt: str) -> list[str]:
    """The fences (CHECK constraints) among a table's properties that refuse ``attempt``."""
    return [k for k, v in configuration.items()
            if k.startswith(f"delta.constraints.{_FENCE_PREFIX}") and attempt in v]


class WriteAttempts:
    """Fences earlier write attempts off a table's changelog and finds their commits."""

    def __init__(self, spark: SparkSession, layout: LakeLayout, tables: LakeTables) -> None:
        self.spark = spark
        self.layout = layout
        self._tables = tables
        self._attempt_column: set[TableId] = set()
        """Tables whose changelog is known to have :data:`ATTEMPT_COLUMN`."""

    def fenced_off(self, path: str, attempt: str) -> bool:
        """Whether a replay's fence refuses rows of ``attempt`` (the append then failed on
        the constraint, or on the metadata change that added it while in flight)."""
        if not _ATTEMPT_ID.fullmatch(attempt):
            return False
        return bool(fences_refusing(self._tables.properties(path), attempt))

    def ensure_attempt_column(self, table: TableId) -> None:
        """Changelogs created before write attempts get the column (NULL in older rows)."""
        if table in self._attempt_column:
            return
        path = self.layout.changelog(table)
        names = self.spark.read.format("delta").load(path).schema.names
        if ATTEMPT_COLUMN not in names:
            self.spark.sql(f"ALTER TABLE delta.{quote_ident(path)} "
                           f"ADD COLUMNS ({ATTEMPT_COLUMN} STRING)")
        self._attempt_column.add(table)

    def written_before(self, table: TableId, attempt: WriteAttempt,
                        metadata: Mapping[str, Any]) -> bool:
        """Whether an earlier attempt at this batch committed the table's share (then
        nothing is written); fences the earlier attempts off first, so the answer is final."""
        if attempt.earlier and self._fence(table, attempt):
            return True
        if attempt.legacy_replay:
            return self._find_commit(self.layout.changelog(table), metadata) is not None
        return False

    def _fence(self, table: TableId, attempt: WriteAttempt) -> bool:
        """Fence the earlier attempts at this batch off the table's changelog; True when one
        of them had committed there.

        One metadata commit: a CHECK constraint that refuses rows of those attempts. A
        commit of theirs still in flight conflicts with it, and any later one violates it,
        so none can land after this; Delta checks the constraint against the rows already
        there, so it fails exactly when one had landed before (the attempt ids are ours:
        32 hex digits, checked by :class:`WriteAttempt`)."""
        path = self.layout.changelog(table)
        refused = ", ".join(f"'{a}'" for a in attempt.earlier)
        statement = (
            f"ALTER TABLE delta.{quote_ident(path)} ADD CONSTRAINT {_FENCE_PREFIX}{attempt.id} "
            f"CHECK ({ATTEMPT_COLUMN} IS NULL OR {ATTEMPT_COLUMN} NOT IN ({refused}))"
        )
        landed = False

        def add() -> None:
            nonlocal landed
            try:
                self.spark.sql(statement)
            except Exception as exc:
                if "DELTA_NEW_CHECK_CONSTRAINT_VIOLATION" not in str(exc):
                    raise
                landed = True

        retry_concurrent_commits(add, pause_s=0.5)
        return landed

    def commit_version(self, path: str, metadata: Mapping[str, Any]) -> int:
        """The version of the changelog commit written with ``metadata`` (app and batch):
        the latest, or an earlier one when the append was skipped as already written."""
        version = self._find_commit(path, metadata)
        if version is None:
            raise DblogError(
                f"batch {metadata.get('dblog.batch')} of {metadata.get('dblog.app')} is "
                f"recorded as written to {path} but no commit in its history holds it: the "
                "changelog's history was cleaned or rewritten; recapture the table into a "
                "new lake path"
            )
        return version

    def _find_commit(self, path: str, metadata: Mapping[str, Any]) -> int | None:
        """The version of the changelog commit of the batch ``metadata`` names (any
        attempt at it), or None: the latest, or one behind it (a replay after a crash, or a
        maintenance commit meanwhile)."""
        from delta.tables import DeltaTable

        def ours(user_metadata: str | None) -> bool:
            if not user_metadata:
                return False
            try:
                found = json.loads(user_metadata)
            except ValueError:
                return False
            return isinstance(found, dict) and all(
                found.get(k, metadata[k]) == metadata[k] for k in _COMMIT_IDENTITY if k in metadata)

        history = (DeltaTable.forPath(self.spark, path).history()
                   .where(F.col("operation") == "WRITE")
                   .select("version", "userMetadata").orderBy(F.desc("version")))
        for row in history.toLocalIterator():
            if ours(row["userMetadata"]):
                return int(row["version"])
        return None

    def committed_rows(self, table: TableId, version: int) -> DataFrame:
        """The rows changelog commit ``version`` appended (its change feed; no other rows)."""
        rows = (self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", version)
                .option("endingVersion", version)
                .load(self.layout.changelog(table)))
        return rows.drop("_change_type", "_commit_version", "_commit_timestamp")

