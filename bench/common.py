"""Shared pieces of the capture and tail benchmarks: the bench table (~150 bytes/row, several
column types) generated on the server, a paced writer process, the pipeline configuration of a
fresh run, machine facts and the JSON result file."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import multiprocessing
import os
import platform
import random
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dblog.app.config import PipelineConfig, parse_config
from dblog.app.paths import dblog_home
from devtools.sample import config_dict, connect, q
from devtools.services import Endpoints

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TABLE = "items"

DDL = """CREATE TABLE {db}.{table} (
  id BIGINT NOT NULL PRIMARY KEY,
  account INT NOT NULL,
  name VARCHAR(64) NOT NULL,
  amount DECIMAL(12,2) NOT NULL,
  score DOUBLE,
  created DATETIME(6) NOT NULL,
  day DATE,
  status ENUM('new','paid','shipped') NOT NULL,
  flags BIGINT UNSIGNED,
  note VARCHAR(96)
) ENGINE=InnoDB"""
COLUMNS = "id, account, name, amount, score, created, day, status, flags, note"


def row_exprs(x: str) -> str:
    """The SELECT list of one generated row whose id is the SQL expression ``x``."""
    return (
        f"{x}, MOD({x}, 100000), CONCAT('customer-', {x}, '-', SUBSTRING(MD5({x}), 1, 12)), "
        f"MOD({x}, 1000000) / 100, {x} * 0.37, "
        f"TIMESTAMP '2020-01-01 00:00:00' + INTERVAL {x} SECOND, "
        f"DATE '2020-01-01' + INTERVAL MOD({x}, 3650) DAY, ELT(1 + MOD({x}, 3), 'new', 'paid', "
        f"'shipped'), IF(MOD({x}, 10) = 0, NULL, {x} * 2654435761), "
        f"IF(MOD({x}, 7) = 0, NULL, CONCAT(MD5({x}), ' ', REPEAT('x', MOD({x}, 20))))"
    )


def create_database(ep: Endpoints, db: str) -> None:
    """A fresh database with the bench table and ``k`` (0..999), the row generator's helper."""
    conn = connect(ep)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {q(db)}")
        cur.execute(f"CREATE DATABASE {q(db)}")
        cur.execute(DDL.format(db=q(db), table=q(TABLE)))
        cur.execute(f"CREATE TABLE {q(db)}.k (n INT NOT NULL PRIMARY KEY) ENGINE=InnoDB")
        cur.execute(f"INSERT INTO {q(db)}.k VALUES "  # noqa: S608 - integers only
                    + ", ".join(f"({n})" for n in range(1000)))
    conn.close()


def fill(ep: Endpoints, db: str, rows: int, *, first: int = 1, step: int = 100_000) -> float:
    """Insert ids ``first .. first + rows - 1`` server-side (INSERT ... SELECT from ``k``
    joined with itself, ``step`` rows a statement); returns the seconds it took."""
    began = time.perf_counter()
    conn = connect(ep, db)
    with conn.cursor() as cur:
        for start in range(0, rows, step):
            cur.execute(
                f"INSERT INTO {q(TABLE)} ({COLUMNS}) SELECT {row_exprs('x')} FROM "  # noqa: S608
                f"(SELECT {first + start} + a.n * 1000 + b.n AS x FROM k a JOIN k b "
                f"WHERE a.n < {step // 1000}) s WHERE x < {first + min(start + step, rows)}"
            )
    conn.close()
    return time.perf_counter() - began


def table_facts(ep: Endpoints, db: str) -> dict[str, Any]:
    """Row count and InnoDB's size per row (after ANALYZE TABLE)."""
    conn = connect(ep, db)
    with conn.cursor() as cur:
        cur.execute(f"ANALYZE TABLE {q(TABLE)}")
        cur.fetchall()
        cur.execute(f"SELECT COUNT(*) FROM {q(TABLE)}")  # noqa: S608
        count = int(cur.fetchone()[0])
        cur.execute("SELECT data_length, avg_row_length FROM information_schema.tables "
                    "WHERE table_schema = %s AND table_name = %s", (db, TABLE))
        data_length, avg = cur.fetchone()
    conn.close()
    return {"rows": count, "data_bytes": int(data_length), "avg_row_bytes": int(avg)}


