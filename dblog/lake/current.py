"""A table's current state read from the lake without waiting for the mirror's MERGE
(merge-on-read).

The mirror is a table's state as of its latest merge, whose commit records a mark (every
changelog row at or below it is merged, :data:`MIRROR_LSN`). The tailer merges
periodically, so between merges the changelog holds the log's newer changes. The current
state is the mirror at one version with the changelog rows after that version's mark
applied as the MERGE applies them: per key the newest row by position wins (a mirror row
or a change), a delete leaves no row, and a TRUNCATE removes every older row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from dblog.core.errors import DblogError
from dblog.core.events import Op, TableId
from dblog.lake.layout import LakeLayout
from dblog.lake.types import (
    LSN_FLOOR,
    META_COLUMNS,
    MIRROR_LSN,
    TRUNCATE_OP,
    name_apart,
    quote_ident,
)

_RECENT_COMMITS = 50
MIRROR_ROW = "m"
"""The op a mirror row takes beside the changes in the readers (never a changelog op)."""


def mirror_mark(spark: SparkSession, path: str, version: int | None = None) -> int:
    """The mark of the mirror at ``path`` as of ``version`` (None: its latest): every
    changelog row at or below it is in the mirror at that version. The mark of the
    latest merge committed at or before it (a MERGE, or an append of new chunks' rows that
    merged everything); :data:`LSN_FLOOR` when there is none (a new table, or one whose
    every merge was lost: then every changelog row is to be merged again, which the
    MERGE's position guard makes harmless)."""
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    # The latest merge is nearly always among the last commits: those are read first, the
    # whole history (every commit Delta keeps, 30 days by default) only when it is not.
    for limit in (_RECENT_COMMITS, None):
        history = table.history(limit) if limit is not None else table.history()
        commits = [r.asDict() for r in history.select("version", "operation", "userMetadata")
                   .orderBy(F.desc("version")).collect()]
        mark = mark_in_history(commits, version)
        if mark is not None:
            return mark
        if limit is not None and len(commits) < limit:
            break  # that was the whole history
    return LSN_FLOOR


def mark_in_history(history: Iterable[Mapping[str, Any]], version: int | None
                    ) -> int | None:
    """The mark of the mirror at ``version`` (None: its latest) from commits of its history
    (newest first, as Delta's and delta-rs's history give them: ``version``, ``operation``,
    ``userMetadata``): the mark of the latest merge at or before ``version``; None when
    none of them has one."""
    for at, commit in enumerate(history):
        if version is not None and int(commit.get("version", version - at)) > version:
            continue
        operation = commit.get("operation")
        if operation not in ("MERGE", "WRITE"):
            continue
        try:
            found = json.loads(commit.get("userMetadata") or "{}")
        except ValueError:
            continue
        if not isinstance(found, dict):
            continue
        # A MERGE of the code before deferred merges recorded only dblog.to_lsn; an
        # append of new chunks' rows carries the mark when it merged everything.
        mark = (found.get(MIRROR_LSN, found.get("dblog.to_lsn")) if operation == "MERGE"
                else found.get(MIRROR_LSN))
        if isinstance(mark, int):
            return mark
    return None


def after_position(lsn: int, seq: int) -> Column:
    """Rows positioned after ``(lsn, seq)`` (by ``_dblog_lsn``, then ``_dblog_seq``)."""
    return ((F.col("_dblog_lsn") > F.lit(lsn))
            | ((F.col("_dblog_lsn") == F.lit(lsn)) & (F.col("_dblog_seq") > F.lit(seq))))


def newest_first(key: Sequence[str]) -> WindowSpec:
    """Rows of each key (columns ``key``), the newest by position first."""
    return Window.partitionBy(*[F.col(quote_ident(k)) for k in key]).orderBy(
        F.col("_dblog_lsn").desc(), F.col("_dblog_seq").desc())


def change_key(k: str) -> Column:
    """A changelog row's value of key column ``k`` (from ``before`` for a delete)."""
    return F.when(F.col("op") == Op.DELETE.value, F.col("before").getField(k)).otherwise(
        F.col("after").getField(k)
    ).alias(k)


def current_state(spark: SparkSession, layout: LakeLayout, table: TableId,
                  key: tuple[str, ...]) -> DataFrame:
    """``table``'s current state: the rows of its mirror's latest version with every
    changelog row after that version's mark applied (the mirror's columns, position
    columns included; columns the changelog has gained since then are added, NULL in rows
    that predate them). ``key``: the table's key columns (``dblog.key`` of its mirror).

    The mirror's version is fixed first and the changelog read after it, so a merge or a
    batch committed meanwhile only adds changes the result already holds or newer ones."""
    from delta.tables import DeltaTable

    mirror_path = layout.mirror(table)
    if not DeltaTable.isDeltaTable(spark, mirror_path):
        raise DblogError(f"{table} has no mirror in the lake at {mirror_path}: tail the "
                         "source (and capture the table) first")
    version = int(DeltaTable.forPath(spark, mirror_path).history(1).first()["version"])  # type: ignore[index]
    mark = mirror_mark(spark, mirror_path, version)
    mirror = spark.read.format("delta").option("versionAsOf", version).load(mirror_path)
    changes = (spark.read.format("delta").load(layout.changelog(table))
               .where(F.col("_dblog_lsn") > F.lit(mark)))
    truncated = (changes.where(F.col("op") == TRUNCATE_OP)
                 .agg(F.max(F.struct(F.col("_dblog_lsn"), F.col("_dblog_seq"))).alias("t"))
                 .first())
    last_truncate = None if truncated is None else truncated["t"]
    changes = changes.where(F.col("op") != TRUNCATE_OP)
    if last_truncate is not None:
        after_truncate = after_position(int(last_truncate[0]), int(last_truncate[1]))
        changes = changes.where(after_truncate)
        mirror = mirror.where(after_truncate)
    columns = [c for c in mirror.columns if c not in META_COLUMNS]
    after_fields = changes.schema["after"].dataType.names  # type: ignore[attr-defined]
    columns += [c for c in after_fields if c not in columns]
    present = set(after_fields)
    # A row's op and rank beside the table's columns, named apart from them.
    op, rank = name_apart("_dblog_op", columns), name_apart("_dblog_rank", columns)
    flat = changes.select(
        *[change_key(k) for k in key],
        *[(F.col("after").getField(c) if c in present else F.lit(None)).alias(c)
          for c in columns if c not in key],
        *[F.col(m) for m in META_COLUMNS],
        F.col("op").alias(op),
    )
    held = mirror.select(*[F.col(quote_ident(c)) for c in mirror.columns],
                         F.lit(MIRROR_ROW).alias(op))
    both = held.unionByName(flat, allowMissingColumns=True)
    return (both.withColumn(rank, F.row_number().over(newest_first(key)))
            .where((F.col(quote_ident(rank)) == 1)
                   & (F.col(quote_ident(op)) != Op.DELETE.value))
            .select(*[F.col(quote_ident(c)) for c in columns],
                    *[F.col(m) for m in META_COLUMNS]))


__all__ = ["MIRROR_ROW", "after_position", "change_key", "current_state", "mark_in_history",
           "mirror_mark", "newest_first"]
