"""The PostgreSQL sample schema and its random concurrent writers (the demo and the tests
use them): ``accounts`` (one key column, a TOASTed column) and ``orders`` (a two-column key),
as in :mod:`devtools.sample` for MariaDB."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2

from dblog.core.events import TableId
from dblog.sources.postgres.sqltext import quote_ident, quote_table
from devtools.sample import Change, ChangeHistory, Reconnecting, returned_rows
from devtools.services import Endpoints

PG_DATABASE = "postgres"


def pg_connect(ep: Endpoints, *, autocommit: bool = True) -> Any:
    conn = psycopg2.connect(host=ep.host, port=ep.pg_port, user=ep.user,
                            password=ep.pg_password, dbname=PG_DATABASE,
                            options="-c TimeZone=UTC")
    conn.autocommit = autocommit
    return conn


def pg_execute(ep: Endpoints, *statements: str) -> None:
    conn = pg_connect(ep)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def create_pg_schema(ep: Endpoints, schema: str, *, accounts: int, orders: int,
                     seed: int) -> None:
    """The sample tables in a new schema ``schema``, with ``REPLICA IDENTITY FULL``."""
    qs = quote_ident(schema)
    pg_execute(
        ep,
        f'CREATE SCHEMA {qs}',
        f'CREATE TABLE {qs}.accounts (id bigint PRIMARY KEY, name text NOT NULL,'
        " balance numeric(12,2) NOT NULL, big text, note text)",
        f'CREATE TABLE {qs}.orders (region text COLLATE "C", order_no bigint,'
        " amount double precision, status varchar(20) NOT NULL,"
        " PRIMARY KEY (region, order_no))",
        f'ALTER TABLE {qs}.accounts REPLICA IDENTITY FULL',
        f'ALTER TABLE {qs}.orders REPLICA IDENTITY FULL',
        f'INSERT INTO {qs}.accounts SELECT i, \'acct-\' || i,'
        f" ((i * {seed}) % 200000 - 100000) / 100.0,"
        " CASE WHEN i % 5 = 0 THEN repeat('t', 12000) END,"
        " (ARRAY[NULL, '', 'naïve ☃ 🚀'])[1 + i % 3]"
        f" FROM generate_series(1, {accounts}) i",
        f'INSERT INTO {qs}.orders SELECT (ARRAY[\'eu\', \'us\', \'ap\'])[1 + i % 3],'
        f" i, i * 1.25, 'new' FROM generate_series(1, {orders}) i",
    )


def pg_source_config(*, source: str, ep: Endpoints, schema: str, lake: Path,
                     **options: Any) -> dict[str, Any]:
    """The sample schema's pipeline configuration (as parsed YAML), like
    :func:`devtools.sample.config_dict` for MariaDB."""
    from devtools.sample import TABLES, config_dict

    data = config_dict(source=source, ep=ep, tables=[f"{schema}.{t}" for t in TABLES],
                       lake=lake, **options)
    data["source"] = {"name": source, "kind": "postgres", "host": ep.host,
                      "port": ep.pg_port, "user": ep.user,
                      "password_env": "DBLOG_PG_PASSWORD", "database": PG_DATABASE}
    return data


@dataclass
class PgWorkload(Reconnecting):
    """Writer threads on ``accounts`` (one key, a TOASTed column) and ``orders`` (a
    two-column key): inserts, updates (some leaving the TOASTed value unchanged, some
    changing the key), deletes, delete + re-insert, multi-statement transactions, rollbacks;
    every change they commit is in :attr:`history`."""

    ep: Endpoints
    schema: str
    seed: int
    threads: int = 2
    pause_s: float = 0.02
    reserve_every: int = 10
    append_ratio: float = 0.0
    """Share of statements that append a row after the largest key."""
    survive_outages: bool = False
    """When true, a writer whose connection is lost (the server restarting) reconnects and
    goes on; a transaction that was in flight may or may not have committed."""
    touched: set[tuple[str, tuple[Any, ...]]] = field(default_factory=set)
    """Every key a committed transaction's statement aimed at (changed or not)."""
    history: ChangeHistory = field(default_factory=ChangeHistory)
    ops: int = 0
    outages: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _errors: list[BaseException] = field(default_factory=list)
    _workers: list[threading.Thread] = field(default_factory=list)
    _appended: int = 0

    def start(self) -> PgWorkload:
        for n in range(self.threads):
            t = threading.Thread(target=self._run, args=(self.seed * 100 + n,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(60)
        if self._errors:
            raise self._errors[0]

    def _key(self, rng: random.Random, high: int) -> int:
        n = rng.randint(1, 20) if rng.random() < 0.3 else rng.randint(1, high)
        return n + 1 if n % self.reserve_every == 0 else n

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        conn: Any = None
        try:
            while not self._stop.is_set():
                if conn is None:
                    conn = self._connect()
                    if conn is None:
                        continue
                try:
                    self._transaction(conn, rng)
                except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
                    lost = conn.closed or isinstance(exc, psycopg2.errors.AdminShutdown
                                                     | psycopg2.errors.CannotConnectNow)
                    if not (self.survive_outages and lost):
                        raise
                    self._lost(conn)
                    conn = None
                    continue
                time.sleep(rng.random() * self.pause_s)
        except BaseException as exc:
            self._errors.append(exc)
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> Any:
        try:
            return pg_connect(self.ep, autocommit=False)
        except psycopg2.OperationalError:
            if not self.survive_outages:
                raise
            time.sleep(0.5)  # the server is restarting
            return None


    def _transaction(self, conn: Any, rng: random.Random) -> None:
        keys: list[tuple[str, tuple[Any, ...]]] = []
        changes: list[Change] = []
        try:
            with conn.cursor() as cur:
                for _ in range(rng.choice([1, 1, 1, 2, 3])):
                    keys += self._statement(cur, rng, changes)
            if rng.random() < 0.1:
                conn.rollback()
                keys = []
            else:
                try:
                    conn.commit()
                except BaseException:
                    self.history.unsure(changes)  # the commit may have happened
                    raise
                self.history.committed(changes)
        except (psycopg2.errors.DeadlockDetected, psycopg2.errors.UniqueViolation):
            conn.rollback()
            keys = []
        with self._lock:
            self.touched.update(keys)
            self.ops += 1

    def _written(self, cur: Any, changes: list[Change], table: str,
                 key: tuple[Any, ...]) -> None:
        """Record the row the last statement (``... RETURNING *``) wrote for ``key``, if it
        wrote one. PostgreSQL logs every row an update matched, even one it left as it
        was. The writer's transaction still holds the row's lock (see
        :class:`devtools.sample.ChangeHistory`)."""
        for row in returned_rows(cur):
            changes.append(self.history.change(table, key, row))

    def _deleted(self, cur: Any, changes: list[Change], table: str,
                 key: tuple[Any, ...]) -> None:
        """Record the row the last statement (``DELETE ... RETURNING *``) deleted, if any."""
        for row in returned_rows(cur):
            changes.append(self.history.change(table, key, None, deleted=row))

    def _statement(self, cur: Any, rng: random.Random, changes: list[Change]
                   ) -> list[tuple[str, tuple[Any, ...]]]:
        """One random statement on one key (a key change: two); its changes go to
        ``changes``; returns the keys it aimed at."""
        acc = quote_table(TableId(self.schema, "accounts"))
        ords = quote_table(TableId(self.schema, "orders"))
        if rng.random() < self.append_ratio:
            with self._lock:
                self._appended += 1
                n = self._appended
            if n % 2:
                key = 10_000_000 + n
                cur.execute(f"INSERT INTO {acc} VALUES (%s, %s, 0, NULL, 'appended')"
                            " RETURNING *", (key, f"a-{n}"))
                self._written(cur, changes, "accounts", (key,))
                return [("accounts", (key,))]
            cur.execute(f"INSERT INTO {ords} VALUES ('eu', %s, 1.0, 'new') RETURNING *",
                        (2 * 10**12 + n,))
            self._written(cur, changes, "orders", ("eu", 2 * 10**12 + n))
            return [("orders", ("eu", 2 * 10**12 + n))]
        if rng.random() < 0.6:
            key = self._key(rng, 2000)
            op = rng.random()
            if op < 0.35:
                cur.execute(
                    f'INSERT INTO {acc} VALUES (%s, %s, %s, NULL, %s) ON CONFLICT (id)'
                    " DO UPDATE SET balance = EXCLUDED.balance, name = EXCLUDED.name"
                    " RETURNING *",
                    (key, f"w-{rng.randint(0, 10**6)}",
                     Decimal(rng.randint(-10**6, 10**6)) / 100, "w ✓"))
                self._written(cur, changes, "accounts", (key,))
            elif op < 0.55:  # leaves the TOASTed column as it is
                cur.execute(f'UPDATE {acc} SET balance = balance + 1, note = %s'
                            " WHERE id = %s RETURNING *", (f"u{rng.randint(0, 99)} 🚀", key))
                self._written(cur, changes, "accounts", (key,))
            elif op < 0.65:
                cur.execute(f'UPDATE {acc} SET big = repeat(%s, 9000) WHERE id = %s'
                            " RETURNING *", (rng.choice("abc"), key))
                self._written(cur, changes, "accounts", (key,))
            elif op < 0.75:  # a key change: the old key goes, a new one comes
                new = 100_000 + rng.randint(0, 10**6)
                cur.execute(f'UPDATE {acc} SET id = %s WHERE id = %s RETURNING *', (new, key))
                for row in returned_rows(cur):  # logged as the old row's delete, then an insert
                    changes.append(self.history.change("accounts", (key,), None))
                    changes.append(self.history.change("accounts", (new,), row))
                return [("accounts", (key,)), ("accounts", (new,))]
            elif op < 0.9:
                cur.execute(f'DELETE FROM {acc} WHERE id = %s RETURNING *', (key,))
                self._deleted(cur, changes, "accounts", (key,))
            else:
                cur.execute(f'DELETE FROM {acc} WHERE id = %s RETURNING *', (key,))
                self._deleted(cur, changes, "accounts", (key,))
                cur.execute(f"INSERT INTO {acc} VALUES (%s, 'reborn', 0, NULL, NULL)"
                            " RETURNING *", (key,))
                self._written(cur, changes, "accounts", (key,))
            return [("accounts", (key,))]
        region = rng.choice(["eu", "us", "ap"])
        order_no = self._key(rng, 3000)
        op = rng.random()
        if op < 0.4:
            cur.execute(f"INSERT INTO {ords} VALUES (%s, %s, %s, 'new') ON CONFLICT"
                        " (region, order_no) DO UPDATE SET amount = EXCLUDED.amount"
                        " RETURNING *", (region, order_no, rng.random() * 1000))
            self._written(cur, changes, "orders", (region, order_no))
        elif op < 0.8:
            cur.execute(f'UPDATE {ords} SET status = %s, amount = amount * 1.5'
                        " WHERE region = %s AND order_no = %s RETURNING *",
                        (rng.choice(["paid", "shipped"]), region, order_no))
            self._written(cur, changes, "orders", (region, order_no))
        else:
            cur.execute(f'DELETE FROM {ords} WHERE region = %s AND order_no = %s RETURNING *',
                        (region, order_no))
            self._deleted(cur, changes, "orders", (region, order_no))
        return [("orders", (region, order_no))]