def drop_database(ep: Endpoints, db: str) -> None:
    conn = connect(ep)
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {q(db)}")
    conn.close()


# ---- a paced writer in its own process (no GIL shared with the pipeline) ------------------


def _writer_statements(kind: str, db: str) -> tuple[str, str]:
    """The writer's INSERT (one parameter: the id) and UPDATE (note, id) on ``db``'s items
    table: a MariaDB database, or a PostgreSQL schema (``kind`` ``postgres``)."""
    if kind == "postgres":
        from bench.bench_pg_tail import row_exprs as pg_row_exprs

        table = '"' + db.replace('"', '""') + '".items'
        row = pg_row_exprs("v.x").replace("%", "%%")  # its modulo, not a parameter
        return (f"INSERT INTO {table} SELECT {row} FROM (SELECT %s::bigint AS x) v",  # noqa: S608
                f"UPDATE {table} SET amount = amount + 1, score = score * 1.01, "  # noqa: S608
                "status = (ARRAY['paid', 'shipped', 'new'])[1 + id %% 3], note = %s "
                "WHERE id = %s")
    return (f"INSERT INTO {q(TABLE)} ({COLUMNS}) SELECT {row_exprs('x')} "  # noqa: S608
            "FROM (SELECT %s AS x) s",
            f"UPDATE {q(TABLE)} SET amount = amount + 1, score = score * 1.01, "  # noqa: S608
            "status = ELT(1 + MOD(id, 3), 'paid', 'shipped', 'new'), note = %s WHERE id = %s")


def _writer_main(ep: Endpoints, db: str, tps: float, existing: int, first_new: int,
                 seed: int, stop: Any, done: Any, kind: str = "mariadb") -> None:
    rng = random.Random(seed)
    if kind == "postgres":
        from bench.bench_pg_tail import connect as pg_connect

        conn = pg_connect(ep)
    else:
        conn = connect(ep, db)
    insert, update = _writer_statements(kind, db)
    began = time.monotonic()
    n = 0
    next_id = first_new
    with conn.cursor() as cur:
        while not stop.is_set():
            due = began + n / tps
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if rng.random() < 0.2:
                cur.execute(insert, (next_id,))
                next_id += 1
            else:
                cur.execute(update, (f"w{n}", rng.randint(1, existing)))
            n += 1
            with done.get_lock():
                done.value = n
    conn.close()


@dataclass
class PacedWriter:
    """Single-row autocommit writes (80% updates of existing rows, 20% inserts of new ids) at
    ``tps`` transactions/s in a child process, to the items table of MariaDB database ``db``
    or (``kind`` ``postgres``) of PostgreSQL schema ``db``."""

    ep: Endpoints
    db: str
    tps: float
    existing: int
    first_new: int
    seed: int = 7
    kind: str = "mariadb"

    def __post_init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._done = ctx.Value("q", 0)
        self._proc = ctx.Process(
            target=_writer_main, daemon=True,
            args=(self.ep, self.db, self.tps, self.existing, self.first_new, self.seed,
                  self._stop, self._done, self.kind),
        )
        self._began = 0.0
        self._first = 0
        self.seconds = 0.0

    def start(self, timeout: float = 120.0) -> PacedWriter:
        """Start the writer and return once it committed its first transaction."""
        self._proc.start()
        deadline = time.monotonic() + timeout
        while int(self._done.value) == 0:
            if not self._proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the paced writer did not start")
            time.sleep(0.01)
        self._began = time.monotonic()
        self._first = int(self._done.value)
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._proc.join(30)
        self.seconds = time.monotonic() - self._began
        if self._proc.exitcode != 0:
            raise RuntimeError(f"the paced writer exited with {self._proc.exitcode}")
        total = int(self._done.value)
        done = total - self._first  # while the measured block ran
        return {"target_tps": self.tps, "transactions": total,
                "achieved_tps": round(done / self.seconds, 1) if self.seconds else 0.0}


