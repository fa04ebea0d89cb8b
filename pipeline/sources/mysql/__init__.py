"""MariaDB/MySQL source: binlog tailing with mysql-replication, chunk selects via Spark JDBC."""

from pipeline.sources.mysql.connection import MySqlSettings
from pipeline.sources.mysql.dialect import MySqlDialect

__all__ = ["MySqlDialect", "MySqlSettings"]
