"""The contract suite's sources: one kit per database, so a test written once runs against
MariaDB and PostgreSQL alike (``source_kit`` fixture, ``-k mariadb`` / ``-k postgres``).

A kit creates the sample schema (``accounts`` with one key column, ``orders`` with two),
runs its random writers, reads rows back with the database's own driver (never the
pipeline's readers), writes a pipeline configuration and cleans up after a source.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import yaml

from bench.common import drop_database
from dblog.sources.postgres.connection import default_slot
from dblog.sources.postgres.sqltext import quote_ident
from devtools.sample import TABLES, Workload, config_dict, connect, create_schema, q
from devtools.sample_pg import create_pg_schema
from devtools.services import Endpoints
from tests.integration.checks import source_rows
from tests.integration.pg import (
    PG_DATABASE,
    PgWorkload,
    drop_replication,
    pg_connect,
    pg_execute,
    pg_rows,
)

KEYS = {"accounts": ("id",), "orders": ("region", "order_no")}

MARIADB_TYPED = """CREATE TABLE {db}.typed (
  id INT PRIMARY KEY, d DATE, dt DATETIME(6), ts TIMESTAMP(3) NULL, b VARBINARY(16),
  tiny DECIMAL(10,8), big DECIMAL(40,10), l1 VARCHAR(20) CHARACTER SET latin1,
  t TIME(2), y YEAR, bits BIT(10), e ENUM('x','y'), s SET('a','b'), j JSON, f FLOAT,
  u BIGINT UNSIGNED, n TINYINT
) ENGINE=InnoDB"""
MARIADB_TYPED_ROWS = [
    (1, "2024-02-29", "2024-02-29 23:59:59.000001", "2038-01-19 03:14:07.999", b"\x00\xff|:",
     "0.00000001", "-12345678901234567890.0000000001", "café", "-838:59:59.99", 2155, 1023,
     "y", "a,b", '{"k": [1, "é"]}', 1.5, 2**64 - 1, -128),
    (2, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
     None, None),
    (3, "1000-01-01", "1000-01-01 00:00:00", "1970-01-01 00:00:01", b"", "0", "0", "",
     "00:00:00", 1901, 0, "x", "", "[]", -0.0, 0, 0),
    (4, "2024-01-01", "2024-01-01 12:00:00", "2024-01-01 12:00:00", b"a", "1.5", "1e20", "N",
     "1:2:3", 2000, 5, "x", "b", '"V1:x|"', 3.0, 7, 1),
]
POSTGRES_TYPED = """CREATE TABLE {db}.typed (
  id int PRIMARY KEY, s smallint, c bigint, n numeric(12,3), un numeric, r real,
  d double precision, ok boolean, t text, v varchar(10), ch char(4), by bytea, day date,
  tm time, ts timestamp, tz timestamptz, iv interval, u uuid, j json, jb jsonb, arr int[],
  m {db}.mood)"""
POSTGRES_TYPED_ROWS = [
    "1, -32768, 9007199254740993, -12.345, 'NaN', 'Infinity', 'NaN', true, 'ünï ✓', 'vv',"
    " 'ab', '\\x00ff', '2024-02-29', '12:34:56.789', '2024-01-02 03:04:05.678901',"
    " '2024-01-02 03:04:05+02', '1 year 2 days 00:00:01',"
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, \"é\"]}', '{\"k\": [1, 2]}',"
    " '{1,NULL,3}', 'happy'",
    "2" + ", NULL" * 21,
    "3, 0, 0, 0, '-1e-30', '-Infinity', -0.0, false, '', '', '', '', '0001-01-01', '00:00',"
    " '1970-01-01', '1970-01-01 00:00:00+00', '0 s', '00000000-0000-0000-0000-000000000000',"
    " '[]', '{}', '{}', 'sad'",
    "4, 5, 7, 1.5, '1e20', 3.0, 1.5, true, 'N', 'x y', 'a b', 'a', '2024-01-01', '23:59:59',"
    " '2024-01-01 12:00:00', '2024-01-01 12:00:00-08', '-1 mon', "
    " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', '\"V1:x|\"', 'null', '{-1,NULL,2147483647}', 'ok'",
]


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

    def config_data(self, *, source: str, db: str, lake: Path,
                    tables: list[str] | None = None, **options: Any) -> dict[str, Any]:
        """A configuration (as parsed YAML) of the sample tables of ``db`` (or of
        ``tables``); ``options`` as :func:`devtools.sample.config_dict` takes them."""
        ...

    def config(self, path: Path, *, source: str, db: str, lake: Path,
               tables: list[str] | None = None, **options: Any) -> Path:
        """:meth:`config_data` written to ``path``."""
        ...

    def qualified(self, db: str, table: str) -> str:
        """Table ``table`` of ``db`` as quoted SQL."""
        ...

    def connect(self) -> Any:
        """A new autocommit DB-API connection (``%s`` parameters) to the source."""
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

    def create_typed(self, db: str) -> str:
        """Table ``typed`` in ``db``: a column of every type the source maps, four rows
        (edge values, all NULLs, empty and zero values, plain values); returns its name."""
        ...

    def cleaned(self, db: str, prefix: str) -> AbstractContextManager[str]:
        """A new source name (``<prefix>-<random>``); on exit what the source left in the
        database and the schema ``db`` are dropped."""
        ...

    def insert_range(self, db: str, first: int, last: int) -> str:
        """One statement inserting ``(i, 'v<i>')`` for i in first..last into ``db``'s t."""
        ...

    def end_log_streams(self, source: str) -> int:
        """End the server side of ``source``'s log connection (as a restart or a network
        cut would); returns how many connections were ended."""
        ...


