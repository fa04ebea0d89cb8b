"""The contract suite's sources: one kit per database, so a test written once runs against
MariaDB and PostgreSQL alike (``source_kit`` fixture, ``-k mariadb`` / ``-k postgres``).

A kit creates the sample schema (``accounts`` with one key column, ``orders`` with two),
runs its random writers, reads rows back with the database's own driver (never the
pipeline's readers), writes a pipeline configuration and cleans up after a source.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Protocol

import yaml

from bench.common import drop_database
from pipeline.sample import TABLES, Workload, config_dict, connect, create_schema, q
from pipeline.sample_pg import create_pg_schema
from pipeline.services import Endpoints
from tests.integration.checks import source_rows
from tests.integration.pg import (
    PG_DATABASE,
    PgWorkload,
    drop_replication,
    pg_execute,
    pg_rows,
)

KEYS = {"accounts": ("id",), "orders": ("region", "order_no")}


class SourceKit(Protocol):
    kind: str
    ep: Endpoints

    @property
    def password(self) -> str: ...

    @property
    def password_env(self) -> str: ...

    def create(self, prefix: str, *, accounts: int, orders: int, seed: int) -> str:
        """A new sample schema; returns its name (the ``database`` of its TableIds)."""
        ...

    def drop(self, db: str) -> None: ...

    def rows(self, db: str, table: str, key: tuple[str, ...] | None = None
             ) -> dict[tuple[Any, ...], dict[str, Any]]: ...

    def workload(self, db: str, seed: int, **options: Any) -> Any:
        """Started writers (``stop()``, ``touched``, ``ops``)."""
        ...

    def config(self, path: Path, *, source: str, db: str, lake: Path, chunk_size: int = 250,
               batch_seconds: float = 0.5, chunk_max_rows: int | None = None,
               tables: list[str] | None = None) -> Path:
        """A configuration of the sample tables of ``db`` (or of ``tables``)."""
        ...

    def simple_table(self, prefix: str, rows: int) -> str:
        """A new schema holding ``t (id int primary key, v varchar(20))`` with rows
        ``(i, 'v<i>')`` for i in 1..rows; returns the schema's name."""
        ...

    def run_sql(self, db: str, *statements: str) -> None:
        """Run statements; ``{t}`` in them is table ``t`` of ``db``, quoted."""
        ...

    def forget(self, source: str) -> None:
        """Drop what a pipeline source left in the database (slot, publication)."""
        ...


class MariaDbKit:
    kind = "mariadb"

    def __init__(self, ep: Endpoints) -> None:
        self.ep = ep

    @property
    def password(self) -> str:
        return self.ep.mariadb_password

    @property
    def password_env(self) -> str:
        return "DBLOG_MARIADB_PASSWORD"

    def create(self, prefix: str, *, accounts: int, orders: int, seed: int) -> str:
        db = f"{prefix}_{uuid.uuid4().hex[:8]}"
        create_schema(self.ep, db, accounts=accounts, orders=orders, seed=seed)
        return db

    def drop(self, db: str) -> None:
        drop_database(self.ep, db)

    def rows(self, db: str, table: str, key: tuple[str, ...] | None = None
             ) -> dict[tuple[Any, ...], dict[str, Any]]:
        return source_rows(self.ep, db, table, key or KEYS[table])

    def workload(self, db: str, seed: int, **options: Any) -> Workload:
        return Workload(self.ep, db, seed, **options).start()

    def config(self, path: Path, *, source: str, db: str, lake: Path, chunk_size: int = 250,
               batch_seconds: float = 0.5, chunk_max_rows: int | None = None,
               tables: list[str] | None = None) -> Path:
        data = config_dict(source=source, ep=self.ep,
                           tables=tables or [f"{db}.{t}" for t in TABLES],
                           lake=lake, chunk_size=chunk_size, batch_seconds=batch_seconds,
                           chunk_max_rows=chunk_max_rows)
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
        return path

    def simple_table(self, prefix: str, rows: int) -> str:
        db = f"{prefix}_{uuid.uuid4().hex[:8]}"
        conn = connect(self.ep)
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {q(db)}")
            cur.execute(f"CREATE TABLE {q(db)}.t (id INT PRIMARY KEY, v VARCHAR(20))")
            cur.executemany(f"INSERT INTO {q(db)}.t VALUES (%s, %s)",
                            [(i, f"v{i}") for i in range(1, rows + 1)])
        conn.close()
        return db

    def run_sql(self, db: str, *statements: str) -> None:
        conn = connect(self.ep)
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql.format(t=f"{q(db)}.t"))
        conn.close()

    def forget(self, source: str) -> None:
        del source  # a binlog reader leaves nothing on the server


class PostgresKit:
    kind = "postgres"

    def __init__(self, ep: Endpoints) -> None:
        self.ep = ep

    @property
    def password(self) -> str:
        return self.ep.pg_password

    @property
    def password_env(self) -> str:
        return "DBLOG_PG_PASSWORD"

    def create(self, prefix: str, *, accounts: int, orders: int, seed: int) -> str:
        schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
        create_pg_schema(self.ep, schema, accounts=accounts, orders=orders, seed=seed)
        return schema

    def drop(self, db: str) -> None:
        pg_execute(self.ep, f'DROP SCHEMA IF EXISTS "{db}" CASCADE')

    def rows(self, db: str, table: str, key: tuple[str, ...] | None = None
             ) -> dict[tuple[Any, ...], dict[str, Any]]:
        return pg_rows(self.ep, f'"{db}".{table}', key or KEYS[table])

    def workload(self, db: str, seed: int, **options: Any) -> PgWorkload:
        return PgWorkload(self.ep, db, seed, **options).start()

    def config(self, path: Path, *, source: str, db: str, lake: Path, chunk_size: int = 250,
               batch_seconds: float = 0.5, chunk_max_rows: int | None = None,
               tables: list[str] | None = None) -> Path:
        data = config_dict(source=source, ep=self.ep,
                           tables=tables or [f"{db}.{t}" for t in TABLES],
                           lake=lake, chunk_size=chunk_size, batch_seconds=batch_seconds,
                           chunk_max_rows=chunk_max_rows)
        data["source"] = {"name": source, "kind": "postgres", "host": self.ep.host,
                          "port": self.ep.pg_port, "user": self.ep.user,
                          "password_env": self.password_env, "database": PG_DATABASE}
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
        return path

    def simple_table(self, prefix: str, rows: int) -> str:
        schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
        pg_execute(self.ep, f'CREATE SCHEMA "{schema}"',
                   f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, v varchar(20))',
                   f'ALTER TABLE "{schema}".t REPLICA IDENTITY FULL',
                   f"INSERT INTO \"{schema}\".t SELECT i, 'v' || i"
                   f" FROM generate_series(1, {rows}) i")
        return schema

    def run_sql(self, db: str, *statements: str) -> None:
        pg_execute(self.ep, *(sql.format(t=f'"{db}".t') for sql in statements))

    def forget(self, source: str) -> None:
        drop_replication(self.ep, source)


def kit(kind: str, ep: Endpoints) -> SourceKit:
    return MariaDbKit(ep) if kind == "mariadb" else PostgresKit(ep)
