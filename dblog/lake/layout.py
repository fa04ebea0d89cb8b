"""Where a source's Delta tables live: ``<lake>/<source>/<database>/<table>/...``."""

from __future__ import annotations

import logging
import re
import string
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from dblog.core.events import TableId

log = logging.getLogger(__name__)

_KEPT = frozenset(string.ascii_letters + string.digits + "_-")
_warned: set[str] = set()
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def segment(name: str) -> str:
    """A path segment for any identifier: ASCII letters, digits, ``_`` and ``-`` as they
    are, ``.`` too except first; every other character as ``~XX`` per UTF-8 byte (``~``
    itself included, so distinct names never share a segment). Never ``%``: delta-rs reads
    ``%XX`` in a table's path as an escape and then cannot find the table's files."""
    out = []
    for i, ch in enumerate(name):
        if ch in _KEPT or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.extend(f"~{byte:02X}" for byte in ch.encode())
    return "".join(out) or "~"


def _legacy_segment(name: str) -> str:
    """The URL escaping of lakes written before :func:`segment` (still found and used)."""
    return quote(name, safe="") or "%00"


def is_uri(root: str) -> bool:
    """Whether a lake root is a URI (``s3a://bucket/lake``, ``file:///data/lake``) rather
    than a local path."""
    return _URI.match(root) is not None


@dataclass(frozen=True)
class LakeLayout:
    """Paths of one source's Delta tables under the lake root: a local path or a URI that
    Spark's Hadoop filesystems resolve (every path is built as text, never on the driver's
    disk, so executors on other machines and object stores see the same paths)."""

    root: str | Path
    source: str

    def table_dir(self, table: TableId) -> str:
        names = (self.source, table.database, table.table)
        root = str(self.root).rstrip("/")
        current = "/".join((root, *map(segment, names)))
        if is_uri(root):
            return current
        legacy = "/".join((root, *map(_legacy_segment, names)))
        if legacy != current and Path(legacy).exists() and not Path(current).exists():
            if legacy not in _warned:
                _warned.add(legacy)
                log.warning("%s is in its older, URL-escaped lake path %s, which delta-rs cannot "
                            "read; rename the directory to %s to fix that", table, legacy,
                            current)
            return legacy
        return current

    def changelog(self, table: TableId) -> str:
        return f"{self.table_dir(table)}/changelog"

    def mirror(self, table: TableId) -> str:
        return f"{self.table_dir(table)}/mirror"

