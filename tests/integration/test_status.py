# ruff: noqa: S608 - test SQL is built from q() and constants
"""``dblog status``: lag in bytes across binlog files and in seconds (pure functions, and a
real rotation on the local MariaDB)."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from dblog.app.config import parse_config
from dblog.app.runtime import open_runtime
from dblog.app.status import collect_status, lag_seconds, render_status
from dblog.sources.mysql.binlog import binlog_lag_bytes
from dblog.state import ABSENT, PositionState
from devtools.sample import config_dict, connect, q
from devtools.services import Endpoints

LOGS = [("mysql-bin.000007", 1000), ("mysql-bin.000008", 5000), ("mysql-bin.000009", 700),
        ("mysql-bin.000010", 300)]


def at(file: int, pos: int) -> dict[str, object]:
    return {"file": f"mysql-bin.{file:06d}", "pos": pos}


@pytest.mark.parametrize(("position", "head", "expected"), [
    (at(9, 400), at(9, 650), 250),  # same file: the offsets subtract
    (at(9, 650), at(9, 650), 0),
    (at(9, 400), at(10, 120), (700 - 400) + 120),  # the rest of 9, then 10 up to the head
    (at(7, 900), at(10, 4), (1000 - 900) + 5000 + 700 + 4),  # every file in between counts
    (at(8, 5000), at(9, 4), 4),  # at the very end of a file
])
def test_binlog_lag_bytes_across_files(position: dict[str, object], head: dict[str, object],
                                       expected: int) -> None:
    assert binlog_lag_bytes(position, head, LOGS) == expected


@pytest.mark.parametrize(("position", "head"), [
    (at(6, 400), at(9, 4)),  # the position's file was purged
    (at(9, 400), at(11, 4)),  # the head's file is not listed
    (at(10, 4), at(9, 4)),  # past the head (a reset log)
    (at(9, 701), at(10, 4)),  # past the end of its file
    (at(9, 650), at(9, 400)),
    ({"lsn": "0/16B3748"}, at(9, 4)),
])
def test_binlog_lag_bytes_unknown(position: dict[str, object], head: dict[str, object]) -> None:
    assert binlog_lag_bytes(position, head, LOGS) is None


def test_lag_seconds_from_the_source_commit_time() -> None:
    assert lag_seconds(0, 1_000_000, now_s=5_000.0) == 0.0  # caught up
    assert lag_seconds(0, None, now_s=5_000.0) == 0.0
    assert lag_seconds(1234, 1_000_000, now_s=1_060.5) == 60.5
    assert lag_seconds(None, 1_000_000, now_s=1_060.5) == 60.5
    assert lag_seconds(1234, 1_000_000, now_s=999.0) == 0.0  # clocks disagree a little
    assert lag_seconds(1234, None, now_s=5_000.0) is None


@pytest.mark.integration
def test_status_lag_across_a_real_binlog_rotation(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"t_status_{uuid.uuid4().hex[:8]}"
    conn = connect(services)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {q(db)}")
            cur.execute(f"CREATE TABLE {q(db)}.t (id INT PRIMARY KEY, v TEXT)")
        config = parse_config(config_dict(
            source=f"status-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.t"],
            lake=tmp_path / "lake", server_id=7850,
        ))
        with open_runtime(config, validate=False) as rt:
            start = dict(rt.dialect.head_position())
            rt.state.put_position(
                PositionState(rt.dialect.to_position(start), start, batch=0), ABSENT)
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {q(db)}.t VALUES (1, REPEAT('x', 2000))")
                cur.execute("FLUSH BINARY LOGS")
                cur.execute(f"INSERT INTO {q(db)}.t VALUES (2, REPEAT('y', 3000))")
            status = collect_status(rt)
            logs = rt.dialect.binary_logs()  # type: ignore[attr-defined]
            assert status.head is not None and status.head["file"] != start["file"]
            names = [n for n, _ in logs]
            first, last = names.index(start["file"]), names.index(status.head["file"])
            expected = (logs[first][1] - start["pos"]
                        + sum(size for _, size in logs[first + 1:last]) + status.head["pos"])
            assert status.lag_bytes == expected
            assert status.lag_bytes > 5000  # both rows' images
            out = io.StringIO()
            render_status(rt, Console(file=out, width=200))
            assert "lag ? bytes" not in out.getvalue()
            assert " bytes / " in out.getvalue()
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {q(db)}")
        conn.close()


@pytest.mark.integration
def test_status_lag_across_a_wal_segment_switch(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the lag is the WAL between the position and the head, segments apart."""
    from tests.integration.sources import PostgresKit

    pg = PostgresKit(services)
    monkeypatch.setenv(pg.password_env, pg.password)
    schema = pg.simple_table("t_status", 0)
    with pg.cleaned(schema, "status") as source:
        config = parse_config(pg.config_data(source=source, db=schema, lake=tmp_path / "lake",
                                             tables=[f"{schema}.t"]))
        with open_runtime(config, validate=False) as rt:
            rt.dialect.ensure_watermark_table()  # the slot, as a tailer's start makes it
            start = dict(rt.dialect.head_position())
            rt.state.put_position(
                PositionState(rt.dialect.to_position(start), start, batch=0), ABSENT)
            try:
                pg.run_sql(schema, "INSERT INTO {t} VALUES (1, repeat('x', 20))",
                           "SELECT pg_switch_wal()",
                           "INSERT INTO {t} VALUES (2, repeat('y', 20))")
                status = collect_status(rt)
                assert status.head is not None
                head, began = int(status.head["lsn"]), int(start["lsn"])
                conn = pg.connect()
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_size_bytes(current_setting('wal_segment_size'))")
                    segment = int(cur.fetchone()[0])
                conn.close()
                assert head // segment > began // segment  # the head is segments later
                assert status.lag_bytes == head - began
                out = io.StringIO()
                render_status(rt, Console(file=out, width=200))
                assert f"lag {head - began} bytes" in out.getvalue()
            finally:
                rt.state.delete("", recursive=True)
