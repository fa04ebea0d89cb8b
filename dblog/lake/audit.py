"""Audits of a table's changelog inside Spark (the ``changelog`` asset check)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F


@dataclass
class OrderAudit:
    """Keys whose changelog positions went back in commit order (invariant 3)."""

    rows: int
    keys_back: int
    samples: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.keys_back == 0


def audit_position_order(spark: SparkSession, changelog_path: str, key: Sequence[str],
                         sample: int = 10) -> OrderAudit:
    """Per key, ``(_dblog_lsn, _dblog_seq)`` must rise in commit order (Delta's
    ``_commit_version``, read through the change feed of the append-only changelog)."""
    feed = (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", 0).load(changelog_path)
            .where(F.col("_change_type") == "insert"))
    image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
    keys = [image.getField(k).alias(f"_k{i}") for i, k in enumerate(key)]
    rows = feed.where(F.col("op") != "t").select(
        *keys, "_commit_version", "_dblog_lsn", "_dblog_seq")
    key_cols = [f"_k{i}" for i in range(len(key))]
    order = Window.partitionBy(*key_cols).orderBy("_commit_version", "_dblog_lsn", "_dblog_seq")
    prev_lsn = F.lag("_dblog_lsn").over(order)
    prev_seq = F.lag("_dblog_seq").over(order)
    marked = rows.select(*key_cols, (
        (prev_lsn > F.col("_dblog_lsn"))
        | ((prev_lsn == F.col("_dblog_lsn")) & (prev_seq >= F.col("_dblog_seq")))
    ).alias("_back")).localCheckpoint()
    back = marked.where("_back").select(*key_cols).distinct()
    return OrderAudit(
        rows=marked.count(),
        keys_back=back.count(),
        samples=[tuple(r) for r in back.limit(sample).collect()],
    )

