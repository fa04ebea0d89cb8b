# ruff: noqa: S608 - test SQL is built from constants
"""The mirror follows the changelog: batches are committed once in the changelog, and the
mirror merges several of them at once. A tailer that dies between a batch and its merge
loses nothing: the next one merges from the mark in the mirror's history."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import parse_config
from dblog.app.runtime import open_runtime
from dblog.app.status import collect_status
from dblog.core.events import TableId
from dblog.lake.sink import DeltaSink
from dblog.lake.types import MIRROR_LSN
from devtools.sample import config_dict
from devtools.services import Endpoints
from tests.integration.helpers import execute, make_db
from tests.integration.oracle import verify_table

pytestmark = pytest.mark.integration


def merges(spark: Any, path: str) -> list[dict[str, Any]]:
    from delta.tables import DeltaTable

    return [json.loads(r["userMetadata"]) for r in DeltaTable.forPath(spark, path).history()
            .where("operation = 'MERGE'").orderBy("version").collect()]


def test_a_tailer_dying_before_its_mirror_merge_loses_nothing(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = make_db(services, prefix="mirror", ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)"])
    table = TableId(db, "t")
    raw = config_dict(source=f"mirror-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.t"],
                      lake=tmp_path / "lake", server_id=7909, batch_seconds=0.3,
                      poll_seconds=0.2)
    raw["tail"].update(mirror_every_s=3600, batch_max_events=1)  # a batch per transaction
    config = parse_config(raw)
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)  # a first position, at the head
        execute(services, db, "INSERT INTO t VALUES (1, 1)", "INSERT INTO t VALUES (2, 2)")
        rt.tailer().run(until_caught_up=True)
        assert verify_table(rt.dialect, rt.sink, table).ok
        merged_batch = mirror_batch(rt)
        assert merged_batch == position_of(rt).batch
        first_merges = len(merges(spark, rt.layout.mirror(table)))

        # Three batches in the changelog, then the process dies where it would merge them.
        real_merge = DeltaSink.merge_mirror

        def dies_with_rows_to_merge(sink: DeltaSink, *args: Any, **kwargs: Any) -> int:
            if sink.progress.unmerged(table).count():
                raise RuntimeError("killed before the mirror merge")
            return real_merge(sink, *args, **kwargs)

        monkeypatch.setattr(DeltaSink, "merge_mirror", dies_with_rows_to_merge)
        execute(services, db, "UPDATE t SET v = 10 WHERE id = 1", "DELETE FROM t WHERE id = 2",
                "INSERT INTO t VALUES (3, 3)")
        with pytest.raises(RuntimeError, match="killed before the mirror merge"):
            rt.tailer().run(until_caught_up=True)
        assert position_of(rt).batch >= merged_batch + 3  # other databases' traffic too
        assert mirror_batch(rt) == merged_batch
        assert not verify_table(rt.dialect, rt.sink, table).ok  # the mirror lags behind
        monkeypatch.setattr(DeltaSink, "merge_mirror", real_merge)

    # A new process: its sink reads the mark from the mirror's history.
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        assert verify_table(rt.dialect, rt.sink, table).ok
        found = merges(spark, rt.layout.mirror(table))
        assert len(found) == first_merges + 1  # the three batches in one MERGE
        position = position_of(rt)
        assert found[-1][MIRROR_LSN] == position.position.lsn
        assert mirror_batch(rt) == position.batch >= merged_batch + 3
        assert collect_status(rt).mirror_batch == position.batch
        changelog = spark.read.format("delta").load(rt.layout.changelog(table))
        assert changelog.count() == 5  # two inserts, the update, the delete, the insert


def position_of(rt: Any) -> Any:
    found = rt.state.get_position()
    assert found is not None
    return found.value


def mirror_batch(rt: Any) -> int:
    """The batch the mirror was last merged through (the ``mirror`` document)."""
    from dblog.tail import MIRROR_DOC

    doc = rt.state.get(MIRROR_DOC)
    assert doc is not None
    return int(doc.value["batch"])



def capture_period_config(services: Endpoints, tmp_path: Path,
                          server_id: int) -> tuple[str, TableId, Any]:
    """A database with table ``t``, and a config merging every 0.5 s, but every hour while
    a chunk window is open."""
    db = make_db(services, prefix="mirror", ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)"])
    raw = config_dict(source=f"mirror-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.t"],
                      lake=tmp_path / "lake", server_id=server_id, batch_seconds=0.3,
                      poll_seconds=0.2)
    raw["tail"].update(mirror_every_s=0.5, mirror_every_s_capturing=3600)
    return db, TableId(db, "t"), parse_config(raw)


def register_window(rt: Any, table: TableId) -> Any:
    """A chunk window of a planned capture of ``table``, registered (no watermark yet)."""
    from dblog.capture import CaptureRequest
    from dblog.core.events import Window

    capture_id = rt.capturer().plan(CaptureRequest((table,)))
    range_id = next(iter(rt.state.list_ranges(capture_id)))
    window = Window(uuid.uuid4().hex, table, low=str(uuid.uuid4()), high=str(uuid.uuid4()))
    rt.state.register_window(window, {"capture_id": capture_id, "range_id": range_id,
                                      "after_key": None})
    return window


@contextmanager
def window_registered(services: Endpoints, spark: Any, tmp_path: Path, server_id: int
                      ) -> Iterator[tuple[Any, str, TableId, Any]]:
    """A runtime on :func:`capture_period_config` after a first tailer run, with a chunk
    window of a planned capture registered: the runtime, database, table and window."""
    db, table, config = capture_period_config(services, tmp_path, server_id)
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)  # a first position, at the head
        yield rt, db, table, register_window(rt, table)


def end_captures(rt: Any) -> None:
    """Mark every capture done, as a capture's run does once its last chunk is emitted."""
    for found in rt.state.list_captures():
        rt.state.set_capture_status(found.value.capture_id, "done", found.version)


