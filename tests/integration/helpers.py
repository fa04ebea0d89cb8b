"""Small helpers the integration tests share: scratch databases, the `dblog` command in a
subprocess (so a crash point can SIGKILL it) and polling for a condition."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dblog.sources.mysql import MySqlSettings
from dblog.state.handoff import chunk_path
from devtools.sample import connect, q
from devtools.services import Endpoints


def make_settings(ep: Endpoints, **overrides: Any) -> MySqlSettings:
    """Settings for the local MariaDB with a random replica server id (readers of
    concurrent tests never share one)."""
    values: dict[str, Any] = {
        "name": "mariadb", "host": ep.host, "port": ep.mariadb_port, "user": ep.user,
        "password": ep.mariadb_password, "server_id": random.randint(100_000, 2**31 - 1),
    }
    values.update(overrides)
    return MySqlSettings(**values)


def make_db(ep: Endpoints, ddl: list[str], prefix: str = "t") -> str:
    """A new database named ``<prefix>_<random>``; ``ddl`` statements use ``{db}``."""
    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn = connect(ep)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {q(db)}")
        for statement in ddl:
            cur.execute(statement.format(db=q(db)))
    conn.close()
    return db


def run_statements(conn: Any, *statements: str | tuple[str, Any]) -> None:
    """Run statements on ``conn``, in order; a tuple is a statement and its arguments."""
    with conn.cursor() as cur:
        for statement in statements:
            if isinstance(statement, tuple):
                cur.execute(*statement)
            else:
                cur.execute(statement)


def execute(ep: Endpoints, db: str, *statements: str) -> None:
    """Run statements in ``db``, each committed on its own."""
    conn = connect(ep, db)
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    conn.close()


def wait_for(what: str, done: Callable[[], object], timeout: float = 60.0,
             poll: float = 0.05) -> None:
    """Poll ``done()`` every ``poll`` seconds until it is true; fail, naming ``what``, after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def wait_for_a_held_chunk(rt: Any, timeout: float = 120.0) -> None:
    """Poll until a capture holds a selected chunk for one of the registered windows (its
    chunk document exists), for at most ``timeout`` seconds; returns either way (the
    caller stops the capture next, and the capture's result says how far it got)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(
            rt.state.get(chunk_path(w.value.window.window_id)) is not None
            for w in rt.state.list_windows()):
        time.sleep(0.05)


def run_dblog(config: Path, *args: str, password: str, fault: str | None = None,
              env_extra: dict[str, str] | None = None) -> tuple[int, str]:
    """``dblog -c config args`` in a subprocess; (exit code, stdout). A crash point
    (``fault``, see dblog/core/faults.py) ends it with -9; any other failure fails the test.
    ``env_extra``: more environment for the process (a time zone, say)."""
    # The password of whichever source the config names (its ``password_env``).
    env = {**os.environ, "DBLOG_MARIADB_PASSWORD": password, "DBLOG_PG_PASSWORD": password,
           **(env_extra or {})}
    env.pop("DBLOG_FAULT", None)
    if fault:
        env["DBLOG_FAULT"] = fault
    proc = subprocess.run(
        [sys.executable, "-m", "dblog.app.cli", "-c", str(config), *args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode not in (0, -9):
        raise AssertionError(f"dblog {args} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.returncode, proc.stdout


def smoke_result(path: Path, name: str) -> dict[str, Any]:
    """A bench smoke's result file, checked for what every bench writes (its name, the smoke
    flag, machine, versions and results)."""
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["name"] == name
    assert doc["parameters"]["smoke"] is True
    assert doc["machine"]["cores"] > 0 and doc["versions"]["pyspark"]
    assert doc["results"]
    return doc
