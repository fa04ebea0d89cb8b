"""The local services are real and usable: MariaDB binlog, PostgreSQL logical slot, ZooKeeper,
Spark with Delta; and their manager fails clearly on a taken port or a missing package."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import psycopg2
import psycopg2.errors
import psycopg2.extras
import pymysql
import pytest
from kazoo.client import KazooClient
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

from dblog.core.errors import ServiceError
from devtools import services as svc

pytestmark = pytest.mark.integration


def _mariadb(ep: svc.Endpoints) -> pymysql.Connection:  # type: ignore[type-arg]
    return pymysql.connect(
        host=ep.host, port=ep.mariadb_port, user=ep.user, password=ep.mariadb_password,
        autocommit=True, charset="utf8mb4",
    )


def test_up_is_idempotent(services: svc.Endpoints) -> None:
    lines = svc.up()
    assert all("already running" in line for line in lines), lines
    assert all("healthy" in line for line in svc.status())


def test_mariadb_binlog_event_is_read_back(services: svc.Endpoints) -> None:
    conn = _mariadb(services)
    with conn.cursor() as cur:
        cur.execute("SELECT @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
        assert cur.fetchone() == ("ROW", "FULL", "FULL")
        cur.execute("CREATE DATABASE IF NOT EXISTS svc_test")
        cur.execute("CREATE TABLE IF NOT EXISTS svc_test.t (id INT PRIMARY KEY, name VARCHAR(20))")
        cur.execute("SHOW MASTER STATUS")
        log_file, log_pos = cur.fetchone()[:2]
        marker = uuid.uuid4().hex[:20]
        cur.execute("INSERT INTO svc_test.t VALUES (%s, %s)", (abs(hash(marker)) % 10**9, marker))
    stream = BinLogStreamReader(
        connection_settings={
            "host": services.host, "port": services.mariadb_port, "user": services.user,
            "passwd": services.mariadb_password,
        },
        server_id=4242, log_file=log_file, log_pos=log_pos, resume_stream=True, blocking=False,
        # is_mariadb=True would ignore log_file/log_pos (mysql-replication 1.0) and read the
        # whole binlog; the MySQL protocol path works against MariaDB.
        only_events=[WriteRowsEvent], is_mariadb=False,
    )
    try:
        rows = [row["values"] for event in stream for row in event.rows]
    finally:
        stream.close()
        conn.close()
    # Column names come from the binlog's own metadata (binlog_row_metadata=FULL).
    assert {"id": abs(hash(marker)) % 10**9, "name": marker} in rows


def test_postgres_logical_slot_yields_a_change(services: svc.Endpoints) -> None:
    dsn = dict(host=services.host, port=services.pg_port, user=services.user,
               password=services.pg_password, dbname="postgres")
    conn = psycopg2.connect(**dsn)
    conn.autocommit = True
    slot = f"svc_test_{uuid.uuid4().hex[:8]}"
    cur = conn.cursor()
    cur.execute("SHOW wal_level")
    assert cur.fetchone() == ("logical",)
    cur.execute("CREATE TABLE IF NOT EXISTS svc_test (id int PRIMARY KEY, name text)")
    repl = psycopg2.connect(**dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    rcur = repl.cursor()
    try:
        rcur.create_replication_slot(slot, output_plugin="wal2json")
        marker = uuid.uuid4().hex
        cur.execute("INSERT INTO svc_test VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                    "SET name = EXCLUDED.name", (7, marker))
        rcur.start_replication(slot_name=slot, decode=True)
        payloads: list[str] = []
        deadline = time.monotonic() + 30  # decoding lags on a loaded machine
        while time.monotonic() < deadline:
            msg = rcur.read_message()
            if msg is None:
                time.sleep(0.1)
                continue
            payloads.append(msg.payload)
            msg.cursor.send_feedback(flush_lsn=msg.data_start)
            if marker in msg.payload:
                break
        assert any(marker in p for p in payloads), payloads
    finally:
        repl.close()
        # The walsender exits a moment after its connection closes: until then the slot is
        # "active" and cannot be dropped.
        for attempt in range(100):
            try:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                break
            except psycopg2.errors.ObjectInUse:
                if attempt == 99:
                    raise
                time.sleep(0.1)
        conn.close()


def test_zookeeper_round_trip(services: svc.Endpoints) -> None:
    zk = KazooClient(hosts=services.zk_hosts, timeout=5)
    zk.start(timeout=10)
    try:
        path = f"/svc_test/{uuid.uuid4().hex}"
        zk.create(path, b"hello", makepath=True)
        assert zk.get(path)[0] == b"hello"
        zk.delete(path)
    finally:
        zk.stop()
        zk.close()


def test_spark_writes_and_reads_delta(spark: object, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    path = str(tmp_path / "delta")
    spark.range(100).write.format("delta").save(path)
    assert spark.read.format("delta").load(path).count() == 100
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert history[0]["operation"] == "WRITE"


def test_taken_port_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        port = blocker.getsockname()[1]
        monkeypatch.setenv("DBLOG_ZK_PORT", str(port))
        home = tmp_path / "home"
        zk = svc.ZooKeeper(home, svc.endpoints(home))
        with pytest.raises(ServiceError, match=f"port {port} is already in use.*DBLOG_ZK_PORT"):
            zk.up()


def test_bad_port_setting_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOG_PG_PORT", "fifteen")
    with pytest.raises(ServiceError, match="DBLOG_PG_PORT='fifteen' is not a port number"):
        svc.endpoints(tmp_path)


def test_missing_package_is_a_clear_error() -> None:
    with pytest.raises(ServiceError, match="install the Debian package no-such-pkg"):
        svc._need_binary("dblog-no-such-binary", "no-such-pkg")


def test_a_killed_service_started_by_this_process_is_not_running(tmp_path: Path) -> None:
    """A service this process started and that was then killed stays a zombie until reaped;
    it must count as stopped, or `up` waits for a corpse to become healthy."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    pid_file = tmp_path / "sleep.pid"
    pid_file.write_text(str(proc.pid))
    assert svc._pid_alive(pid_file) == proc.pid  # noqa: SLF001
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert svc._pid_alive(pid_file) is None  # noqa: SLF001