@contextmanager
def paced_writer(ep: Endpoints, db: str, tps: float, existing: int, first_new: int,
                 stats: dict[str, float], kind: str = "mariadb") -> Iterator[None]:
    """Run a :class:`PacedWriter` for the block (nothing when ``tps`` is 0); fills ``stats``."""
    if tps <= 0:
        yield
        return
    writer = PacedWriter(ep, db, tps, existing, first_new, kind=kind).start()
    try:
        yield
    finally:
        stats.update(writer.stop())


# ---- a fresh pipeline per run -------------------------------------------------------------


def run_id() -> str:
    return uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class GeneratedTable:
    """A bench's fresh database ``db`` (of run ``run``) holding the bench table."""

    run: str
    db: str
    facts: dict[str, Any]
    fill_seconds: float


def generate_table(ep: Endpoints, bench: str, rows: int) -> GeneratedTable:
    """A fresh database ``bench_<bench>_<run id>`` with ``rows`` rows of the bench table."""
    rid = run_id()
    db = f"bench_{bench}_{rid}"
    print(f"{bench} bench {rid}: generating {rows:,} rows in {db}.{TABLE}", flush=True)
    create_database(ep, db)
    fill_seconds = fill(ep, db, rows)
    return GeneratedTable(rid, db, table_facts(ep, db), fill_seconds)


def pipeline_config(ep: Endpoints, *, name: str, tables: Sequence[str], lake: Path,
                    server_id: int, chunk_size: int | None = None, max_in_flight: int = 4,
                    batch_seconds: float = 2.0, poll_seconds: float = 0.5,
                    read_partitions: int | None = None,
                    max_rows_per_s: float | None = None,
                    settings: Mapping[str, Mapping[str, Any]] | None = None) -> PipelineConfig:
    """The product's default capture/tail settings, with a source name and ZooKeeper root of
    this run only (nothing an earlier run left behind is seen); ``read_partitions``
    overrides the capture's parallel reads of a chunk, ``max_rows_per_s`` sets its read-rate
    limit; ``settings`` sets any others, as the YAML's sections would (``{"tail":
    {"pin_ahead_s": 0}}``; a None value keeps the default)."""
    os.environ.setdefault("DBLOG_MARIADB_PASSWORD", ep.mariadb_password)
    data = config_dict(source=name, ep=ep, tables=list(tables), lake=lake, server_id=server_id,
                       chunk_size=chunk_size or 1, max_in_flight=max_in_flight,
                       batch_seconds=batch_seconds, poll_seconds=poll_seconds)
    if chunk_size is None:  # the product's chunk sizing
        del data["capture"]["chunk_size"], data["capture"]["chunk_max_rows"]
    data["zookeeper"]["root"] = f"dblog-bench-{name}"
    if read_partitions is not None:
        data["capture"]["read_partitions"] = read_partitions
    if max_rows_per_s is not None:
        data["capture"]["max_rows_per_s"] = max_rows_per_s
    for section, values in (settings or {}).items():
        data.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    return parse_config(data)


def lake_dir(name: str) -> Path:
    path = dblog_home() / "bench" / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def remove_lake(name: str) -> None:
    shutil.rmtree(dblog_home() / "bench" / name, ignore_errors=True)


def server_id(low: int, high: int) -> int:
    """A binlog replica id in ``[low, high]`` (this project's benches use 7950-7999)."""
    assert 7950 <= low <= high <= 7999
    return random.randint(low, high)


_ABSENT = object()


