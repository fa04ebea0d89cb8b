"""Where a bench side's CPU goes: seconds per process and per group of the JVM's threads.

Read from ``/proc`` (Linux) before and after the measured code: this Python process (the
tailer's reader, py4j), the Spark JVM it started (its task threads, the JIT compilers, the
garbage collector, the rest) and the local MariaDB server. On two cores a side's wall time
follows its CPU seconds, and the JIT's share shows what Spark compiled for it.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dblog.app.paths import dblog_home

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_GROUPS = (("C2 Compiler", "jit_c2"), ("C1 Compiler", "jit_c1"), ("GC ", "gc"),
           ("G1 ", "gc"), ("Executor task", "tasks"))


def _stat_fields(path: Path) -> list[str] | None:
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _TICK


def _jvm_pid() -> int | None:
    """The Spark JVM this process started: a child named ``java`` running Spark's
    launcher (a ZooKeeper server the bench started is a ``java`` child too)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry / "stat")
        try:
            comm = (entry / "comm").read_text().strip()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (fields is not None and fields[1] == me and comm == "java"
                and b"org.apache.spark" in command):
            return int(entry.name)
    return None


def mariadb_cpu_seconds() -> float | None:
    """The local MariaDB server's CPU seconds so far (None: its pid is not readable)."""
    try:
        pid = int((dblog_home() / "mariadb" / "run.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return process_cpu_seconds(pid)


def _jvm_group(thread_name: str) -> str:
    for prefix, group in _GROUPS:
        if thread_name.startswith(prefix):
            return group
    return "other"


def snapshot() -> dict[str, float]:
    """CPU seconds so far of ``python``, ``mariadb`` and the JVM (``jvm``, every thread it
    ever ran), and of the JVM's live threads by group (``jvm_tasks``, ``jvm_jit_c2``, ...)."""
    out: defaultdict[str, float] = defaultdict(float)
    fields = _stat_fields(Path("/proc/self/stat"))
    if fields is not None:
        out["python"] = _cpu_s(fields)
    mariadb = mariadb_cpu_seconds()
    if mariadb is not None:
        out["mariadb"] = mariadb
    jvm = _jvm_pid()
    fields = None if jvm is None else _stat_fields(Path(f"/proc/{jvm}/stat"))
    if fields is not None:
        out["jvm"] = _cpu_s(fields)
        for name, seconds in _thread_cpu(jvm):
            group = _jvm_group(re.sub(r"\s+", " ", name))
            if group != "other":
                out[f"jvm_{group}"] += seconds
    return dict(out)


def _thread_cpu(pid: int) -> Iterator[tuple[str, float]]:
    """Each live thread of ``pid``: its name (``comm``) and CPU seconds so far."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        fields = _stat_fields(task / "stat")
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        if fields is not None:
            yield name, _cpu_s(fields)


def process_cpu_seconds(pid: int) -> float | None:
    """Another process's CPU seconds so far (None: it is gone or not readable)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return None if fields is None else _cpu_s(fields)


def python_threads() -> dict[str, float]:
    """CPU seconds so far of this process's live Python threads, summed by name with
    digits replaced by ``N`` (``Thread-3 (run)`` and ``Thread-7 (run)`` together)."""
    import threading

    out: defaultdict[str, float] = defaultdict(float)
    for thread in threading.enumerate():
        fields = _stat_fields(Path(f"/proc/self/task/{thread.native_id}/stat"))
        if fields is not None:
            out[re.sub(r"\d+", "N", thread.name)] += _cpu_s(fields)
    return dict(out)


def jvm_threads() -> dict[str, float]:
    """CPU seconds so far of the Spark JVM's live threads, summed by name (``comm``, which
    Linux cuts to 15 characters) with digits replaced by ``N``."""
    out: defaultdict[str, float] = defaultdict(float)
    jvm = _jvm_pid()
    if jvm is None:
        return {}
    for name, seconds in _thread_cpu(jvm):
        out[re.sub(r"\d+", "N", name)] += seconds
    return dict(out)


def jvm_threads_since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds of each :func:`jvm_threads` group since ``before``, busiest first."""
    after = jvm_threads()
    spent = {k: round(max(0.0, v - before.get(k, 0.0)), 2) for k, v in after.items()}
    return dict(sorted(((k, v) for k, v in spent.items() if v > 0), key=lambda kv: -kv[1]))


def threads_since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds of each :func:`python_threads` group since ``before``, busiest first;
    a thread that ended meanwhile is not counted (its time stays in ``python``)."""
    after = python_threads()
    spent = {k: round(max(0.0, v - before.get(k, 0.0)), 2) for k, v in after.items()}
    return dict(sorted(((k, v) for k, v in spent.items() if v > 0), key=lambda kv: -kv[1]))


def spent_since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds spent since ``before`` (a :func:`snapshot`), as :func:`cpu_seconds`
    reports them."""
    after = snapshot()
    delta = {k: max(0.0, after[k] - before.get(k, 0.0)) for k in after}
    groups = {k: v for k, v in delta.items() if k.startswith("jvm_")}
    if "jvm" in delta:
        groups["jvm_other"] = max(0.0, delta["jvm"] - sum(groups.values()))
    spent = {key: round(value, 2) for key, value in sorted({**delta, **groups}.items())}
    spent["total"] = round(sum(delta.get(k, 0.0) for k in ("python", "mariadb", "jvm")), 2)
    return spent


@contextmanager
def cpu_seconds() -> Iterator[dict[str, float]]:
    """Yields a dict filled on exit with the CPU seconds each part spent meanwhile:
    ``python``, ``mariadb``, ``jvm`` and its groups (``jvm_other``: the rest of the JVM,
    threads that ended meanwhile included), and ``total``."""
    spent: dict[str, float] = {}
    before = snapshot()
    try:
        yield spent
    finally:
        spent.update(spent_since(before))
