"""Tailer edge cases against the real services."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from pipeline.capture import CaptureRequest
from pipeline.config import parse_config
from pipeline.events import TableId
from pipeline.runtime import open_runtime
from pipeline.sample import config_dict, connect, q
from pipeline.services import Endpoints
from tests.integration.checks import changelog_frame

pytestmark = pytest.mark.integration


def test_a_repeated_high_watermark_never_reopens_an_emitted_window(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted capture writes a held chunk's high watermark again; when both land in
    one micro-batch the first emits the chunk and the second must change nothing."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"hw_{uuid.uuid4().hex[:8]}"
    conn = connect(services)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {q(db)}")
        cur.execute(f"CREATE TABLE {q(db)}.t (id INT PRIMARY KEY, v INT)")
        cur.executemany(f"INSERT INTO {q(db)}.t VALUES (%s, %s)",  # noqa: S608
                        [(i, i) for i in range(1, 41)])
    conn.close()
    config = parse_config(config_dict(
        source=f"hw-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.t"],
        lake=tmp_path / "lake", server_id=7501, chunk_size=25, batch_seconds=2.0,
        poll_seconds=0.5,
    ))
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        capturer = rt.capturer()
        capture_id = capturer.plan(CaptureRequest((table,)))
        range_id = next(iter(rt.state.list_ranges(capture_id)))
        schema = rt.dialect.table_schema(table)
        held, rows, last, _ = capturer._chunk(capture_id, range_id, table, schema, None, None,
                                              None, None, 25)
        wid = held.window_id
        window = rt.state.get_window(wid)
        assert window is not None and rows == 25 and last == (25,)
        rt.dialect.write_watermark(window.value.window.high)  # the repeated high watermark
        # the capture writes the chunk's files once the tailer pins the window
        writer = threading.Thread(target=capturer._write_held, args=(held,),
                                  kwargs={"stop": None})
        writer.start()
        rt.tailer().run(until_caught_up=True)
        writer.join(timeout=60)
        assert not writer.is_alive()
        settled = rt.state.get_window(wid)
        assert settled is not None and settled.value.status == "emitted"
        progress = rt.state.get_range(capture_id, range_id)
        assert progress is not None and progress.value.last_emitted_key == (25,)
        assert progress.value.chunks_emitted == 1 and progress.value.rows_emitted == 25
        frame = changelog_frame(spark, rt.layout.changelog(table))
        assert (frame["op"] == "r").sum() == 25
