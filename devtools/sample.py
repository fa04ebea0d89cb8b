"""A sample schema and a random concurrent workload (the demo and the tests use it)."""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
import yaml

from dblog.sources.mysql.sqltext import quote_ident
from devtools.services import Endpoints

SCHEMA = [
    # A simple integer key, with a hot subset.
    """CREATE TABLE {db}.accounts (
         id INT PRIMARY KEY,
         name VARCHAR(64) NOT NULL,
         balance DECIMAL(12,2) NOT NULL,
         flags BIGINT UNSIGNED,
         note TEXT
       ) ENGINE=InnoDB""",
    # A composite key of a string and an unsigned integer.
    """CREATE TABLE {db}.orders (
         region CHAR(2) NOT NULL,
         order_no BIGINT UNSIGNED NOT NULL,
         amount DOUBLE,
         status ENUM('new','paid','shipped') NOT NULL,
         PRIMARY KEY (region, order_no)
       ) ENGINE=InnoDB""",
]
TABLES = ("accounts", "orders")
REGIONS = ("eu", "us", "ap")
LOST_CONNECTION = (2003, 2006, 2013)
"""Client errors of a connection the server closed or refused (a restart)."""


q = quote_ident
"""Quote a MySQL identifier (the MySQL source's own quoting)."""


@dataclass(frozen=True)
class Change:
    """One row change a writer's statement made in a transaction that committed."""

    table: str
    key: tuple[Any, ...]
    after: dict[str, Any] | None
    """The row as the statement left it, read back in its transaction; None: deleted."""
    stamp: int
    """Its place in the commit order of ``key``'s changes (see :class:`ChangeHistory`)."""
    deleted: dict[str, Any] | None = None
    """For a delete, the row the database said it deleted (``DELETE ... RETURNING``)."""


class ChangeHistory:
    """Every row change the writers committed, with its order among the changes of its key.

    The order is exact, because each change's stamp is taken while the database holds the
    row lock that serializes the key's writers. Every statement changes one key (a
    PostgreSQL key change two: the old key's row goes, the new key's comes), and the
    database keeps every row a transaction changed locked until it ends: InnoDB an
    exclusive lock on the changed, inserted or delete-marked index record; PostgreSQL the
    updated or deleted tuple (its ``xmax``) and, for an inserted key, the unique index
    entry another inserter of that key waits on. A second transaction changing the same key
    waits there, so its statement changes the row only after the first transaction
    committed (or rolled back). A writer takes the stamp from one counter all writers share
    right after its statement, before its commit: of two committed changes of a key in two
    transactions, the first's stamp was drawn before its commit, the second's after its
    statement, which came after that commit. Within a transaction the statements run one
    after another, as the log holds them. And a transaction's locks are released only
    after its commit is in the log (MariaDB writes the binlog before InnoDB commits;
    PostgreSQL writes the commit record first), so ordering one key's changes by stamp is
    the order of their log events: the commit order, then the order in the transaction.

    A statement that changed no row (an update or delete of a missing key; in MariaDB also
    one that left the row as it was, which writes no row event) records nothing: the
    writers record a change only where the database says the statement changed a row.
    Changes of a transaction that rolled back are dropped; those of one whose commit was
    cut off (a lost connection) may or may not have happened, and go to :attr:`uncertain`
    instead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamps = itertools.count()
        self.changes: list[Change] = []
        """Committed changes, in the order of their commits' return (not by stamp)."""
        self.uncertain: list[Change] = []

    def change(self, table: str, key: tuple[Any, ...], after: dict[str, Any] | None,
               deleted: dict[str, Any] | None = None) -> Change:
        """A change its statement just made, stamped now (call it with the row still locked:
        after the statement, before the transaction ends)."""
        with self._lock:
            stamp = next(self._stamps)
        return Change(table, key, after, stamp, deleted)

    def committed(self, changes: Sequence[Change]) -> None:
        with self._lock:
            self.changes.extend(changes)

    def unsure(self, changes: Sequence[Change]) -> None:
        with self._lock:
            self.uncertain.extend(changes)

    def of(self, table: str) -> list[Change]:
        """The committed changes of ``table`` in stamp order."""
        with self._lock:
            return sorted((c for c in self.changes if c.table == table),
                          key=lambda c: c.stamp)


