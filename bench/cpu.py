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

from pipeline.paths import dblog_home

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
    """The Spark JVM this process started (a child named ``java``)."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry / "stat")
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if fields is not None and fields[1] == me and comm == "java":
            return int(entry.name)
    return None


def _mariadb_pid() -> int | None:
    try:
        return int((dblog_home() / "mariadb" / "run.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _jvm_group(thread_name: str) -> str:
    for prefix, group in _GROUPS:
        if thread_name.startswith(prefix):
            return group
    return "other"


def snapshot() -> dict[str, float]:
    """CPU seconds so far: ``python``, ``mariadb`` and ``jvm_<group>`` per thread group."""
    out: defaultdict[str, float] = defaultdict(float)
    fields = _stat_fields(Path("/proc/self/stat"))
    if fields is not None:
        out["python"] = _cpu_s(fields)
    mariadb = _mariadb_pid()
    fields = None if mariadb is None else _stat_fields(Path(f"/proc/{mariadb}/stat"))
    if fields is not None:
        out["mariadb"] = _cpu_s(fields)
    jvm = _jvm_pid()
    if jvm is not None:
        for task in Path(f"/proc/{jvm}/task").glob("*"):
            fields = _stat_fields(task / "stat")
            try:
                name = re.sub(r"\s+", " ", (task / "comm").read_text().strip())
            except OSError:
                continue
            if fields is not None:
                out[f"jvm_{_jvm_group(name)}"] += _cpu_s(fields)
    return dict(out)


@contextmanager
def cpu_seconds() -> Iterator[dict[str, float]]:
    """Yields a dict filled on exit with the CPU seconds each part spent meanwhile (and
    ``total``); threads that ended meanwhile are not counted."""
    spent: dict[str, float] = {}
    before = snapshot()
    try:
        yield spent
    finally:
        after = snapshot()
        for key in sorted(after):
            spent[key] = round(max(0.0, after[key] - before.get(key, 0.0)), 2)
        spent["total"] = round(sum(v for k, v in spent.items() if k != "total"), 2)
