"""MariaDB/MySQL source: binlog tailing with mysql-replication, chunk selects via Spark JDBC."""

from dblog.sources.mysql.connection import MySqlSettings
from dblog.sources.mysql.dialect import MySqlDialect

__all__ = ["MySqlDialect", "MySqlSettings"]
