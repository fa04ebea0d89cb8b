"""The Spark type of a canonical column type, for the chunk selects of every source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dblog.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType


def spark_data_type(spark_type: str) -> DataType:
    """The pyspark DataType of a canonical type name."""
    from dblog.lake.types import spark_type as canonical

    try:
        return canonical(spark_type)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
