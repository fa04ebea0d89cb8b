"""Where a source's Delta tables live: ``<lake>/<source>/<database>/<table>/...``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pipeline.events import TableId


def _segment(name: str) -> str:
    """A path segment for any identifier (quotes, spaces, unicode, slashes are escaped)."""
    return quote(name, safe="") or "%00"


@dataclass(frozen=True)
class LakeLayout:
    """Paths of one source's Delta tables under the lake root."""

    root: Path
    source: str

    def table_dir(self, table: TableId) -> Path:
        return self.root / _segment(self.source) / _segment(table.database) / _segment(table.table)

    def changelog(self, table: TableId) -> str:
        return str(self.table_dir(table) / "changelog")

    def mirror(self, table: TableId) -> str:
        return str(self.table_dir(table) / "mirror")

    def staging(self, table: TableId) -> str:
        return str(self.table_dir(table) / "_staging")
