"""Dagster Definitions: the workspace's entry point (``workspace.yaml``)."""

from __future__ import annotations

import os

from dagster import Definitions

from resources import DblogConfigResource

defs = Definitions(
    resources={
        "dblog": DblogConfigResource(config_path=os.environ.get("DBLOG_CONFIG", "dblog.yaml")),
    },
)
