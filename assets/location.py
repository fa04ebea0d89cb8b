"""Dagster Definitions: the workspace's entry point (``workspace.yaml``).

Built from the YAML config at ``$DBLOG_CONFIG`` (default: the demo's, written by
``make demo``), the same file the ``dblog`` CLI reads.
"""

from __future__ import annotations

import os

from assets.definitions import build_definitions
from dblog.app.paths import dblog_home
from dblog.core.errors import ConfigError


def config_path() -> str:
    """``$DBLOG_CONFIG``, else the demo's config (a clear error if neither exists)."""
    path = os.environ.get("DBLOG_CONFIG")
    if path:
        return path
    demo = dblog_home() / "demo" / "dblog.yaml"
    if not demo.exists():
        raise ConfigError(f"no config: set DBLOG_CONFIG to a dblog YAML file, or run `make "
                          f"demo` to write {demo}")
    return str(demo)


defs = build_definitions(config_path())
