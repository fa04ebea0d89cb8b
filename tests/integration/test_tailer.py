"""Tailer edge cases against the real services."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import parse_config
from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from devtools.sample import config_dict, connect, q
from devtools.services import Endpoints
from tests.integration.checks import changelog_frame
from tests.integration.helpers import wait_for

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


def one_table_config(services: Endpoints, tmp_path: Path, db: str, server_id: int, *,
                     chunk_size: int = 25, poll_seconds: float = 0.5) -> Any:
    """A configuration over ``db.t`` (2 s batches), with a source named after ``db``."""
    return parse_config(config_dict(
        source=f"{db.replace('_', '-')}-src", ep=services, tables=[f"{db}.t"],
        lake=tmp_path / "lake", server_id=server_id, chunk_size=chunk_size, batch_seconds=2.0,
        poll_seconds=poll_seconds,
    ))


def plan_capture(rt: Any, table: TableId) -> tuple[Any, str, str]:
    """After a tailer run to the log's head, a capture of ``table`` planned: the capturer,
    the capture id and its one range's id."""
    rt.tailer().run(until_caught_up=True)
    capturer = rt.capturer()
    capture_id = capturer.plan(CaptureRequest((table,)))
    return capturer, capture_id, next(iter(rt.state.list_ranges(capture_id)))


