"""What a range checksum covers, for every source (the database side and the lake side
render each covered column's value to the same text)."""

from __future__ import annotations

from pipeline.sources.base import TableSchema, element_type

UNCOMPARED_TYPES = frozenset({"FLOAT", "DOUBLE"})
"""Canonical types left out of the checksum (compared through the row count only), alone or as
array elements: their text forms differ between the engines."""


def checksum_columns(schema: TableSchema) -> list[str]:
    """The columns a checksum covers, in table order."""
    return [c.name for c in schema.columns
            if (element_type(c.spark_type) or c.spark_type) not in UNCOMPARED_TYPES]
