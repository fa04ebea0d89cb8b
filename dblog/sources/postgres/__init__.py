"""PostgreSQL source: logical replication with pgoutput, chunk selects via Spark JDBC."""

from dblog.sources.postgres.connection import PostgresSettings
from dblog.sources.postgres.dialect import PostgresDialect

__all__ = ["PostgresDialect", "PostgresSettings"]
