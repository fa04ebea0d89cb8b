"""Shared pieces of the latency and impact benchmarks: paced writer processes that record
every commit, percentiles, replica ids and the clean-up of a run's ZooKeeper root.

Each writer is its own process (no GIL shared with the pipeline) doing single-row autocommit
transactions on the bench table at a fixed rate: inserts of new ids and updates of existing
rows that set ``flags`` to a sequence number unique across writers. Writer ``i`` of ``n``
updates only ids ``≡ i (mod n)``, so the updates of one key commit in sequence order. Every
commit is recorded: what it wrote, the wall-clock time its COMMIT returned and how long the
statement took.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.common import COLUMNS, TABLE, row_exprs
from devtools.sample import connect, q
from devtools.services import Endpoints

INSERT, UPDATE = 1, 2


@dataclass(frozen=True)
class WriterSpec:
    """What one writer process does."""

    db: str
    tps: float
    existing: int  # updates pick ids in 1..existing
    first_new: int  # inserts take ids first_new + index, + writers, ...
    index: int = 0
    writers: int = 1
    insert_share: float = 0.2
    cpus: tuple[int, ...] | None = None  # the process pins itself here first
    seed: int = 7


@dataclass
class Commits:
    """One writer's commits, in commit order (parallel arrays)."""

    kind: array[int] = field(default_factory=lambda: array("b"))  # INSERT or UPDATE
    key: array[int] = field(default_factory=lambda: array("q"))  # the row's id
    seq: array[int] = field(default_factory=lambda: array("q"))  # flags of an update (else 0)
    committed: array[float] = field(default_factory=lambda: array("d"))  # time.time()
    latency: array[float] = field(default_factory=lambda: array("d"))  # statement seconds

    def __len__(self) -> int:
        return len(self.kind)

    def extend(self, other: Commits) -> None:
        for name in ("kind", "key", "seq", "committed", "latency"):
            getattr(self, name).extend(getattr(other, name))


def _writer_main(ep: Endpoints, spec: WriterSpec, stop: Any, ready: Any, out: Any) -> None:
    if spec.cpus is not None:
        os.sched_setaffinity(0, spec.cpus)
    rng = random.Random(spec.seed * 1000 + spec.index)
    keys = range(1 + spec.index, spec.existing + 1, spec.writers)
    insert = (f"INSERT INTO {q(TABLE)} ({COLUMNS}) SELECT {row_exprs('x')} "  # noqa: S608
              "FROM (SELECT %s AS x) s")
    update = (f"UPDATE {q(TABLE)} SET amount = amount + 1, score = score * 1.01, "  # noqa: S608
              "flags = %s, note = CONCAT('w', %s) WHERE id = %s")
    commits = Commits()
    conn = connect(ep, spec.db)
    parent = os.getppid()
    began = time.monotonic()
    n = inserted = 0
    with conn.cursor() as cur:
        while not stop.is_set() and os.getppid() == parent:  # never outlive the bench
            wait = began + n / spec.tps - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if rng.random() < spec.insert_share:
                kind, key, seq = INSERT, spec.first_new + spec.index + spec.writers * inserted, 0
                inserted += 1
                t0 = time.perf_counter()
                cur.execute(insert, (key,))
            else:
                kind, key = UPDATE, rng.choice(keys)
                seq = spec.writers * n + spec.index + 1
                t0 = time.perf_counter()
                cur.execute(update, (seq, seq, key))
            committed = time.time()
            commits.latency.append(time.perf_counter() - t0)
            commits.committed.append(committed)
            commits.kind.append(kind)
            commits.key.append(key)
            commits.seq.append(seq)
            n += 1
            if n == 1:
                ready.set()
    conn.close()
    out.send(commits)
    out.close()


class CommitWriters:
    """``len(specs)`` writer processes; :meth:`start` returns once each committed once,
    :meth:`stop` returns every commit."""

    def __init__(self, ep: Endpoints, specs: Sequence[WriterSpec]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._procs: list[tuple[Any, Any, Any]] = []
        for spec in specs:
            ready = ctx.Event()
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_writer_main, args=(ep, spec, self._stop, ready, send),
                               daemon=True, name=f"bench-writer-{spec.index}")
            self._procs.append((proc, ready, receive))
        self.seconds = 0.0

    def start(self, timeout: float = 120.0) -> CommitWriters:
        for proc, _, _ in self._procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc, ready, _ in self._procs:
            while not ready.wait(0.05):
                if not proc.is_alive() or time.monotonic() > deadline:
                    self._stop.set()
                    raise RuntimeError("a bench writer did not start")
        return self

    @property
    def pids(self) -> list[int]:
        return [int(proc.pid) for proc, _, _ in self._procs]

    def stop(self, timeout: float = 60.0) -> Commits:
        self._stop.set()
        commits = Commits()
        for proc, _, receive in self._procs:
            if not receive.poll(timeout):
                proc.kill()
                raise RuntimeError(f"bench writer {proc.name} sent no results "
                                   f"(exit code {proc.exitcode})")
            commits.extend(receive.recv())
            proc.join(timeout)
        return commits


@contextmanager
def commit_writers(ep: Endpoints, db: str, *, tps: float, writers: int, existing: int,
                   first_new: int, cpus: tuple[int, ...] | None = None,
                   out: Commits) -> Iterator[CommitWriters]:
    """``writers`` processes sharing ``tps`` for the block; their commits land in ``out``."""
    specs = [WriterSpec(db, tps / writers, existing, first_new, index=i, writers=writers,
                        cpus=cpus) for i in range(writers)]
    group = CommitWriters(ep, specs).start()
    try:
        yield group
    finally:
        out.extend(group.stop())


def achieved_tps(commits: Commits) -> float:
    """Commits per second between the first and the last commit."""
    if len(commits) < 2:
        return 0.0
    span = max(commits.committed) - min(commits.committed)
    return round((len(commits) - 1) / span, 1) if span > 0 else 0.0


def percentiles(values: Sequence[float], scale: float = 1.0, digits: int = 4
                ) -> dict[str, float | int]:
    """count, p50, p95, p99, max and mean (nearest rank) of ``values`` times ``scale``."""
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] * scale, digits)

    return {"count": len(ordered), "p50": rank(50), "p95": rank(95), "p99": rank(99),
            "max": round(ordered[-1] * scale, digits),
            "mean": round(sum(ordered) / len(ordered) * scale, digits)}


def replica_id(low: int, high: int) -> int:
    """A binlog replica id in ``[low, high]`` (the latency and impact benches use
    8100-8199)."""
    assert 8100 <= low <= high <= 8199
    return random.randint(low, high)


def drop_zookeeper_root(hosts: str, root: str) -> None:
    """Remove a run's ZooKeeper root once its source's state is deleted (if it is empty)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError, NotEmptyError

    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=10)
    try:
        zk.delete(f"/{root.strip('/')}")
    except (NoNodeError, NotEmptyError):
        pass
    finally:
        zk.stop()
        zk.close()
