"""Delta Lake output: changelog (append-only, ordered) and mirror (one row per key)."""

from pipeline.lake.layout import LakeLayout
from pipeline.lake.sink import BatchResult, DeltaSink, EmissionResult

__all__ = ["BatchResult", "DeltaSink", "EmissionResult", "LakeLayout"]