class _KitBase:
    def forget(self, source: str) -> None:
        raise NotImplementedError

    def drop(self, db: str) -> None:
        raise NotImplementedError

    @contextmanager
    def cleaned(self, db: str, prefix: str) -> Iterator[str]:
        source = f"{prefix}-{uuid.uuid4().hex[:8]}"
        try:
            yield source
        finally:
            self.forget(source)
            self.drop(db)

    def config_data(self, *, source: str, db: str, lake: Path,
                    tables: list[str] | None = None, **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    def config(self, path: Path, *, source: str, db: str, lake: Path,
               tables: list[str] | None = None, **options: Any) -> Path:
        data = self.config_data(source=source, db=db, lake=lake, tables=tables, **options)
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
        return path


class MariaDbKit(_KitBase):
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

    def config_data(self, *, source: str, db: str, lake: Path,
                    tables: list[str] | None = None, **options: Any) -> dict[str, Any]:
        return config_dict(source=source, ep=self.ep,
                           tables=tables or [f"{db}.{t}" for t in TABLES], lake=lake, **options)

    def qualified(self, db: str, table: str) -> str:
        return f"{q(db)}.{q(table)}"

    def connect(self) -> Any:
        return connect(self.ep)

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

    def insert_range(self, db: str, first: int, last: int) -> str:
        return (f"INSERT INTO {q(db)}.t SELECT seq, CONCAT('v', seq)"  # noqa: S608
                f" FROM {q(db)}.seq_{int(first)}_to_{int(last)}")

    def end_log_streams(self, source: str) -> int:
        del source  # one source tails at a time here: every binlog dump is ours
        conn = connect(self.ep)
        ended = 0
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id FROM information_schema.processlist"
                            " WHERE command LIKE 'Binlog Dump%'")
                for (thread,) in cur.fetchall():
                    try:
                        cur.execute(f"KILL CONNECTION {int(thread)}")
                        ended += 1
                    except Exception:  # noqa: BLE001 - it ended by itself meanwhile
                        pass
        finally:
            conn.close()
        return ended

    def create_typed(self, db: str) -> str:
        conn = connect(self.ep, db)
        with conn.cursor() as cur:
            cur.execute(MARIADB_TYPED.format(db=q(db)))
            cur.executemany(
                "INSERT INTO typed VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                MARIADB_TYPED_ROWS)
        conn.close()
        return "typed"


class PostgresKit(_KitBase):
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

    def config_data(self, *, source: str, db: str, lake: Path,
                    tables: list[str] | None = None, **options: Any) -> dict[str, Any]:
        data = config_dict(source=source, ep=self.ep,
                           tables=tables or [f"{db}.{t}" for t in TABLES], lake=lake, **options)
        data["source"] = {"name": source, "kind": "postgres", "host": self.ep.host,
                          "port": self.ep.pg_port, "user": self.ep.user,
                          "password_env": self.password_env, "database": PG_DATABASE}
        return data

    def qualified(self, db: str, table: str) -> str:
        return f"{quote_ident(db)}.{quote_ident(table)}"

    def connect(self) -> Any:
        return pg_connect(self.ep)

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

    def insert_range(self, db: str, first: int, last: int) -> str:
        return (f"INSERT INTO {quote_ident(db)}.t SELECT i, 'v' || i"  # noqa: S608
                f" FROM generate_series({int(first)}, {int(last)}) i")

    def end_log_streams(self, source: str) -> int:
        conn = pg_connect(self.ep)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT count(pg_terminate_backend(active_pid)) FROM"
                            " pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT"
                            " NULL", (default_slot(source),))
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def create_typed(self, db: str) -> str:
        qs = f'"{db}"'
        pg_execute(self.ep, f"CREATE TYPE {qs}.mood AS ENUM ('sad', 'ok', 'happy')",
                   POSTGRES_TYPED.format(db=qs), f"ALTER TABLE {qs}.typed REPLICA IDENTITY FULL",
                   *(f"INSERT INTO {qs}.typed VALUES ({row})" for row in POSTGRES_TYPED_ROWS))
        return "typed"


def kit(kind: str, ep: Endpoints) -> SourceKit:
    return MariaDbKit(ep) if kind == "mariadb" else PostgresKit(ep)