@contextmanager
def tailing(rt: Any, tailer: Any = None) -> Iterator[list[BaseException]]:
    """A tailer (``rt``'s new one unless given) running in a thread; what it raised, checked
    again when it stops."""
    stop = threading.Event()
    failures: list[BaseException] = []
    tailer = tailer or rt.tailer()

    def tail() -> None:
        try:
            tailer.run(stop=stop)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            failures.append(exc)

    thread = threading.Thread(target=tail, name="test-tailer")
    thread.start()
    try:
        yield failures
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures


def wait_until(done: Callable[[], bool], failures: list[BaseException],
               what: str = "the condition") -> None:
    deadline = time.monotonic() + 60
    while not done():
        assert not failures, failures
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def insert_a_row_into_the_changelog(services: Endpoints, spark: Any, rt: Any, db: str,
                                    table: TableId, failures: list[BaseException]) -> None:
    """Insert row 1 into ``db.t`` and wait until the running tailer has it in the changelog."""
    from delta.tables import DeltaTable

    execute(services, db, "INSERT INTO t VALUES (1, 1)")
    changelog = rt.layout.changelog(table)
    wait_until(lambda: DeltaTable.isDeltaTable(spark, changelog)
               and spark.read.format("delta").load(changelog).count() >= 1, failures)