def test_a_repeated_high_watermark_never_reopens_an_emitted_window(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted capture writes a held chunk's high watermark again; when both land in
    one micro-batch the first emits the chunk and the second must change nothing."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"hw_{uuid.uuid4().hex[:8]}"
    make_table(services, db, 40).close()
    config = one_table_config(services, tmp_path, db, 7501)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        capturer, capture_id, range_id = plan_capture(rt, table)
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
    from dblog.core.events import Window
    from dblog.tail.commit import Committer

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"settled_{uuid.uuid4().hex[:8]}"
    conn = make_table(services, db, 10)
    config = one_table_config(services, tmp_path, db, 7502)
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
            record = Committer._record_intent

            def noted(self: Any, *args: Any) -> Any:
                replays.append(self.state.get_batch_intent() is not None)
                return record(self, *args)

            monkeypatch.setattr(Committer, "_record_intent", noted)
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


def plan_bounded_capture(rt: Any, table: TableId) -> tuple[Any, str, str, Any, Any]:
    """:func:`plan_capture` with the one range's upper bound fixed: the capturer, the
    capture and range ids, the upper bound and the table's schema."""
    capturer, capture_id, range_id = plan_capture(rt, table)
    fixed = capturer._fix_upper(capture_id, range_id, threading.Event())
    assert fixed is not None
    return capturer, capture_id, range_id, fixed[0].upper, rt.dialect.table_schema(table)


def assert_both_chunks_emitted_once(rt: Any, spark: Any, table: TableId, capture_id: str,
                                    range_id: str) -> Any:
    """The range's two 20-row chunks emitted: its progress, and each of the 40 rows read
    into the changelog once; the changelog as a pandas frame."""
    progress = rt.state.get_range(capture_id, range_id)
    assert progress is not None and progress.value.last_emitted_key == (40,)
    assert progress.value.chunks_emitted == 2 and progress.value.rows_emitted == 40
    frame = changelog_frame(spark, rt.layout.changelog(table))
    reads = frame[frame["op"] == "r"]
    assert sorted(r["id"] for r in reads["after"]) == list(range(1, 41))
    return frame


@contextmanager
def _two_chunks(services: Endpoints, spark: Any, tmp_path: Path, prefix: str,
                server_id: int) -> Iterator[tuple[Any, TableId, str, str, Any, Any]]:
    """A runtime over a new 40-row table, after a tailer run; a capture of the table
    planned, its range's upper bound fixed, and its first two 20-row chunks selected (each
    up to its high watermark): the runtime, table, capture id, range id and held chunks."""
    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    make_table(services, db, 40).close()
    config = one_table_config(services, tmp_path, db, server_id, chunk_size=20,
                              poll_seconds=0.2)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        capturer, capture_id, range_id, upper, schema = plan_bounded_capture(rt, table)
        first, rows, last, _ = capturer._chunk(capture_id, range_id, table, schema, None,
                                               upper, None, None, 20)
        assert rows == 20 and last == (20,)
        second, rows, last, _ = capturer._chunk(capture_id, range_id, table, schema, last,
                                                upper, None, None, 20)
        assert rows == 20 and last == (40,)
        yield rt, table, capture_id, range_id, first, second


def test_the_tailer_pins_the_next_chunk_before_the_chunk_before_it_is_written(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two chunks' high watermarks in the log: the tailer pins both before it waits for
    either chunk's files (so the capture writes them at once), and emits both in order.
    Here the first chunk's files are written only once the second is pinned: a tailer
    that waited for each chunk's files before reading on would time out on the first."""
    from dataclasses import replace

    from dblog.state import handoff

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _two_chunks(services, spark, tmp_path, "pins", 7503) as (
        rt, table, capture_id, range_id, first, second
    ):
        capturer = rt.capturer()
        order: list[str] = []

        def write_first_once_second_is_pinned() -> None:
            deadline = time.monotonic() + 40
            while handoff.read_pin(rt.state, second.window_id) is None:
                if time.monotonic() > deadline:
                    handoff.release(rt.state, first.window_id)  # gives up: rows lost
                    return
                time.sleep(0.05)
            order.append("second pinned")
            capturer._write_held(first, stop=None)

        writers = [
            threading.Thread(target=write_first_once_second_is_pinned),
            threading.Thread(target=capturer._write_held, args=(second,), kwargs={"stop": None}),
        ]
        for w in writers:
            w.start()
        tailer = rt.tailer()
        tailer.options = replace(tailer.options, chunk_files_timeout_s=20.0)
        tailer.run(until_caught_up=True)
        for w in writers:
            w.join(timeout=60)
            assert not w.is_alive()
        assert order == ["second pinned"]
        for held in (first, second):
            settled = rt.state.get_window(held.window_id)
            assert settled is not None and settled.value.status == "emitted", settled
        assert_both_chunks_emitted_once(rt, spark, table, capture_id, range_id)


def zookeeper_requests(services: Endpoints) -> int:
    """The requests the local ZooKeeper received so far."""
    from dblog.app.paths import dblog_home
    from devtools.services import ZooKeeper

    received = ZooKeeper(dblog_home(), services).requests_received()
    assert received is not None, "ZooKeeper did not answer srvr"
    return received


def test_a_batch_waiting_for_chunk_files_reads_zookeeper_when_they_are_published(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the tailer's batch waits for its pinned chunks' files it does not poll
    ZooKeeper (it polled three znodes every 20 ms: ~450 requests in these 3 s); their
    publication wakes it through its watches, and the batch is written at once, although
    its fallback look is a minute away here."""
    from dblog.state import handoff
    from dblog.tail import emissions

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    monkeypatch.setattr(emissions, "FILES_LOOK_S", 60.0)
    with _two_chunks(services, spark, tmp_path, "watch", 7510) as (
        rt, table, capture_id, range_id, first, second
    ):
        published: list[float] = []
        publish = handoff.write_files

        def publish_and_note(state: Any, files: Any) -> None:
            publish(state, files)
            published.append(time.monotonic())

        monkeypatch.setattr(handoff, "write_files", publish_and_note)
        written: list[float] = []
        tailer = rt.tailer(on_batch=lambda report: written.append(time.monotonic()))
        runner = threading.Thread(target=tailer.run, kwargs={"until_caught_up": True})
        runner.start()
        try:
            wait_for("both chunks pinned",
                     lambda: handoff.read_pin(rt.state, second.window_id) is not None)
            before = zookeeper_requests(services)
            time.sleep(3)
            requests = zookeeper_requests(services) - before
            capturer = rt.capturer()
            for held in (first, second):
                capturer._write_held(held, stop=None)
        finally:
            runner.join(timeout=90)
        assert not runner.is_alive()
        assert requests < 40, f"{requests} ZooKeeper requests while the batch waited"
        assert len(published) == 2 and written, (published, written)
        emitted_after = min(t for t in written if t > published[-1]) - published[-1]
        assert emitted_after < 5.0, f"the batch was written {emitted_after:.1f}s after the files"
        for held in (first, second):
            settled = rt.state.get_window(held.window_id)
            assert settled is not None and settled.value.status == "emitted", settled
        assert_both_chunks_emitted_once(rt, spark, table, capture_id, range_id)


def cached_rdds(spark: Any) -> set[int]:
    """The ids of the RDDs Spark holds blocks of (persisted, local checkpoints)."""
    return {info.id() for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}


def test_a_chunks_held_rows_are_freed_once_its_files_are_written(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held chunk's local checkpoint is dropped from Spark's storage when its writer is
    done with it, not whenever the JVM collects it: a long capture's chunks filled the
    storage memory before."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _two_chunks(services, spark, tmp_path, "free", 7511) as (
        rt, table, capture_id, range_id, first, second
    ):
        held = {h.rows._jdf.queryExecution().analyzed().rdd().id() for h in (first, second)}
        assert held <= cached_rdds(spark)
        capturer = rt.capturer()
        writers = [threading.Thread(target=capturer._write_held, args=(h,),
                                    kwargs={"stop": None}) for h in (first, second)]
        for w in writers:
            w.start()
        rt.tailer().run(until_caught_up=True)
        for w in writers:
            w.join(timeout=60)
            assert not w.is_alive()
        wait_for("the chunks' blocks dropped", lambda: not held & cached_rdds(spark),
                 timeout=10)
        assert_both_chunks_emitted_once(rt, spark, table, capture_id, range_id)


def test_the_mirror_check_of_a_pinned_chunk_runs_while_the_log_is_read_on(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check whether the mirror holds a row in a pinned chunk's coverage (a Spark job
    of seconds on a busy lake) runs beside the log's reading: here the first chunk's check
    answers only once the second chunk is pinned, which a tailer that asked on its reading
    thread would never do. Both chunks are emitted, each row once."""
    from dblog.state import handoff

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _two_chunks(services, spark, tmp_path, "check", 7506) as (
        rt, table, capture_id, range_id, first, second
    ):
        capturer = rt.capturer()
        holds = rt.sink.mirror_holds
        seen: list[tuple[bool, str]] = []

        def slow_check(*args: Any) -> bool:
            deadline = time.monotonic() + 20
            while (handoff.read_pin(rt.state, second.window_id) is None
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            seen.append((handoff.read_pin(rt.state, second.window_id) is not None,
                         threading.current_thread().name))
            return bool(holds(*args))

        monkeypatch.setattr(rt.sink, "mirror_holds", slow_check)
        writers = [threading.Thread(target=capturer._write_held, args=(held,),
                                    kwargs={"stop": None}) for held in (first, second)]
        for w in writers:
            w.start()
        tailer = rt.tailer()
        reader = threading.current_thread().name
        tailer.run(until_caught_up=True)
        for w in writers:
            w.join(timeout=60)
            assert not w.is_alive()
        assert len(seen) == 2 and seen[0][0], seen
        assert all(name != reader for _, name in seen), seen
        for held in (first, second):
            settled = rt.state.get_window(held.window_id)
            assert settled is not None and settled.value.status == "emitted", settled
        assert_both_chunks_emitted_once(rt, spark, table, capture_id, range_id)


def assert_lost_chunk_and_the_next_aborted(rt: Any, first: Any, second: Any) -> None:
    """Wait until both held chunks' windows are settled: the first aborted as its capture
    ended before writing it, the second as out of order behind it."""
    statuses: list[Any] = []

    def both_settled() -> bool:
        statuses[:] = [rt.state.get_window(h.window_id) for h in (first, second)]
        return all(st is not None and st.value.status != "registered" for st in statuses)

    wait_for("both windows settled", both_settled)
    assert [st.value.status for st in statuses] == ["aborted", "aborted"], statuses
    assert "ended before writing" in (statuses[0].value.detail or "")
    assert "out of order" in (statuses[1].value.detail or "")


def test_a_pinned_chunk_whose_files_never_come_aborts_the_next_chunks_of_its_range(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two chunks of a range pinned in one batch; the capture holding the first dies
    before writing it. The second, although written, is aborted too (a range's chunks are
    emitted in key order), and the running tailer forgets the progress it had counted on:
    the resumed capture selects both again and the tailer emits them, each row once."""
    from dblog.state import handoff
    from tests.integration.oracle import verify_table

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _two_chunks(services, spark, tmp_path, "lost", 7504) as (
        rt, table, capture_id, range_id, first, second
    ):
        capturer = rt.capturer()
        handoff.release(rt.state, first.window_id)  # its capture died holding the rows
        writer = threading.Thread(target=capturer._write_held, args=(second,),
                                  kwargs={"stop": None})
        writer.start()
        stop = threading.Event()
        tailing = threading.Thread(target=lambda: rt.tailer().run(stop=stop))
        tailing.start()
        try:
            assert_lost_chunk_and_the_next_aborted(rt, first, second)
            writer.join(timeout=30)
            progress = rt.state.get_range(capture_id, range_id)
            assert progress is not None and progress.value.chunks_emitted == 0
            reports: list[Any] = []
            resumed = threading.Thread(target=lambda: reports.extend(capturer.run(capture_id)),
                                       daemon=True)
            resumed.start()
            resumed.join(timeout=120)
            assert not resumed.is_alive(), "the resumed capture's chunks keep being aborted"
            assert [r.status for r in reports] == ["done"], reports
            # the chunks reach the mirror too (the tailer merged other batches meanwhile)
            rt.wait_caught_up(lambda: None, timeout=120)
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary()
        finally:
            stop.set()
            tailing.join(timeout=60)
        progress = rt.state.get_range(capture_id, range_id)
        assert progress is not None and progress.value.done
        assert progress.value.rows_emitted == 40
        frame = changelog_frame(spark, rt.layout.changelog(table))
        reads = frame[frame["op"] == "r"]
        assert len(reads) == 40 and sorted(r["id"] for r in reads["after"]) == list(range(1, 41))


@dataclass
class _Queued:
    """What :func:`_next_chunk_pinned_behind_a_closed_batch` sets up."""

    rt: Any
    conn: Any
    db: str
    table: TableId
    capturer: Any
    capture_id: str
    range_id: str
    first: Any
    second: Any
    stop_tailer: Callable[[], None]
    errors: list[BaseException]

    def status(self, wid: str) -> str | None:
        return window_status(self.rt, wid)


def window_status(rt: Any, wid: str) -> str | None:
    """The window's status in ZooKeeper (``None``: gone)."""
    found = rt.state.get_window(wid)
    return None if found is None else found.value.status


def start_tailing(tailer: Any, stop: threading.Event, errors: list[BaseException]
                  ) -> threading.Thread:
    """``tailer`` running in a thread of its own until ``stop``; what it raises is added to
    ``errors``."""
    def tail() -> None:
        try:
            tailer.run(stop=stop)
        except BaseException as exc:  # noqa: BLE001 - the test looks at them
            errors.append(exc)

    tailing = threading.Thread(target=tail)
    tailing.start()
    return tailing


@contextmanager
def _next_chunk_pinned_behind_a_closed_batch(
    services: Endpoints, spark: Any, tmp_path: Path, prefix: str, server_id: int
) -> Iterator[_Queued]:
    """A new 40-row table and a tailer running with ``pin_ahead_s`` 1 s: a capture's first
    20-row chunk selected and pinned, a log change (``v = -1`` at id 1) that waited long
    enough to close the chunk's batch, and the second chunk selected and pinned for the
    batch after it, neither chunk's files written. The tailer's errors are collected."""
    from dataclasses import replace

    from dblog.state import handoff

    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn = make_table(services, db, 40)
    config = one_table_config(services, tmp_path, db, server_id, chunk_size=20,
                              poll_seconds=0.2)
    table = TableId(db, "t")
    try:
        with open_runtime(config, spark=spark) as rt:
            capturer, capture_id, range_id, upper, schema = plan_bounded_capture(rt, table)
            tailer = rt.tailer()
            tailer.options = replace(tailer.options, pin_ahead_s=1.0)
            stop = threading.Event()
            errors: list[BaseException] = []
            tailing = start_tailing(tailer, stop, errors)
            held: list[Any] = []

            def stop_tailer() -> None:
                stop.set()
                for h in held:  # a capture still holding rows gives them up
                    handoff.release(rt.state, h.window_id)
                tailing.join(timeout=60)

            try:
                first, rows, last, _ = capturer._chunk(capture_id, range_id, table, schema,
                                                       None, upper, None, None, 20)
                held.append(first)
                assert rows == 20 and last == (20,)
                wait_for("the first chunk's pin",
                         lambda: handoff.read_pin(rt.state, first.window_id) is not None)
                with conn.cursor() as cur:  # a log change joins the waiting batch
                    cur.execute(f"UPDATE {q(db)}.t SET v = -1 WHERE id = 1")  # noqa: S608
                time.sleep(2.0)  # longer than pin_ahead_s: the batch closes
                second, rows, last, _ = capturer._chunk(capture_id, range_id, table, schema,
                                                        last, upper, None, None, 20)
                held.append(second)
                assert rows == 20 and last == (40,)
                wait_for("the second chunk's pin, while the first batch waits",
                         lambda: handoff.read_pin(rt.state, second.window_id) is not None,
                         timeout=20)
                yield _Queued(rt, conn, db, table, capturer, capture_id, range_id, first,
                              second, stop_tailer, errors)
            finally:
                stop_tailer()
            rt.state.delete("", recursive=True)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {q(db)}")
        conn.close()


def test_a_closed_batch_waits_for_its_chunk_while_the_next_batch_pins_the_chunk_after_it(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch holding a pinned chunk and a log change closes once the change has waited
    ``pin_ahead_s``, and waits for the chunk's files; the tailer reads on meanwhile, and
    the next chunk's high watermark is pinned for the next batch, so its capture can write
    it at once (a tailer that read nothing while the batch waited pinned it only after
    the first chunk's write). The closed batch is written while the next chunk's files
    are still missing, and ZooKeeper's range progress then holds the first chunk only: a
    crash there must not leave the second chunk counted as emitted while its rows are in
    no commit. A log change after the second high watermark reaches the changelog in the
    second chunk's commit or after it, never before."""
    from dblog.state import handoff

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _next_chunk_pinned_behind_a_closed_batch(services, spark, tmp_path, "ahead",
                                                  7505) as s:
        rt, first, second = s.rt, s.first, s.second
        first_pin = handoff.read_pin(rt.state, first.window_id)
        second_pin = handoff.read_pin(rt.state, second.window_id)
        assert first_pin is not None and second_pin is not None
        assert second_pin.batch == first_pin.batch + 1
        assert s.status(first.window_id) == "registered"  # its files are not written
        with s.conn.cursor() as cur:  # a change of the second chunk's, after its HW
            cur.execute(f"UPDATE {q(s.db)}.t SET v = -30 WHERE id = 30")  # noqa: S608
        writers = [threading.Thread(target=s.capturer._write_held, args=(h,),
                                    kwargs={"stop": None}) for h in (first, second)]
        try:
            writers[0].start()
            wait_for("the first chunk's emission",
                     lambda: s.status(first.window_id) == "emitted")
            assert s.status(second.window_id) == "registered"
            progress = rt.state.get_range(s.capture_id, s.range_id)
            assert progress is not None
            assert (progress.value.last_emitted_key, progress.value.chunks_emitted,
                    progress.value.rows_emitted, progress.value.done) == ((20,), 1, 20, False)
            time.sleep(1.5)  # the second batch waits for the second chunk's files
            frame = changelog_frame(spark, rt.layout.changelog(s.table))
            assert [r["v"] for r in frame[frame["op"] == "u"]["after"]] == [-1]
            writers[1].start()
            wait_for("the second chunk's emission",
                     lambda: s.status(second.window_id) == "emitted")
            wait_for("the second change", lambda: len(
                (f := changelog_frame(spark, rt.layout.changelog(s.table)))[f["op"] == "u"]
            ) == 2)
        finally:
            s.stop_tailer()
            for w in writers:
                if w.ident is not None:  # started
                    w.join(timeout=60)
        assert not s.errors, s.errors
        frame = assert_both_chunks_emitted_once(rt, spark, s.table, s.capture_id,
                                                s.range_id)
        second_reads = frame[(frame["op"] == "r")
                             & (frame["_dblog_window_id"] == second.window_id)]
        change = frame[(frame["op"] == "u") & frame["after"].map(lambda a: a["id"] == 30)]
        assert len(change) == 1
        assert change["_commit_version"].min() >= second_reads["_commit_version"].max()
        updates = frame[frame["op"] == "u"]
        assert sorted(r["v"] for r in updates["after"]) == [-30, -1]


def test_a_batch_pins_two_chunks_and_emits_them_before_the_third_chunks_files(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three chunks' high watermarks in the log of an idle source: the batch that pinned
    the first two closes (``pins_per_batch``), the third is pinned for the batch after it,
    and the first two are emitted as soon as their own files are written, while the
    third's are still missing. A batch that went on pinning every high watermark held
    the first two until every chunk pinned meanwhile had its files: on an idle source,
    until the capture stopped selecting at its ``max_in_flight`` limit, so the capture
    paused, and one core idled, every ``max_in_flight`` chunks (a 5M-row capture: 2.7-4.6 s
    per pause)."""
    from dblog.state import handoff

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = f"twopins_{uuid.uuid4().hex[:8]}"
    make_table(services, db, 60).close()
    config = one_table_config(services, tmp_path, db, 7507, chunk_size=20, poll_seconds=0.2)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        capturer, capture_id, range_id, upper, schema = plan_bounded_capture(rt, table)
        tailer = rt.tailer()
        assert tailer.options.pins_per_batch == 2
        stop = threading.Event()
        errors: list[BaseException] = []
        tailing = start_tailing(tailer, stop, errors)
        held: list[Any] = []
        writers: list[threading.Thread] = []

        def write(chunk: Any) -> None:
            writer = threading.Thread(target=capturer._write_held, args=(chunk,),
                                      kwargs={"stop": None})
            writer.start()
            writers.append(writer)

        try:
            last = None
            for _ in range(3):
                chunk, rows, last, _ = capturer._chunk(capture_id, range_id, table, schema,
                                                       last, upper, None, None, 20)
                assert rows == 20
                held.append(chunk)
            assert last == (60,)
            for chunk in held:
                wait_for("every chunk's pin", lambda c=chunk: handoff.read_pin(
                    rt.state, c.window_id) is not None, timeout=20)
            pins = [handoff.read_pin(rt.state, c.window_id) for c in held]
            assert all(p is not None for p in pins)
            batches = [p.batch for p in pins if p is not None]
            assert batches[1] == batches[0] and batches[2] == batches[0] + 1, batches
            write(held[0])
            write(held[1])
            wait_for("the first two chunks' emission, the third's files missing",
                     lambda: all(window_status(rt, c.window_id) == "emitted"
                                 for c in held[:2]),
                     timeout=30)
            assert window_status(rt, held[2].window_id) == "registered"
            progress = rt.state.get_range(capture_id, range_id)
            assert progress is not None
            assert (progress.value.last_emitted_key, progress.value.chunks_emitted) == ((40,), 2)
            write(held[2])
            wait_for("the third chunk's emission",
                     lambda: window_status(rt, held[2].window_id) == "emitted",
                     timeout=30)
        finally:
            stop.set()
            for chunk in held:  # a chunk whose writer never ran gives its rows up
                handoff.release(rt.state, chunk.window_id)
            tailing.join(timeout=60)
            for writer in writers:
                writer.join(timeout=60)
        assert not errors, errors
        progress = rt.state.get_range(capture_id, range_id)
        assert progress is not None
        assert (progress.value.last_emitted_key, progress.value.chunks_emitted,
                progress.value.rows_emitted) == ((60,), 3, 60)
        frame = changelog_frame(spark, rt.layout.changelog(table))
        reads = frame[frame["op"] == "r"]
        assert sorted(r["id"] for r in reads["after"]) == list(range(1, 61))
        rt.state.delete("", recursive=True)


def resume_capture(s: _Queued) -> None:
    """Run the capture on to its end (it selects again what was aborted); fail if it
    does not end."""
    reports: list[Any] = []
    resumed = threading.Thread(target=lambda: reports.extend(s.capturer.run(s.capture_id)),
                               daemon=True)
    resumed.start()
    resumed.join(timeout=120)
    assert not resumed.is_alive(), "the resumed capture did not end"
    assert not s.errors, s.errors
    assert [r.status for r in reports] == ["done"], reports


def assert_every_row_read_once(s: _Queued, spark: Any) -> None:
    progress = s.rt.state.get_range(s.capture_id, s.range_id)
    assert progress is not None and progress.value.done
    assert progress.value.rows_emitted == 40
    frame = changelog_frame(spark, s.rt.layout.changelog(s.table))
    reads = frame[frame["op"] == "r"]
    assert sorted(r["id"] for r in reads["after"]) == list(range(1, 41))


def test_a_chunk_whose_files_never_come_aborts_its_range_in_the_batch_built_after_it(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first chunk's batch closed and the next chunk of the range was pinned for the
    batch after it; then the capture holding the first chunk dies before writing it. The
    first chunk is aborted when its batch is written, and the second, pinned in the next
    batch and written by its capture, is aborted too (a range's chunks are emitted in key
    order); the range's place goes back to before the first. The resumed capture selects
    both again and every row is read into the changelog once."""
    from dblog.state import handoff
    from tests.integration.oracle import verify_table

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _next_chunk_pinned_behind_a_closed_batch(services, spark, tmp_path, "lostq",
                                                  7507) as s:
        rt, first, second = s.rt, s.first, s.second
        writer = threading.Thread(target=s.capturer._write_held, args=(second,),
                                  kwargs={"stop": None})
        writer.start()
        try:
            handoff.release(rt.state, first.window_id)  # its capture died holding it
            assert_lost_chunk_and_the_next_aborted(rt, first, second)
        finally:
            writer.join(timeout=60)
        progress = rt.state.get_range(s.capture_id, s.range_id)
        assert progress is not None
        assert (progress.value.chunks_emitted, progress.value.last_emitted_key,
                progress.value.rows_emitted) == (0, None, 0)
        resume_capture(s)
        rt.wait_caught_up(lambda: None, timeout=120)
        report = verify_table(rt.dialect, rt.sink, s.table)
        assert report.ok, report.summary()
        s.stop_tailer()
        assert_every_row_read_once(s, spark)


def test_a_lost_chunk_pinned_behind_a_written_batch_sends_its_range_back_to_that_batch(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second chunk is pinned for the batch after the first chunk's closed batch; the
    first batch is written (the range's counts and ZooKeeper version move), then the
    capture holding the second chunk dies. The second chunk is aborted and the range's
    place goes back to the first chunk, keeping what the first batch committed: the
    resumed capture selects the second chunk again and the tailer commits it (a tailer
    that restored the progress it saw at the pin would commit a stale range version and
    fail, or lose the first chunk's counts)."""
    from dblog.state import handoff

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    with _next_chunk_pinned_behind_a_closed_batch(services, spark, tmp_path, "backq",
                                                  7508) as s:
        rt, first, second = s.rt, s.first, s.second
        s.capturer._write_held(first, stop=None)
        wait_for("the first chunk's emission", lambda: s.status(first.window_id) == "emitted")
        handoff.release(rt.state, second.window_id)  # its capture died holding it
        wait_for("the second chunk's abort", lambda: s.status(second.window_id) == "aborted")
        progress = rt.state.get_range(s.capture_id, s.range_id)
        assert progress is not None
        assert (progress.value.chunks_emitted, progress.value.last_emitted_key,
                progress.value.rows_emitted, progress.value.done) == (1, (20,), 20, False)
        resume_capture(s)
        s.stop_tailer()
        assert not s.errors, s.errors
        assert_every_row_read_once(s, spark)


def test_a_tailer_killed_right_after_a_closed_batch_commits_loses_no_chunk_pinned_after_it(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tailer dies (a raised ``_Crash`` stands for kill -9) right after the closed
    batch's ZooKeeper commit, while the batch after it holds the second chunk's pin and
    that chunk's files are not written; the capture holding them dies with the process.
    Restarted (a new tailer, the capture resumed: it selects the second chunk again), every
    row is read into the changelog once and both log changes are in it once. A tailer that
    committed its look-ahead with the closed batch would leave the second chunk counted as
    emitted with its rows in no commit: the resumed capture would end without them."""
    from dblog.state import handoff
    from dblog.tail.commit import Committer

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    dies_after: set[str] = set()
    commit = Committer._commit

    def commit_then_die(self: Any, *args: Any) -> Any:
        result = commit(self, *args)
        if any(w.window_id in dies_after and w.status == "emitted" for w in args[-1]):
            dies_after.clear()
            raise _Crash
        return result

    monkeypatch.setattr(Committer, "_commit", commit_then_die)
    with _next_chunk_pinned_behind_a_closed_batch(services, spark, tmp_path, "killq",
                                                  7509) as s:
        rt, first, second = s.rt, s.first, s.second
        with s.conn.cursor() as cur:  # a change of the second chunk's, after its HW
            cur.execute(f"UPDATE {q(s.db)}.t SET v = -30 WHERE id = 30")  # noqa: S608
        dies_after.add(first.window_id)
        s.capturer._write_held(first, stop=None)
        wait_for("the tailer's death", lambda: bool(s.errors))
        assert [type(e) for e in s.errors] == [_Crash], s.errors
        assert (s.status(first.window_id), s.status(second.window_id)) == (
            "emitted", "registered")
        handoff.release(rt.state, second.window_id)  # the capture died with the process
        progress = rt.state.get_range(s.capture_id, s.range_id)
        assert progress is not None
        assert (progress.value.last_emitted_key, progress.value.chunks_emitted,
                progress.value.rows_emitted, progress.value.done) == ((20,), 1, 20, False)
        s.errors.clear()
        stop = threading.Event()
        restarted = start_tailing(rt.tailer(), stop, s.errors)
        try:
            resume_capture(s)
            rt.wait_caught_up(lambda: None, timeout=120)
        finally:
            stop.set()
            restarted.join(timeout=60)
        assert not s.errors, s.errors
        assert_every_row_read_once(s, spark)
        frame = changelog_frame(spark, rt.layout.changelog(s.table))
        updates = frame[frame["op"] == "u"]
        assert sorted(r["v"] for r in updates["after"]) == [-30, -1]
