"""PostgreSQL source: logical replication with pgoutput, chunk selects via Spark JDBC."""

from pipeline.sources.postgres.connection import PostgresSettings
from pipeline.sources.postgres.dialect import PostgresDialect

__all__ = ["PostgresDialect", "PostgresSettings"]
