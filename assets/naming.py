"""Asset keys, group and partition-set names of a source's tables.

Dagster names allow ``[A-Za-z0-9_]`` only; database and table names allow far more. A name
that had to be changed gets a short digest of the original, so two tables never share one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from dagster import AssetKey

from dblog.core.events import TableId

TAILER_TAG = "dblog/tailer"
"""Run tag naming the source a tailer run serves (a concurrency limit of 1 per value)."""
CAPTURE_TAG = "dblog/capture"


def safe_name(text: str) -> str:
    """``text`` as a Dagster name: unchanged when already valid, else sanitized + digest."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_") or "x"
    if cleaned[0].isdigit():
        cleaned = f"_{cleaned}"
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    return f"{cleaned[:40]}_{digest}"


@dataclass(frozen=True)
class TableAssets:
    """The asset keys of one captured table: source table -> full_state -> changelog -> mirror."""

    source_name: str
    table: TableId

    @property
    def prefix(self) -> list[str]:
        return [safe_name(self.source_name), safe_name(self.table.database),
                safe_name(self.table.table)]

    @property
    def source(self) -> AssetKey:
        return AssetKey([*self.prefix, "source"])

    @property
    def full_state(self) -> AssetKey:
        return AssetKey([*self.prefix, "full_state"])

    @property
    def changelog(self) -> AssetKey:
        return AssetKey([*self.prefix, "changelog"])

    @property
    def mirror(self) -> AssetKey:
        return AssetKey([*self.prefix, "mirror"])

    @property
    def group(self) -> str:
        """One group per table: the lineage graph labels each table's four assets with it."""
        return safe_name(f"{self.table.database}__{self.table.table}")

    @property
    def partitions_name(self) -> str:
        """The dynamic partition set of ``full_state``: the table's key ranges."""
        return "__".join([*self.prefix, "ranges"])


def pool_name(source_name: str) -> str:
    """The concurrency pool of a source's captures (``dagster.yaml`` limits runs per pool)."""
    return f"dblog_{safe_name(source_name)}"


def tailer_job_name(source_name: str) -> str:
    return f"dblog_tailer_{safe_name(source_name)}"
