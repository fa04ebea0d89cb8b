"""The chaos run: writers, a ``dblog capture`` and two ``dblog tail`` processes, as on three
hosts; each round kills one thing at a random moment (a tailer, the capture, ZooKeeper, the
source database: MariaDB or PostgreSQL) and starts it again. The judgement (mirror ==
source, replay == source, no duplicates, no key back in position) is the caller's; this
module only makes the chaos and keeps its record. Every process is started as under a
supervisor that restarts services and processes together (``--wait-for-services``)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dblog.state import StateUnavailable
from devtools import services as local

KINDS = ("tailer", "capture", "zookeeper", "database")


@dataclass
class Process:
    """One ``dblog`` command in a process of its own, its output in a file."""

    role: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[str] = field(init=False)

    def __post_init__(self) -> None:
        with self.log.open("a") as out:
            out.write(f"--- {' '.join(self.argv)} at {time.strftime('%H:%M:%S')}\n")
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dblog.app.cli", *self.argv], env=self.env,
                stdout=out, stderr=subprocess.STDOUT, text=True)

    @property
    def identifier(self) -> str:
        import socket

        return f"{socket.gethostname()}:{self.proc.pid}"  # runtime.identifier

    def alive(self) -> bool:
        return self.proc.poll() is None

    def last_lines(self, n: int = 3) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()[-n:]

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 90) -> int:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return int(self.proc.returncode)


@dataclass
class Chaos:
    """The processes of one chaos run and what happened to them."""

    config: Path
    database: str
    """The source's kind: ``mariadb`` or ``postgres``."""
    tables: list[str]
    workdir: Path
    env: dict[str, str]
    rng: random.Random
    lock_holder: Any
    """() -> the tailer lock holder's identifier (or None)."""
    gap_s: tuple[float, float] = (3.0, 9.0)
    tails: list[Process] = field(default_factory=list)
    capture: Process | None = None
    kills: Counter[str] = field(default_factory=Counter)
    exits: list[dict[str, Any]] = field(default_factory=list)
    captures_done: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    deck: list[str] = field(default_factory=list)
    started: int = 0

    def start(self) -> None:
        self.tails = [self._tail(), self._tail()]
        self.capture = self._process("capture", ["capture", *self.tables])

    def _process(self, role: str, argv: list[str]) -> Process:
        self.started += 1
        return Process(role, ["-c", str(self.config), "--wait-for-services", "120", *argv],
                       self.workdir / f"{self.started:03d}-{role}.log", self.env)

    def wait_tails_ready(self, timeout: float = 180) -> None:
        """Until each tailer writes or stands by (so a stop finds it past its start-up)."""
        deadline = time.monotonic() + timeout
        for tail in self.tails:
            while not ("standing by" in tail.log.read_text(errors="replace")
                       or _quietly(self.lock_holder) == tail.identifier):
                assert tail.alive(), tail.last_lines(20)
                assert time.monotonic() < deadline, f"a tailer never started: {tail.log}"
                time.sleep(0.5)

    def _tail(self) -> Process:
        return self._process("tail", ["tail"])

    def round(self, number: int) -> dict[str, Any]:
        """Wait a random while, then kill one random thing and start it again."""
        time.sleep(self.rng.uniform(*self.gap_s))
        self.reap()
        if not self.deck:  # every kind once per len(KINDS) rounds, in a random order
            self.deck = self.rng.sample(KINDS, len(KINDS))
        kind = self.deck.pop()
        began = time.monotonic()
        detail = getattr(self, f"_kill_{kind}")()
        self.kills[kind] += 1
        event = {"round": number, "kill": kind, "detail": detail,
                 "seconds": round(time.monotonic() - began, 1)}
        self.events.append(event)
        return event

    def _kill_tailer(self) -> str:
        holder = _quietly(self.lock_holder)
        active = [t for t in self.tails if t.identifier == holder]
        victim = active[0] if active and self.rng.random() < 0.7 else self.rng.choice(self.tails)
        role = "active" if victim.identifier == holder else "standby"
        victim.kill()
        self.tails[self.tails.index(victim)] = self._tail()
        return f"SIGKILL the {role} tailer"

    def _kill_capture(self) -> str:
        assert self.capture is not None
        if not self.capture.alive():
            self.reap()
            return "the capture had ended; a new one started"
        self.capture.kill()
        self.capture = self._process("capture", ["resume", self.tables[0]])
        return "SIGKILL the capture; `dblog resume`"

    def _kill_zookeeper(self) -> str:
        zk = local.ZooKeeper(local.dblog_home(), local.endpoints())
        pid = int(zk.pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        down = self.rng.uniform(0, 8)
        time.sleep(down)
        zk.up()
        return f"SIGKILL ZooKeeper, started again {down:.1f}s later"

    def _kill_database(self) -> str:
        down = self.rng.uniform(0, 4)
        if self.database == "postgres":
            pg = local.Postgres(local.dblog_home(), local.endpoints())
            # A fast shutdown (clients told, a checkpoint) or an immediate one (a crash:
            # recovery from the WAL at the next start).
            mode = self.rng.choice(["fast", "immediate"])
            pg.stop_now(mode)
            time.sleep(down)
            pg.up()
            return f"PostgreSQL stopped ({mode}), started again {down:.1f}s later"
        db = local.MariaDB(local.dblog_home(), local.endpoints())
        db.down()
        time.sleep(down)
        db.up()
        return f"MariaDB restarted (down {down:.1f}s)"

    def reap(self) -> None:
        """Record processes that ended by themselves and start what should run."""
        for i, tail in enumerate(self.tails):
            if not tail.alive():
                self.exits.append({"role": "tail", "code": tail.proc.returncode,
                                   "last": tail.last_lines()})
                self.tails[i] = self._tail()
        if self.capture is not None and not self.capture.alive():
            code = self.capture.proc.returncode
            if code == 0:
                self.captures_done += 1
                # Another capture, so that one always runs beside the tailers.
                self.capture = self._process("capture", ["capture", *self.tables])
            elif any("no unfinished capture" in line for line in self.capture.last_lines()):
                # Killed before its plan was saved: nothing to resume, so capture anew.
                self.capture = self._process("capture", ["capture", *self.tables])
            else:
                self.exits.append({"role": "capture", "code": code,
                                   "last": self.capture.last_lines()})
                self.capture = self._process("capture", ["resume", self.tables[0]])

    def finish_capture(self, timeout: float) -> None:
        """Let the capture (resumed as often as it stops with an error) run to its end."""
        deadline = time.monotonic() + timeout
        assert self.capture is not None
        while True:
            while self.capture.alive():
                assert time.monotonic() < deadline, \
                    f"the capture did not finish: {self.capture.last_lines(10)}"
                time.sleep(0.5)
            if self.capture.proc.returncode == 0:
                self.captures_done += 1
                return
            if any("no unfinished capture" in line for line in self.capture.last_lines()):
                # The last one was killed (or lost ZooKeeper) before its plan was saved:
                # nothing to resume, and the end checks need a finished capture.
                self.capture = self._process("capture", ["capture", *self.tables])
                continue
            self.exits.append({"role": "capture", "code": self.capture.proc.returncode,
                               "last": self.capture.last_lines()})
            self.capture = self._process("capture", ["resume", self.tables[0]])

    def stop_tails(self) -> list[int]:
        return [t.stop() for t in self.tails]

    def kill_all(self) -> None:
        for p in [*self.tails, *([self.capture] if self.capture else [])]:
            if p.alive():
                p.kill()

    def summary(self) -> dict[str, Any]:
        return {"rounds": len(self.events), "kills": dict(self.kills),
                "captures_done": self.captures_done, "unexpected_exits": self.exits,
                "events": self.events}

    def write(self, path: Path, **extra: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**self.summary(), **extra}, indent=2, default=str) + "\n")


def _quietly(read: Any) -> Any:
    try:
        return read()
    except StateUnavailable:
        return None
