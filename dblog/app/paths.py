"""Where the project keeps its local state (service data, jars, lake)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def dblog_home() -> Path:
    """The project-owned data folder: ``$DBLOG_HOME`` or ``<repo>/.dblog``."""
    return Path(os.environ.get("DBLOG_HOME", PROJECT_ROOT / ".dblog")).resolve()


def jars_dir() -> Path:
    """Local JVM jars fetched by the set-up (Delta, JDBC drivers)."""
    return Path(os.environ.get("DBLOG_JARS", dblog_home() / "jars")).resolve()
