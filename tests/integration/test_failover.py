"""Active-passive tailers, as on two hosts: ``dblog tail`` twice for one source, one writes
and one stands by. A SIGKILLed active hands over within its ZooKeeper session timeout (plus
start-up); a frozen (SIGSTOP) active that wakes up after the standby took over writes
nothing more and stands by behind it. The changelog then holds every change once, in
position order, and the mirror and an independent replay equal the source. Slow."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.services import Endpoints
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table
from tests.integration.sources import MariaDbKit

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# Slow (``make test-slow``): three tailer processes, each starting Spark, about 65 s. In
# ``make test``, test_zookeeper_ensemble.py runs the same standing by and taking over again
# after a session interruption.

SESSION_TIMEOUT_S = 4.0  # ZooKeeper's smallest here (2 ticks of 2 s)


class Tail:
    """``dblog tail`` in a process of its own (output in a file)."""

    def __init__(self, config: Path, password: str, log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dblog.app.cli", "-c", str(config), "tail"],
                env={**os.environ, "DBLOG_MARIADB_PASSWORD": password},
                stdout=out, stderr=subprocess.STDOUT, text=True)
        self.identifier = f"{socket.gethostname()}:{self.proc.pid}"  # runtime.identifier

    def output(self) -> str:
        return self.log.read_text()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def wait_for(what: str, done: Any, timeout: float, *tails: Tail) -> float:
    """Poll ``done()`` until true; the seconds it took."""
    began = time.monotonic()
    while not done():
        for tail in tails:
            assert tail.proc.poll() is None, f"{what}: tail exited\n{tail.output()[-3000:]}"
        assert time.monotonic() - began < timeout, f"not {what} within {timeout:.0f}s"
        time.sleep(0.1)
    return time.monotonic() - began


class Writer(threading.Thread):
    """Single-row inserts with increasing ids, about 50 a second, until stopped."""

    def __init__(self, kit: MariaDbKit, db: str) -> None:
        super().__init__(daemon=True)
        self.kit, self.db, self.written = kit, db, 0
        self.halt = threading.Event()

    def run(self) -> None:
        conn = self.kit.connect()
        with conn.cursor() as cur:
            while not self.halt.is_set():
                self.written += 1
                cur.execute(f"INSERT INTO {self.kit.qualified(self.db, 't')} "  # noqa: S608
                            "VALUES (%s, %s)", (self.written, f"v{self.written}"))
                time.sleep(0.02)
        conn.close()


def changelog_commits(spark: Any, path: str) -> list[tuple[str, float]]:
    """(writing tailer, commit time) of each changelog commit that carries one."""
    out = []
    for row in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect():
        meta = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
        if "dblog.tailer" in meta:
            out.append((meta["dblog.tailer"], row["timestamp"].timestamp()))
    return out


def test_a_standby_takes_over_and_a_frozen_active_writes_nothing_more(
        services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = MariaDbKit(services)
    monkeypatch.setenv(kit.password_env, kit.password)
    db = kit.simple_table("failover", 0)
    tails: list[Tail] = []
    with kit.cleaned(db, "failover") as source:
        path = kit.config(tmp_path / "c.yaml", source=source, db=db, lake=tmp_path / "lake",
                          tables=[f"{db}.t"], batch_seconds=0.3)
        data = yaml.safe_load(path.read_text())
        data["zookeeper"]["session_timeout_s"] = SESSION_TIMEOUT_S
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)
        table = TableId(db, "t")
        writer = Writer(kit, db)
        try:
            with open_runtime(config, spark=spark, validate=False) as rt:
                def holder() -> str | None:
                    return rt.state.lock_holder()

                def batch() -> int:
                    pos = rt.state.get_position()
                    return -1 if pos is None else pos.value.batch

                first = Tail(path, kit.password, tmp_path / "first.log")
                tails.append(first)
                wait_for("the first tail holding the lock",
                         lambda: holder() == first.identifier, 120, first)
                # Two standbys start together (their Spark start-ups overlap); whichever
                # queued first for the lock takes over first.
                standbys = [Tail(path, kit.password, tmp_path / f"standby{i}.log")
                            for i in (1, 2)]
                tails.extend(standbys)
                for tail in standbys:
                    wait_for("a tail standing by", lambda t=tail: "standing by" in t.output(),
                             120, tail)
                writer.start()
                start = batch()
                wait_for("the first tail writing", lambda: batch() >= start + 3, 60, first)

                # 1. SIGKILL: the standby takes over once ZooKeeper ends the dead session.
                first.signal(signal.SIGKILL)
                killed = time.monotonic()
                handover = wait_for("a standby holding the lock",
                                    lambda: holder() in {t.identifier for t in standbys},
                                    60, *standbys)
                (second,) = [t for t in standbys if t.identifier == holder()]
                (third,) = [t for t in standbys if t is not second]
                at = batch()
                writing = wait_for("the standby writing", lambda: batch() > at, 60, second)
                print(f"\nhandover after SIGKILL: lock in {handover:.1f}s, first batch "
                      f"written {time.monotonic() - killed:.1f}s after the kill "
                      f"(session timeout {SESSION_TIMEOUT_S:g}s; {writing:.1f}s to write)")
                assert time.monotonic() - killed <= SESSION_TIMEOUT_S + 10

                # 2. SIGSTOP past the session timeout: the other standby takes over; the
                # frozen one, woken up, must write nothing more.
                second.signal(signal.SIGSTOP)
                wait_for("the third tail holding the lock",
                         lambda: holder() == third.identifier, 60, third)
                at = batch()
                wait_for("the third tail writing", lambda: batch() >= at + 2, 60, third)
                second.signal(signal.SIGCONT)
                woken = time.time()
                # It stops writing and stands by behind the new active one.
                wait_for("the woken tail standing by again",
                         lambda: "standing by again" in second.output(), 60, third, second)
                assert "this one stops writing" in second.output(), second.output()[-3000:]
                at = batch()
                wait_for("the third tail writing on", lambda: batch() >= at + 2, 60, third)

                writer.halt.set()
                writer.join(10)
                rt.wait_caught_up(lambda: None, timeout=120)
                for tail in (second, third):
                    tail.stop()
                    assert tail.proc.returncode == 0, tail.output()[-3000:]
                assert "stopped while standing by" in second.output()

                late = [t for who, t in changelog_commits(spark, rt.layout.changelog(table))
                        if who == second.identifier and t > woken]
                assert not late, f"the fenced tail committed {len(late)} times after waking"
                report = verify_table(rt.dialect, rt.sink, table)
                assert report.ok, report.summary()
                frame = check_table(spark, services, db, "t", ("id",),
                                    rt.layout.changelog(table),
                                    expected_rows=kit.rows(db, "t", ("id",)))
                assert len(frame) >= writer.written
                rt.state.delete("", recursive=True)
        finally:
            writer.halt.set()
            for tail in tails:
                tail.stop()