def returned_rows(cur: Any) -> list[dict[str, Any]]:
    """The rows a statement returned (``RETURNING``, ``SELECT``), as column -> value."""
    names = [d[0] for d in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def connect(ep: Endpoints, db: str | None = None, autocommit: bool = True) -> Any:
    return pymysql.connect(
        host=ep.host, port=ep.mariadb_port, user=ep.user, password=ep.mariadb_password,
        database=db, autocommit=autocommit, charset="utf8mb4",
    )


def create_schema(ep: Endpoints, db: str, accounts: int, orders: int, seed: int) -> None:
    rng = random.Random(seed)
    conn = connect(ep)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {q(db)}")
        cur.execute(f"CREATE DATABASE {q(db)}")
        for ddl in SCHEMA:
            cur.execute(ddl.format(db=q(db)))
        cur.executemany(
            f"INSERT INTO {q(db)}.accounts VALUES (%s, %s, %s, %s, %s)",  # noqa: S608
            [(i, f"acct-{i}", Decimal(rng.randint(-10**6, 10**6)) / 100,
              rng.choice([None, 0, 2**64 - 1, rng.randint(0, 2**63)]),
              rng.choice([None, "", "naïve ☃ 🚀"])) for i in range(1, accounts + 1)],
        )
        cur.executemany(
            f"INSERT INTO {q(db)}.orders VALUES (%s, %s, %s, %s)",  # noqa: S608
            [(REGIONS[i % 3], 10**12 + i, rng.random() * 1000, "new")
             for i in range(1, orders + 1)],
        )
    conn.close()


class Reconnecting:
    """What a writer does with a connection a server restart broke (the writers of both
    sample schemas): count the outage, close the connection quietly, pause, reconnect."""

    _lock: threading.Lock
    outages: int

    def _lost(self, conn: Any) -> None:
        with self._lock:
            self.outages += 1
        with contextlib.suppress(Exception):
            conn.close()
        time.sleep(0.2)


@dataclass
class Workload(Reconnecting):
    """Writer threads doing inserts/updates/deletes, multi-row transactions and rollbacks;
    every change they commit is in :attr:`history`."""

    ep: Endpoints
    db: str
    seed: int
    threads: int = 2
    pause_s: float = 0.01
    """Each writer sleeps up to this long between transactions."""
    append_ratio: float = 0.0
    """Share of statements that insert a new row after the largest key (a table growing at
    the end of its key space, which a capture must not chase forever)."""
    reserve_every: int = 0
    """When > 0, writers never touch an existing key divisible by it (ids, order numbers), so
    a test's "untouched rows were captured exactly once" check always has rows to check,
    however long the capture runs."""
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
    _next_append: int = 0

    def start(self) -> Workload:
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

    def _touch(self, table: str, key: tuple[Any, ...]) -> None:
        with self._lock:
            self.touched.add((table, key))

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
                except pymysql.err.OperationalError as exc:
                    if self.survive_outages and exc.args[0] in LOST_CONNECTION:
                        self._lost(conn)
                        conn = None
                        continue
                    if exc.args[0] not in (1213, 1205):  # deadlock / lock wait: retry
                        raise
                    conn.rollback()
                except pymysql.err.InterfaceError:
                    if not self.survive_outages:
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
            return connect(self.ep, self.db, autocommit=False)
        except pymysql.err.OperationalError as exc:
            if not (self.survive_outages and exc.args[0] in LOST_CONNECTION):
                raise
            time.sleep(0.5)  # the server is restarting
            return None


    def _transaction(self, conn: Any, rng: random.Random) -> None:
        statements = rng.choice([1, 1, 1, 2, 3, 5])
        rollback = rng.random() < 0.1
        keys: list[tuple[str, tuple[Any, ...]]] = []
        changes: list[Change] = []
        with conn.cursor() as cur:
            for _ in range(statements):
                keys.append(self._statement(cur, rng, changes))
        if rollback:
            conn.rollback()
        else:
            try:
                conn.commit()
            except BaseException:
                self.history.unsure(changes)  # the commit may have happened
                raise
            self.history.committed(changes)
            for table, key in keys:
                self._touch(table, key)
        with self._lock:
            self.ops += statements

    def _appended_key(self) -> int:
        with self._lock:
            self._next_append += 1
            return self._next_append

    def _unreserved(self, n: int) -> int:
        return n + 1 if self.reserve_every and n % self.reserve_every == 0 else n

    def _written(self, cur: Any, changes: list[Change], table: str, key: tuple[Any, ...],
                 where: str) -> None:
        """Record the change the last statement made to ``key`` (``where`` selects its
        row), if it changed a row: InnoDB counts a row left as it was as unchanged, and
        then writes no row event either. The row is read back by the writer's own
        transaction, which holds its lock (see :class:`ChangeHistory`)."""
        if cur.rowcount <= 0:
            return
        cur.execute(f"SELECT * FROM {q(table)} WHERE {where}", key)  # noqa: S608
        rows = returned_rows(cur)
        if len(rows) != 1:
            raise RuntimeError(f"{table} {key}: changed, then {len(rows)} rows read back")
        changes.append(self.history.change(table, key, rows[0]))

    def _deleted(self, cur: Any, changes: list[Change], table: str, key: tuple[Any, ...],
                 where: str) -> None:
        """Delete ``key``'s row (``where`` selects it) and record it, if there was one."""
        cur.execute(f"DELETE FROM {q(table)} WHERE {where} RETURNING *", key)  # noqa: S608
        for row in returned_rows(cur):
            changes.append(self.history.change(table, key, None, deleted=row))

    def _statement(self, cur: Any, rng: random.Random, changes: list[Change]
                   ) -> tuple[str, tuple[Any, ...]]:
        """One random statement on one key; its change (if any) goes to ``changes``."""
        by_id, by_order = "id = %s", "region = %s AND order_no = %s"
        if rng.random() < self.append_ratio:
            n = self._appended_key()
            if n % 2:
                key = 1_000_000 + n
                cur.execute("INSERT INTO accounts VALUES (%s, %s, 0.00, NULL, 'appended')",
                            (key, f"a-{n}"))
                self._written(cur, changes, "accounts", (key,), by_id)
                return "accounts", (key,)
            region, order_no = rng.choice(REGIONS), 2 * 10**12 + n
            cur.execute("INSERT INTO orders VALUES (%s, %s, 1.0, 'new')", (region, order_no))
            self._written(cur, changes, "orders", (region, order_no), by_order)
            return "orders", (region, order_no)
        if rng.random() < 0.6:
            hot = rng.random() < 0.3
            key = self._unreserved(rng.randint(1, 20) if hot else rng.randint(1, 4000))
            op = rng.random()
            if op < 0.45:
                cur.execute(
                    "INSERT INTO accounts VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                    "balance = VALUES(balance), name = VALUES(name)",
                    (key, f"w-{rng.randint(0, 10**6)}", Decimal(rng.randint(-10**6, 10**6)) / 100,
                     rng.choice([None, 2**64 - 1, rng.randint(0, 2**40)]), "w ✓"),
                )
                self._written(cur, changes, "accounts", (key,), by_id)
            elif op < 0.8:
                cur.execute("UPDATE accounts SET balance = balance + 1, note = %s WHERE id = %s",
                            (f"u{rng.randint(0, 99)} 🚀", key))
                self._written(cur, changes, "accounts", (key,), by_id)
            elif op < 0.9:
                self._deleted(cur, changes, "accounts", (key,), by_id)
            else:  # delete, then re-insert the same key in the same transaction
                self._deleted(cur, changes, "accounts", (key,), by_id)
                cur.execute("INSERT INTO accounts VALUES (%s, 'reborn', 0.00, NULL, NULL)",
                            (key,))
                self._written(cur, changes, "accounts", (key,), by_id)
            return "accounts", (key,)
        region = rng.choice(REGIONS)
        order_no = 10**12 + self._unreserved(rng.randint(1, 6000))
        op = rng.random()
        if op < 0.4:
            cur.execute(
                "INSERT INTO orders VALUES (%s, %s, %s, 'new') ON DUPLICATE KEY UPDATE "
                "amount = VALUES(amount)", (region, order_no, rng.random() * 1000),
            )
            self._written(cur, changes, "orders", (region, order_no), by_order)
        elif op < 0.8:
            cur.execute("UPDATE orders SET status = %s, amount = amount * 1.5 "
                        "WHERE region = %s AND order_no = %s",
                        (rng.choice(["paid", "shipped"]), region, order_no))
            self._written(cur, changes, "orders", (region, order_no), by_order)
        else:
            self._deleted(cur, changes, "orders", (region, order_no), by_order)
        return "orders", (region, order_no)


def config_dict(*, source: str, ep: Endpoints, tables: list[str], lake: Path | str,
                server_id: int | None = None, chunk_size: int = 250, max_in_flight: int = 4,
                batch_seconds: float = 0.5, poll_seconds: float = 0.2,
                chunk_max_rows: int | None = None) -> dict[str, Any]:
    """A pipeline configuration (as parsed YAML) for the local services. Chunks keep
    ``chunk_size`` rows unless ``chunk_max_rows`` lets them grow."""
    return {
        "source": {"name": source, "kind": "mariadb", "host": ep.host, "port": ep.mariadb_port,
                   "user": ep.user, "password_env": "DBLOG_MARIADB_PASSWORD",
                   "server_id": server_id or 7000 + abs(hash(source)) % 1000},
        "tables": tables,
        "lake": str(lake),
        "zookeeper": {"hosts": ep.zk_hosts, "root": "dblog-test"},
        "capture": {"chunk_size": chunk_size, "max_in_flight": max_in_flight,
                    "chunk_max_rows": chunk_max_rows or chunk_size},
        "tail": {"batch_max_seconds": batch_seconds, "poll_seconds": poll_seconds},
    }


def write_config(path: Path, *, source: str, ep: Endpoints, db: str, lake: Path,
                 chunk_size: int = 250, batch_seconds: float = 0.5,
                 chunk_max_rows: int | None = None) -> Path:
    """Write the sample schema's configuration to ``path``."""
    config = config_dict(source=source, ep=ep, tables=[f"{db}.{t}" for t in TABLES], lake=lake,
                         chunk_size=chunk_size, batch_seconds=batch_seconds,
                         chunk_max_rows=chunk_max_rows)
    path.write_text(yaml.safe_dump(config))
    return path
