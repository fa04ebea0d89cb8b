"""Delta Lake output: changelog (append-only, ordered) and mirror (one row per key)."""

from dblog.lake.layout import LakeLayout
from dblog.lake.sink import BatchResult, DeltaSink, EmissionResult

__all__ = ["BatchResult", "DeltaSink", "EmissionResult", "LakeLayout"]
