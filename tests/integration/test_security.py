"""Credentials never leave the environment: after a capture (with its in-process tailer) run
by the CLI with debug logging, the source's password is in none of its output, the process
list while it ran, the Delta commit history, ZooKeeper, or the local services' logs. Part of
the contract suite: it runs for every source database."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import load_config
from dblog.app.paths import dblog_home
from dblog.app.runtime import open_runtime
from tests.integration.sources import SourceKit

pytestmark = pytest.mark.integration


def process_list() -> str:
    """Every process's full command line."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace"))
            except OSError:
                continue  # ended meanwhile
    return "\n".join(out)


def zookeeper_dump(zk: Any, path: str) -> str:
    """Every znode's path and data below ``path``."""
    data, _ = zk.get(path)
    parts = [path, data.decode(errors="replace") if data else ""]
    for child in zk.get_children(path):
        parts.append(zookeeper_dump(zk, f"{path.rstrip('/')}/{child}"))
    return "\n".join(parts)


def test_the_password_appears_in_no_output_process_list_history_or_state(
        source_kit: SourceKit, spark: Any, tmp_path: Path) -> None:
    password = source_kit.password
    assert len(password) >= 12  # a distinctive generated secret, never a substring by chance
    db = source_kit.create("secret", accounts=80, orders=60, seed=3)
    with source_kit.cleaned(db, "secret") as source:
        cfg = source_kit.config(tmp_path / "c.yaml", source=source, db=db,
                                lake=tmp_path / "lake", chunk_size=40, batch_seconds=0.3)
        assert password not in cfg.read_text()
        seen: list[str] = []
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.2):
                seen.append(process_list())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "dblog.app.cli", "-c", str(cfg), "-v", "capture"],
                env={**os.environ, source_kit.password_env: password},
                capture_output=True, text=True, timeout=600, check=False)
        finally:
            done.set()
            watcher.join(5)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "DEBUG" in proc.stderr or "INFO" in proc.stderr  # the verbose log was on
        assert len(seen) > 10
        leaks = {
            "stdout": proc.stdout, "stderr": proc.stderr,
            "process list": "\n".join(seen),
        }
        with open_runtime(load_config(cfg), spark=spark, validate=False) as rt:
            for table in rt.config.table_ids:
                for path in (rt.layout.changelog(table), rt.layout.mirror(table)):
                    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
                    assert history
                    leaks[f"Delta history of {path}"] = "\n".join(str(r.asDict())
                                                                 for r in history)
            zk = rt.state._zk  # noqa: SLF001 - read every znode as an operator could
            leaks["ZooKeeper"] = zookeeper_dump(zk, "/")
            rt.state.delete("", recursive=True)
        for log in (dblog_home() / "logs").glob("*.log"):
            leaks[str(log)] = log.read_text(errors="replace")
        # What was searched holds what it should (the search is not looking at nothing).
        assert "dblog.app.cli" in leaks["process list"] and source in leaks["ZooKeeper"]
        assert any("dblog.batch" in text for where, text in leaks.items()
                   if where.startswith("Delta history"))
        found = [where for where, text in leaks.items() if password in text]
        assert not found, f"the source password appears in: {found}"