class Profile:
    """Wall-clock seconds spent in chosen methods of live objects (a coarse profile across
    threads: the capture loop's phases and the tailer's Delta writes)."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float, str, str]] = []
        """Every timed call as it ended: start and end (seconds since the profile began),
        thread, label."""
        self._began = time.perf_counter()
        self._wrapped: list[tuple[Any, str, Any]] = []

    def wrap(self, obj: Any, name: str, label: str | None = None) -> None:
        """Time ``obj.name``: a method of an instance, or a module's function."""
        fn = getattr(obj, name)
        own = vars(obj).get(name, _ABSENT)  # a module's function, or an instance attribute
        self._wrapped.append((obj, name, own))
        key = label or name

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.steps.append((began - self._began, time.perf_counter() - self._began,
                                   threading.current_thread().name, key))

        setattr(obj, name, timed)

    def unwrap(self) -> None:
        """Take the timing wrappers off again (what was there before shows through)."""
        for obj, name, own in reversed(self._wrapped):
            if own is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._wrapped.clear()

    def timeline(self) -> list[dict[str, Any]]:
        """The timed calls in the order they began: where each thread was when."""
        return [{"start_s": round(b, 3), "end_s": round(e, 3), "thread": t, "step": k}
                for b, e, t, k in sorted(self.steps)]

    def summary(self) -> dict[str, dict[str, float]]:
        """Calls, seconds and mean seconds per timed method."""
        calls: dict[str, list[float]] = {}
        for began, ended, _, key in self.steps:
            calls.setdefault(key, []).append(ended - began)
        return {k: {"calls": len(v), "seconds": round(sum(v), 2),
                    "mean_s": round(sum(v) / len(v), 3)} for k, v in calls.items()}


# ---- machine facts and results ------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _memory_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def busy_processes(limit: int = 5) -> list[str]:
    """The processes with the most CPU (ps: %cpu over each one's lifetime, RSS KiB) besides
    this one: what else ran on the machine."""
    import subprocess

    try:
        out = subprocess.run(["ps", "-eo", "pid,pcpu,rss,args", "--sort=-pcpu", "--no-headers"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    lines = [line.split(None, 1) for line in out.splitlines() if line.strip()]
    return [" ".join(rest.split())[:120] for pid, rest in lines
            if pid != str(os.getpid()) and "ps -eo" not in rest][:limit]


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "busy_processes": busy_processes(),
    }


def versions() -> dict[str, str]:
    return {
        "python": sys.version.split()[0],
        "pyspark": _version("pyspark"),
        "delta-spark": _version("delta-spark"),
        "mysql-replication": _version("mysql-replication"),
    }


def mariadb_version(ep: Endpoints) -> str:
    conn = connect(ep)
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
    conn.close()
    return version


def write_results(path: Path, name: str, parameters: dict[str, Any], results: Any,
                  extra: dict[str, Any] | None = None) -> Path:
    doc = {
        "name": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "parameters": parameters,
        "results": results,
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if n else c.ljust(w) for c, w in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def record_batches(batches: list[tuple[int, float]]) -> Callable[[Any], None]:
    """A tailer ``on_batch`` callback keeping (events, seconds) of every written batch
    (mirror merges are reported too, and left out here)."""

    def record(report: Any) -> None:
        if not report.mirror_only:
            batches.append((report.events, report.seconds))

    return record


def with_ratios(row: dict[str, Any]) -> dict[str, Any]:
    """A capture bench row with dblog's rows/s over the baseline's, into the changelog
    (``ratio``) and until the mirror has it too (``ratio_with_mirror``)."""
    base = row["baseline"]["rows_per_s"]
    row["ratio"] = row["dblog"]["rows_per_s"] / base
    row["ratio_with_mirror"] = row["dblog"]["mirror_rows_per_s"] / base
    return row


def zookeeper_requests(ep: Any) -> int | None:
    """The requests the local ZooKeeper received so far (see
    :meth:`devtools.services.ZooKeeper.requests_received`)."""
    from devtools.services import ZooKeeper

    return ZooKeeper(dblog_home(), ep).requests_received()