def test_while_a_chunk_window_is_open_the_mirror_merges_at_its_capture_period(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture's chunks would be copied into the mirror beside the capture, merge after
    merge: while a window is open the mirror waits ``tail.mirror_every_s_capturing``
    (the changelog does not wait), and merges as soon as the tailer is idle with no
    window open and the capture ended."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with window_registered(services, spark, tmp_path, 7911) as (rt, db, table, window):
        merged_batch = mirror_batch(rt)
        with tailing(rt) as failures:
            insert_a_row_into_the_changelog(services, spark, rt, db, table, failures)
            time.sleep(3.0)  # six times mirror_every_s, the tailer idle meanwhile
            assert not failures, failures
            assert mirror_batch(rt) == merged_batch, "merged while the window was open"
            assert not verify_table(rt.dialect, rt.sink, table).ok

            rt.dialect.write_watermark(window.low)
            rt.dialect.write_watermark(window.high)  # no chunk described: aborted
            end_captures(rt)
            wait_until(lambda: verify_table(rt.dialect, rt.sink, table).ok, failures)
            assert mirror_batch(rt) > merged_batch
            state = rt.state.get_window(window.window_id)
            assert state is not None and state.value.status == "aborted"


def test_between_a_running_captures_chunks_the_mirror_merges_at_its_capture_period(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after a chunk window is settled, no window is open, but the capture goes on
    (it plans its next chunk, or waits for its earlier chunks' emission): the tailer,
    idle, merged the mirror then, and the MERGE ran beside the capture's next chunks
    (10 s of both cores each time in a 5M-row capture). While the capture runs the mirror
    waits its capture period; once it ended, the idle tailer merges."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with window_registered(services, spark, tmp_path, 7914) as (rt, db, table, window):
        merged_batch = mirror_batch(rt)
        tailer = rt.tailer()
        with tailing(rt, tailer) as failures:
            rt.dialect.write_watermark(window.low)
            rt.dialect.write_watermark(window.high)  # no chunk described: aborted
            wait_until(lambda: (found := rt.state.get_window(window.window_id)) is not None
                       and found.value.status == "aborted", failures, "the window settled")
            insert_a_row_into_the_changelog(services, spark, rt, db, table, failures)
            time.sleep(2.0)  # four times mirror_every_s, the tailer idle meanwhile
            assert not failures, failures
            merger = tailer._mirrors.merger  # noqa: SLF001 - the run's own merger
            assert merger is not None and merger.idle() and mirror_batch(rt) == merged_batch, (
                "merging between a running capture's chunks")
            end_captures(rt)
            wait_until(lambda: verify_table(rt.dialect, rt.sink, table).ok, failures)
            assert mirror_batch(rt) > merged_batch


def test_a_window_registered_while_the_tailer_is_busy_defers_the_mirror(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tailer reads registered windows when idle or at a low watermark; a busy tailer
    (between a chunk's emission and the next chunk's low watermark) must still count a
    window open in ZooKeeper as a capture running, rather than merge every
    ``mirror_every_s``."""
    from devtools.sample import connect, q

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db, table, config = capture_period_config(services, tmp_path, 7912)
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)  # a first position, at the head
        writing = threading.Event()

        def write() -> None:  # a transaction every 20 ms: the tailer is never idle
            conn = connect(services)
            try:
                i = 0
                while not writing.is_set():
                    i += 1
                    with conn.cursor() as cur:
                        cur.execute(f"INSERT INTO {q(db)}.t VALUES (%s, %s)", (i, i))  # noqa: S608
                    time.sleep(0.02)
            finally:
                conn.close()

        def merger_idle() -> bool:
            merger = tailer._mirrors.merger  # noqa: SLF001 - the run's own merger
            return merger is not None and merger.idle()

        writer = threading.Thread(target=write)
        writer.start()
        tailer = rt.tailer()
        try:
            with tailing(rt, tailer) as failures:
                start = mirror_batch(rt)
                wait_until(lambda: mirror_batch(rt) >= start + 2, failures)  # every 0.5 s
                window = register_window(rt, table)
                # Merges decided before the registration end (one running and one waiting
                # at most; a slow merge takes seconds), and none may start after it.
                idle = "no merge running or waiting (merging on while a window is open?)"
                wait_until(merger_idle, failures, idle)
                time.sleep(1.0)
                wait_until(merger_idle, failures, idle)
                settled = mirror_batch(rt)
                time.sleep(5.0)  # ten times mirror_every_s
                assert not failures, failures
                assert merger_idle() and mirror_batch(rt) == settled, (
                    "merged while a registered window was open")
                writing.set()
                rt.dialect.write_watermark(window.low)
                rt.dialect.write_watermark(window.high)  # no chunk described: aborted
                end_captures(rt)
                wait_until(lambda: verify_table(rt.dialect, rt.sink, table).ok, failures)
        finally:
            writing.set()
            writer.join(60)
