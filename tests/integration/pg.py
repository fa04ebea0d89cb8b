"""PostgreSQL test helpers: plain psycopg2, independent of the pipeline's own readers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dblog.app.config import PipelineConfig, parse_config
from devtools.sample_pg import PG_DATABASE, PgWorkload, pg_connect, pg_execute
from devtools.services import Endpoints

__all__ = ["PG_DATABASE", "PgWorkload", "drop_replication", "dropped_after", "pg_config",
           "pg_connect", "pg_execute", "pg_rows"]


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
              source: dict[str, Any] | None = None, **capture: Any) -> PipelineConfig:
    return parse_config({
        "source": {"name": name, "kind": "postgres", "host": ep.host, "port": ep.pg_port,
                   "user": ep.user, "password_env": "DBLOG_PG_PASSWORD",
                   "database": PG_DATABASE, **(source or {})},
        "tables": tables, "lake": str(lake),
        "tail": {"batch_max_seconds": 1.0, "mirror_every_s": 2.0},
        "capture": {"chunk_size": 300, **capture},
    })


def drop_replication(ep: Endpoints, name: str) -> None:
    """Drop the slot and publication a test's source created."""
    from dblog.sources.postgres.connection import default_slot

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


@contextmanager
def dropped_after(ep: Endpoints, schema: str, source: str) -> Iterator[None]:
    """On exit, drop what pipeline source ``source`` left on the server (slot,
    publication) and the scratch schema ``schema``."""
    try:
        yield
    finally:
        drop_replication(ep, source)
        pg_execute(ep, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
