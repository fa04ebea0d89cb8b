"""PostgreSQL test helpers: plain psycopg2, independent of the pipeline's own readers."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2

from pipeline.config import PipelineConfig, parse_config
from pipeline.services import Endpoints

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


def pg_rows(ep: Endpoints, qualified: str, key: tuple[str, ...]
            ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row of ``qualified`` (a quoted schema.table), by key."""
    conn = pg_connect(ep)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {qualified}")  # noqa: S608 - quoted by the caller
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        conn.close()
    return {tuple(r[k] for k in key): r for r in rows}


def pg_config(ep: Endpoints, *, name: str, tables: list[str], lake: Path,
              **capture: Any) -> PipelineConfig:
    return parse_config({
        "source": {"name": name, "kind": "postgres", "host": ep.host, "port": ep.pg_port,
                   "user": ep.user, "password_env": "DBLOG_PG_PASSWORD",
                   "database": PG_DATABASE},
        "tables": tables, "lake": str(lake),
        "tail": {"batch_max_seconds": 1.0, "mirror_every_s": 2.0},
        "capture": {"chunk_size": 300, **capture},
    })


def drop_replication(ep: Endpoints, name: str) -> None:
    """Drop the slot and publication a test's source created."""
    from pipeline.sources.postgres.connection import default_slot

    slot = default_slot(name)
    conn = pg_connect(ep)
    try:
        with conn.cursor() as cur:
            for _ in range(50):  # the walsender may still be leaving
                cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                            (slot,))
                row = cur.fetchone()
                if row is None or not row[0]:
                    break
                time.sleep(0.2)
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s", (slot,))
            cur.execute(f'DROP PUBLICATION IF EXISTS "{slot}"')
    finally:
        conn.close()


@dataclass
class PgWorkload:
    """Writer threads on ``accounts`` (one key, a TOASTed column) and ``orders`` (a
    two-column key): inserts, updates (some leaving the TOASTed value unchanged, some
    changing the key), deletes, delete + re-insert, multi-statement transactions, rollbacks."""

    ep: Endpoints
    schema: str
    seed: int
    threads: int = 2
    pause_s: float = 0.02
    reserve_every: int = 10
    touched: set[tuple[str, tuple[Any, ...]]] = field(default_factory=set)
    ops: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _errors: list[BaseException] = field(default_factory=list)
    _workers: list[threading.Thread] = field(default_factory=list)

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
        conn = pg_connect(self.ep, autocommit=False)
        try:
            while not self._stop.is_set():
                keys: list[tuple[str, tuple[Any, ...]]] = []
                try:
                    with conn.cursor() as cur:
                        for _ in range(rng.choice([1, 1, 1, 2, 3])):
                            keys += self._statement(cur, rng)
                    if rng.random() < 0.1:
                        conn.rollback()
                        keys = []
                    else:
                        conn.commit()
                except (psycopg2.errors.DeadlockDetected,
                        psycopg2.errors.UniqueViolation):
                    conn.rollback()
                    keys = []
                with self._lock:
                    self.touched.update(keys)
                    self.ops += 1
                time.sleep(rng.random() * self.pause_s)
        except BaseException as exc:
            self._errors.append(exc)
        finally:
            conn.close()

    def _statement(self, cur: Any, rng: random.Random) -> list[tuple[str, tuple[Any, ...]]]:
        s = self.schema
        if rng.random() < 0.6:
            key = self._key(rng, 2000)
            op = rng.random()
            if op < 0.35:
                cur.execute(
                    f'INSERT INTO "{s}".accounts VALUES (%s, %s, %s, NULL, %s) ON CONFLICT (id)'
                    " DO UPDATE SET balance = EXCLUDED.balance, name = EXCLUDED.name",
                    (key, f"w-{rng.randint(0, 10**6)}",
                     Decimal(rng.randint(-10**6, 10**6)) / 100, "w ✓"))
            elif op < 0.55:  # leaves the TOASTed column as it is
                cur.execute(f'UPDATE "{s}".accounts SET balance = balance + 1, note = %s'
                            " WHERE id = %s", (f"u{rng.randint(0, 99)} 🚀", key))
            elif op < 0.65:
                cur.execute(f'UPDATE "{s}".accounts SET big = repeat(%s, 9000) WHERE id = %s',
                            (rng.choice("abc"), key))
            elif op < 0.75:  # a key change: the old key goes, a new one comes
                new = 100_000 + rng.randint(0, 10**6)
                cur.execute(f'UPDATE "{s}".accounts SET id = %s WHERE id = %s', (new, key))
                return [("accounts", (key,)), ("accounts", (new,))]
            elif op < 0.9:
                cur.execute(f'DELETE FROM "{s}".accounts WHERE id = %s', (key,))
            else:
                cur.execute(f'DELETE FROM "{s}".accounts WHERE id = %s', (key,))
                cur.execute(f"INSERT INTO \"{s}\".accounts VALUES (%s, 'reborn', 0, NULL, NULL)",
                            (key,))
            return [("accounts", (key,))]
        region = rng.choice(["eu", "us", "ap"])
        order_no = self._key(rng, 3000)
        op = rng.random()
        if op < 0.4:
            cur.execute(f"INSERT INTO \"{s}\".orders VALUES (%s, %s, %s, 'new') ON CONFLICT"
                        " (region, order_no) DO UPDATE SET amount = EXCLUDED.amount",
                        (region, order_no, rng.random() * 1000))
        elif op < 0.8:
            cur.execute(f'UPDATE "{s}".orders SET status = %s, amount = amount * 1.5'
                        " WHERE region = %s AND order_no = %s",
                        (rng.choice(["paid", "shipped"]), region, order_no))
        else:
            cur.execute(f'DELETE FROM "{s}".orders WHERE region = %s AND order_no = %s',
                        (region, order_no))
        return [("orders", (region, order_no))]
