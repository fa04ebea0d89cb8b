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


def make_table(services: Endpoints, db: str, rows: int) -> Any:
    """Database ``db`` with table ``t (id INT PRIMARY KEY, v INT)`` holding ids 1..``rows``
    (``v = id``); the open connection."""
    conn = connect(services)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {q(db)}")
        cur.execute(f"CREATE TABLE {q(db)}.t (id INT PRIMARY KEY, v INT)")
        cur.executemany(f"INSERT INTO {q(db)}.t VALUES (%s, %s)",  # noqa: S608
                        [(i, i) for i in range(1, rows + 1)])
    return conn


def test_a_repeated_high_watermark_never_reopens_an_emitted_window(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted capture writes a held chunk's high watermark again; when both land in
    one micro-batch the first emits the chunk and the second must change nothing."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"hw_{uuid.uuid4().hex[:8]}"
    make_table(services, db, 40).close()
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


class _Crash(Exception):
    """Stands for the process dying (kill -9) at the point it is raised."""


def test_a_replay_after_the_capture_settled_the_windows_the_batch_aborted_writes_it(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tailer recorded a batch that aborts a window (its capture died before describing
    the chunk) and died before writing it. Restarted, the capture's recovery runs first:
    it aborts the window and forgets it, so the replay never sees the window. The replay
    is still the recorded batch (an aborted window adds nothing) and is written, instead
    of stopping with a start-over error."""
    from pipeline.events import Window
    from pipeline.tailer import Tailer

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"settled_{uuid.uuid4().hex[:8]}"
    conn = make_table(services, db, 10)
    config = parse_config(config_dict(
        source=f"settled-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.t"],
        lake=tmp_path / "lake", server_id=7502, chunk_size=25, batch_seconds=2.0,
        poll_seconds=0.5,
    ))
    table = TableId(db, "t")
    try:
        with open_runtime(config, spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)
            capturer = rt.capturer()
            capture_id = capturer.plan(CaptureRequest((table,)))
            range_id = next(iter(rt.state.list_ranges(capture_id)))
            wid = uuid.uuid4().hex
            window = Window(wid, table, low=str(uuid.uuid4()), high=str(uuid.uuid4()))
            rt.state.register_window(window, {"capture_id": capture_id, "range_id": range_id,
                                              "after_key": None})
            rt.dialect.write_watermark(window.low)
            with conn.cursor() as cur:
                cur.execute(f"UPDATE {q(db)}.t SET v = 100 WHERE id = 3")  # noqa: S608
            rt.dialect.write_watermark(window.high)  # no chunk was described: aborted

            def die(*_: Any, **__: Any) -> Any:
                raise _Crash

            with monkeypatch.context() as m:
                m.setattr(rt.sink, "write_table_batch", die)
                with pytest.raises(_Crash):
                    rt.tailer().run(until_caught_up=True)
            intent = rt.state.get_batch_intent()
            assert intent is not None and intent.value.windows == {wid: "aborted"}
            capturer._recover(capture_id, range_id)  # the resumed capture, first
            assert rt.state.get_window(wid) is None
            replays = []
            record = Tailer._record_intent

            def noted(self: Any, *args: Any) -> Any:
                replays.append(self.state.get_batch_intent() is not None)
                return record(self, *args)

            monkeypatch.setattr(Tailer, "_record_intent", noted)
            rt.tailer().run(until_caught_up=True)
            assert replays[:1] == [True], "the recorded batch was not replayed"
            assert rt.state.get_batch_intent() is None
            frame = changelog_frame(spark, rt.layout.changelog(table))
            updated = frame[frame["op"] == "u"]
            assert len(updated) == 1
            rt.state.delete("", recursive=True)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {q(db)}")
        conn.close()
