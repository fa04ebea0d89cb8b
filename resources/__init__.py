"""Dagster resources: thin wrappers that build engine parts from the pipeline config."""

from resources.pipeline import DblogConfigResource

__all__ = ["DblogConfigResource"]
