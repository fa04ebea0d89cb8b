"""Dagster resources: thin wrappers that build engine parts from the pipeline config."""

from resources.pipeline import (
    DblogConfigResource,
    DblogResource,
    LakeResource,
    SourceResource,
    ZooKeeperResource,
)

__all__ = [
    "DblogConfigResource",
    "DblogResource",
    "LakeResource",
    "SourceResource",
    "ZooKeeperResource",
]
