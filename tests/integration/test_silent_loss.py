"""Failure paths that used to lose data without any error: each reproduced against the real
services, each must now recover exactly or stop with a clear error."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.sample import config_dict, connect
from devtools.services import Endpoints
from tests.integration.helpers import execute, make_db, run_dblog, wait_for_a_held_chunk
from tests.integration.oracle import verify_table
from tests.integration.sources import SourceKit

pytestmark = pytest.mark.integration


def write_cfg(path: Path, ep: Endpoints, tables: list[str], server_id: int) -> Path:
    config = config_dict(source=f"loss-{uuid.uuid4().hex[:8]}", ep=ep, tables=tables,
                         lake=path.parent / "lake", server_id=server_id, chunk_size=50,
                         batch_seconds=0.3, poll_seconds=0.2)
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


def wait_lock_free(config: Path, timeout: float = 60) -> None:
    """A SIGKILLed tailer's ZooKeeper session holds the lock until it expires."""
    deadline = time.monotonic() + timeout
    with open_runtime(load_config(config), validate=False) as rt:
        while rt.state.lock_holder() is not None:
            assert time.monotonic() < deadline, "the dead tailer's lock never expired"
            time.sleep(0.5)


def loss_config(kit: SourceKit, tmp_path: Path, db: str, source: str) -> Path:
    """The configuration of ``db``'s table ``t``: small chunks, short batches and polls."""
    return kit.config(tmp_path / "c.yaml", source=source, db=db, lake=tmp_path / "lake",
                      tables=[f"{db}.t"], chunk_size=50, batch_seconds=0.3, poll_seconds=0.2)


def test_a_crash_after_the_delta_write_loses_no_later_transaction(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    """The batch intent ended after an untracked transaction; on replay the next tracked
    transaction joined the crashed batch, Delta skipped it as already written."""
    db = source_kit.simple_table("loss", 0)
    untracked = source_kit.qualified(db, "u")
    source_kit.run_sql(db, f"CREATE TABLE {untracked} (id INT PRIMARY KEY)")
    with source_kit.cleaned(db, "loss") as source:
        cfg = loss_config(source_kit, tmp_path, db, source)
        with open_runtime(load_config(cfg), spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)
        source_kit.run_sql(db, "INSERT INTO {t} VALUES (1, 'v1')",
                           f"INSERT INTO {untracked} VALUES (1)")  # noqa: S608
        code, _ = run_dblog(cfg, "tail", "--until-caught-up", password=source_kit.password,
                            fault="tail.after_delta:1")
        assert code == -9
        source_kit.run_sql(db, "INSERT INTO {t} VALUES (3, 'v3')")
        wait_lock_free(cfg)
        with open_runtime(load_config(cfg), spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)  # the replay of the crashed batch, and on
            report = verify_table(rt.dialect, rt.sink, TableId(db, "t"))
            assert report.ok, report.summary()
            assert len(source_kit.rows(db, "t", ("id",))) == 2
            rt.state.delete("", recursive=True)


def test_tail_from_head_keeps_every_later_change(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    """``tail --from-head`` restarted batch numbers at 0 while the lake held higher ones:
    Delta skipped every later batch as already written."""
    db = source_kit.simple_table("loss", 0)
    with source_kit.cleaned(db, "loss") as source:
        cfg = loss_config(source_kit, tmp_path, db, source)
        with open_runtime(load_config(cfg), spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)
            for i in range(1, 6):  # a few batches in the lake
                source_kit.run_sql(db, f"INSERT INTO {{t}} VALUES ({i}, 'v{i}')")  # noqa: S608
                rt.tailer().run(until_caught_up=True)
            rt.tailer().run(until_caught_up=True, reset_to_head=True)  # `tail --from-head`
            source_kit.run_sql(db, "UPDATE {t} SET v = CONCAT('w', v)", "INSERT INTO {t} VALUES "
                               "(10, 'v10')", "INSERT INTO {t} VALUES (11, 'v11')")
            rt.tailer().run(until_caught_up=True)
            report = verify_table(rt.dialect, rt.sink, TableId(db, "t"))
            assert report.ok, report.summary()
            rt.state.delete("", recursive=True)


def test_a_capture_after_tail_from_head_deletes_keys_the_gap_took_that_the_mirror_lacked(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    """``tail --from-head`` never reads the log between the old position and the head, so
    the capture after it must delete every key the lake holds and the source lost in that
    gap. A chunk's deletes were computed from the mirror alone: a key whose insert was in
    the changelog but not yet merged when the gap took it stayed in the lake for good. The
    new generation's first run merges the mirrors before it reads the log; here the
    ``--from-head`` run dies as it begins that merge, and the next run does it."""
    from dblog.capture import CaptureRequest
    from dblog.tail.background import BackgroundTailer

    db = source_kit.simple_table("loss", 0)
    table = TableId(db, "t")
    with source_kit.cleaned(db, "loss") as source:
        cfg = loss_config(source_kit, tmp_path, db, source)
        with open_runtime(load_config(cfg), spark=spark) as rt:
            def mirror_ids() -> set[int]:
                return {r["id"] for r in spark.read.format("delta")
                        .load(rt.layout.mirror(table)).collect()}

            rt.tailer().run(until_caught_up=True)
            source_kit.run_sql(db, "INSERT INTO {t} VALUES (1, 'v1'), (2, 'v2')")
            rt.tailer().run(until_caught_up=True)  # merged
            source_kit.run_sql(db, "INSERT INTO {t} VALUES (3, 'v3'), (4, 'v4')")
            rt.tailer().run(until_caught_up=True, merge_at_end=False)
            assert mirror_ids() == {1, 2}  # 3 and 4 are in the changelog only
            source_kit.run_sql(db, "DELETE FROM {t} WHERE id IN (2, 4)")  # the gap
            code, _ = run_dblog(cfg, "tail", "--from-head", "--until-caught-up",
                                password=source_kit.password, fault="tail.before_mirror:1")
            assert code == -9  # at the head already, before its first merge
            wait_lock_free(cfg)

            # The capture's window is open before the tailer starts (as when `dblog capture`
            # follows `dblog tail --from-head` at once): an idle tailer would merge at once,
            # this one merges before the chunk only what the new generation owes.
            capturer = rt.capturer()
            capture_id = capturer.plan(CaptureRequest((table,)))
            stop = threading.Event()

            def stop_once_a_chunk_is_held() -> None:
                wait_for_a_held_chunk(rt)
                stop.set()

            stopper = threading.Thread(target=stop_once_a_chunk_is_held, daemon=True)
            stopper.start()
            assert [r.status for r in capturer.run(capture_id, stop=stop)] == ["stopped"]
            stopper.join(130)
            with BackgroundTailer(rt.tailer()) as bg:
                capturer = rt.capturer()
                capturer.health_check = bg.check
                reports = capturer.run(capture_id, stop=threading.Event())
                assert [r.status for r in reports] == ["done"], reports
            rt.tailer().run(until_caught_up=True)
            assert mirror_ids() == {1, 3}
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary()
            rt.state.delete("", recursive=True)


def test_a_log_that_starts_again_behind_the_lake_is_refused_with_what_to_do(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    """After ``RESET MASTER`` (or a source rebuilt from a backup) the log's positions start
    again below the lake's, and the tailer's message for a position gone from the server
    says to run ``tail --from-head``: every change read then lost to the lake's older rows,
    which win by position. ``tail --from-head``, and a first run after ZooKeeper's state
    was lost, now refuse such a log and change nothing."""
    from pyspark.sql import functions as F

    from dblog.core.errors import DblogError

    db = source_kit.simple_table("loss", 0)
    table = TableId(db, "t")
    with source_kit.cleaned(db, "loss") as source:
        cfg = loss_config(source_kit, tmp_path, db, source)
        with open_runtime(load_config(cfg), spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)
            source_kit.run_sql(db, "INSERT INTO {t} VALUES (1, 'v1')")
            rt.tailer().run(until_caught_up=True)
            # The lake as a log reset leaves it: its newest change after the log's head.
            changelog = rt.layout.changelog(table)
            head = rt.dialect.to_position(rt.dialect.head_position())
            (spark.read.format("delta").load(changelog)
             .withColumn("_dblog_lsn", F.lit(head.lsn + (1 << 40)).cast("long"))
             .write.format("delta").mode("append").save(changelog))
            before = rt.state.get_position()
            with pytest.raises(DblogError, match="behind changes the lake already holds for"):
                rt.tailer().run(until_caught_up=True, reset_to_head=True)
            assert rt.state.get_position() == before
            rt.state.delete("", recursive=True)  # ZooKeeper's state lost
            with pytest.raises(DblogError, match="new lake"):
                rt.tailer().run(until_caught_up=True)
            assert rt.state.get_position() is None
            rt.state.delete("", recursive=True)


def sample_table(ep: Endpoints, rows: int = 0) -> str:
    db = make_db(ep, prefix="loss", ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)"])
    if rows:
        conn = connect(ep, db)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, i) for i in range(1, rows + 1)])
        conn.close()
    return db


def config_for(tmp_path: Path, ep: Endpoints, db: str, server_id: int, **tail: Any) -> Any:
    raw = config_dict(source=f"loss-{uuid.uuid4().hex[:8]}", ep=ep, tables=[f"{db}.t"],
                      lake=tmp_path / "lake", server_id=server_id, chunk_size=50,
                      batch_seconds=0.3, poll_seconds=0.2)
    raw["tail"].update(tail)
    from dblog.app.config import parse_config

    return parse_config(raw)


def changelog_count(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return 0
    return int(spark.read.format("delta").load(path).count())


def test_a_tailer_whose_session_is_lost_stops_writing(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fencing: after a ZooKeeper session loss a standby takes the lock while the old
    process keeps writing. Now the old one stops before its next write."""
    import threading

    from kazoo.client import KazooClient

    from dblog.core.errors import LeadershipLost

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services)
    config = config_for(tmp_path, services, db, 7903)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        execute(services, db, "INSERT INTO t VALUES (1, 1)")
        stop = threading.Event()
        failure: list[BaseException] = []

        def tail() -> None:
            try:
                rt.tailer().run(stop=stop)
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                failure.append(exc)

        worker = threading.Thread(target=tail, daemon=True)
        worker.start()
        deadline = time.monotonic() + 120
        while changelog_count(spark, rt.layout.changelog(table)) < 1:
            assert time.monotonic() < deadline and worker.is_alive(), failure
            time.sleep(0.2)
        # Expire the tailer's session from outside, as a long pause or partition would.
        session_id, session_password = rt.state._zk.client_id
        thief = KazooClient(hosts=config.zookeeper_hosts, client_id=(session_id,
                                                                     session_password))
        thief.start(timeout=10)
        thief.stop()
        thief.close()
        deadline = time.monotonic() + 60
        while not rt.state._session_lost.is_set():
            assert time.monotonic() < deadline, "the session loss was never noticed"
            time.sleep(0.1)
        execute(services, db, "INSERT INTO t VALUES (2, 2)")
        worker.join(60)
        stop.set()
        assert not worker.is_alive(), "the tailer went on after losing its session"
        assert failure and isinstance(failure[0], LeadershipLost), failure
        assert changelog_count(spark, rt.layout.changelog(table)) == 1


def test_the_batch_intent_is_compare_and_set(services: Endpoints, tmp_path: Path) -> None:
    from dblog.core.errors import StateConflict
    from dblog.core.events import Position
    from dblog.state import BatchIntent, PositionState, StateStore

    with StateStore.connect(services.zk_hosts, f"intent-{uuid.uuid4().hex[:8]}",
                            chroot="dblog-test") as store:
        store.commit_batch(PositionState(Position(10), {"lsn": 10}, 1), None,
                           clear_intent=False)
        position = store.get_position()
        assert position is not None
        store.create_batch_intent(BatchIntent(2, {"lsn": 10}, {"lsn": 20}), position.version)
        with pytest.raises(StateConflict):  # a second writer cannot overwrite it
            store.create_batch_intent(BatchIntent(2, {"lsn": 10}, {"lsn": 30}),
                                      position.version)
        store.commit_batch(PositionState(Position(20), {"lsn": 20}, 2), position.version)
        with pytest.raises(StateConflict):  # a stale writer: the position moved on
            store.create_batch_intent(BatchIntent(3, {"lsn": 20}, {"lsn": 40}),
                                      position.version)
        intent = store.get_batch_intent()
        assert intent is None


def test_a_window_update_for_a_forgotten_window_does_not_fail_the_commit(
    services: Endpoints,
) -> None:
    """A capture's recovery deleted a window document the tailer was settling: the tailer
    crashed after its Delta write, on every restart."""
    from dblog.core.events import Position, Window
    from dblog.state import PositionState, StateStore, WindowUpdate

    with StateStore.connect(services.zk_hosts, f"gone-{uuid.uuid4().hex[:8]}",
                            chroot="dblog-test") as store:
        store.commit_batch(PositionState(Position(10), {"lsn": 10}, 1), None,
                           clear_intent=False)
        window = Window("w1", TableId("d", "t"), "low-1", "high-1")
        store.register_window(window, {})
        store.remove_window("w1")
        position = store.get_position()
        assert position is not None
        store.commit_batch(PositionState(Position(20), {"lsn": 20}, 2), position.version,
                           windows=[WindowUpdate("w1", "aborted", "never staged")])
        moved = store.get_position()
        assert moved is not None and moved.value.batch == 2


def register_stale_window(rt: Any, table: TableId, capture_id: str) -> str:
    from dblog.core.events import Window

    wid = uuid.uuid4().hex
    window = Window(wid, table, low=str(uuid.uuid4()), high=str(uuid.uuid4()))
    rt.state.register_window(window, {"capture_id": capture_id, "range_id": "r0",
                                      "after_key": None})
    rt.dialect.write_watermark(window.low)  # the capture died right after its low watermark
    return wid


def test_stale_windows_are_aborted_by_cancel_from_head_and_expiry(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dblog.app.cli import main
    from dblog.capture import CaptureRequest

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services, rows=20)
    config = config_for(tmp_path, services, db, 7904, window_expiry_s=3)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(
        source=config.source.name, ep=services, tables=[f"{db}.t"], lake=tmp_path / "lake",
        server_id=7904)))
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        capture_id = rt.capturer().plan(CaptureRequest((table,)))
        cancelled = register_stale_window(rt, table, capture_id)
        expiring = register_stale_window(rt, table, "some-crashed-capture")
        rt.tailer().run(until_caught_up=True)  # sees both low watermarks
        for wid in (cancelled, expiring):
            found = rt.state.get_window(wid)
            assert found is not None and found.value.status == "registered"
            assert found.value.extra.get("lw_resume"), "the low watermark was not noted"
    # cancel aborts the capture's open windows
    assert main(["-c", str(cfg), "cancel", f"{db}.t"]) == 0
    capsys.readouterr()
    with open_runtime(config, spark=spark) as rt:
        found = rt.state.get_window(cancelled)
        assert found is not None and found.value.status == "aborted"
        time.sleep(3.5)
        rt.tailer().run(until_caught_up=True)  # the other one expires
        found = rt.state.get_window(expiring)
        assert found is not None and found.value.status == "aborted", found
        assert "expired" in (found.value.detail or "")
        # from-head aborts whatever is still open
        third = register_stale_window(rt, table, "another")
        rt.tailer().run(until_caught_up=True, reset_to_head=True)
        found = rt.state.get_window(third)
        assert found is not None and found.value.status == "aborted"


def test_a_capture_without_ranges_is_never_done(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Creating a capture was not atomic: a crash after the capture document and before its
    ranges left a capture that `resume` marked done without capturing anything."""
    from dblog.core.errors import DblogError

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services, rows=5)
    config = config_for(tmp_path, services, db, 7905)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.state.create_capture("half-made", (table,), {"keys": None, "where": None})
        with pytest.raises(DblogError, match="no key ranges"):
            rt.capturer().run("half-made")
        found = rt.state.get_capture("half-made")
        assert found is not None and found.value.status != "done"


def test_truncate_and_drop_empty_the_lake_table(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services)
    config = config_for(tmp_path, services, db, 7906)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        execute(services, db, "INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)",
                "UPDATE t SET v = 20 WHERE id = 2")
        rt.tailer().run(until_caught_up=True)
        # In one batch: a change before the truncate, the truncate, rows after it.
        execute(services, db, "UPDATE t SET v = 30 WHERE id = 3", "TRUNCATE TABLE t",
                "INSERT INTO t VALUES (4, 4)")
        rt.tailer().run(until_caught_up=True)
        assert verify_table(rt.dialect, rt.sink, table).ok
        execute(services, db, "DROP TABLE t",
                "CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (5, 5)")
        rt.tailer().run(until_caught_up=True)
        report = verify_table(rt.dialect, rt.sink, table)
        assert report.ok, report.summary()
        ops = [r["op"] for r in spark.read.format("delta").load(rt.layout.changelog(table))
               .orderBy("_dblog_lsn", "_dblog_seq").collect()]
        assert ops.count("t") == 2
        from tests.integration.checks import check_table

        check_table(spark, services, db, "t", ("id",), rt.layout.changelog(table))


def test_a_table_dropped_before_the_lake_held_it_does_not_stop_the_tailer(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configured table dropped before any change of it reached the lake (never
    captured, no row change since the tailer started): the lake has nothing of it to empty,
    and the tailer goes on past the DROP. It used to ask the source for the dropped table's
    schema to create lake tables for the empty-out, and failed there on every restart.
    The table created again is followed from its first row."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services, rows=3)
    config = config_for(tmp_path, services, db, 7913)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        assert not rt.sink.known_columns(table)
        execute(services, db, "DROP TABLE t")
        rt.tailer().run(until_caught_up=True)
        assert not rt.sink.known_columns(table)
        execute(services, db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
                "INSERT INTO t VALUES (7, 7)")
        rt.tailer().run(until_caught_up=True)
        report = verify_table(rt.dialect, rt.sink, table)
        assert report.ok, report.summary()


def test_a_capture_removes_mirror_rows_gone_from_the_source(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repair capture must be complete: mirror keys in a captured range that the select
    did not return (and the window did not see change) are emitted as deletes."""
    from pyspark.sql import functions as F

    from dblog.capture import CaptureRequest
    from dblog.core.events import Position
    from dblog.tail.background import BackgroundTailer

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services, rows=120)
    config = config_for(tmp_path, services, db, 7907)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        with BackgroundTailer(rt.tailer()) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            assert [r.status for r in capturer.run(capturer.plan(
                CaptureRequest((table,))))] == ["done"]
        # Rows the lake holds but the source lost without a row event (a stale lake, a
        # change made with binary logging off): inside the key space and past its end.
        mirror = rt.layout.mirror(table)
        ghosts = (spark.read.format("delta").load(mirror).where(F.col("id") <= 2)
                  .withColumn("id", F.col("id") + F.lit(1000) * F.col("id")))
        stale = Position.from_binlog(0, 5)
        ghosts = ghosts.withColumn("_dblog_lsn", F.lit(stale.lsn).cast("long"))
        ghosts.write.format("delta").mode("append").save(mirror)
        execute(services, db, "DELETE FROM t WHERE id = 120")  # the range's end moves
        execute(services, db, "SET sql_log_bin = 0", "DELETE FROM t WHERE id = 50")
        before = verify_table(rt.dialect, rt.sink, table)
        assert not before.ok
        with BackgroundTailer(rt.tailer()) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            reports = capturer.run(capturer.plan(CaptureRequest((table,))))
        assert [r.status for r in reports] == ["done"]
        rt.tailer().run(until_caught_up=True)
        report = verify_table(rt.dialect, rt.sink, table)
        assert report.ok, report.summary()
        deletes = (spark.read.format("delta").load(rt.layout.changelog(table))
                   .where((F.col("op") == "d") & F.col("_dblog_window_id").isNotNull())
                   .select(F.col("before.id").alias("id")).collect())
        assert sorted(r["id"] for r in deletes) == [50, 1001, 2002]


def test_timestamp_keys_in_the_fall_back_hour_of_a_host_time_zone_merge_once(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink bounds a MERGE by the span of the first key column its changes hold. For a
    TIMESTAMP key that span came back from Spark as the host's local time, and went to the
    next literal through local time again: in the hour a host's clock falls back, two
    instants share one local time, and the bound moved by an hour. A tailer on a host in
    America/New_York then merged an update of a key at 06:30 UTC on 2026-11-01 (01:30
    local, the second time) as a new row: the mirror held the key twice."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = make_db(services, prefix="loss", ddl=[
        "CREATE TABLE {db}.t (id TIMESTAMP(6) NOT NULL PRIMARY KEY, v INT)"])
    raw = config_dict(source=f"loss-{uuid.uuid4().hex[:8]}", ep=services,
                      tables=[f"{db}.t"], lake=tmp_path / "lake", server_id=7917,
                      chunk_size=50, batch_seconds=0.3, poll_seconds=0.2)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    new_york = {"TZ": "America/New_York"}

    def tail() -> None:
        run_dblog(path, "tail", "--until-caught-up", password=services.mariadb_password,
                  env_extra=new_york)

    utc = ["SET time_zone = '+00:00'"]
    tail()  # the position starts here
    execute(services, db, *utc, "INSERT INTO t VALUES ('2026-11-01 05:30:00', 1),"
            " ('2026-11-01 06:30:00', 1)")
    tail()
    execute(services, db, *utc, "UPDATE t SET v = 2 WHERE id = '2026-11-01 06:30:00'")
    tail()
    with open_runtime(load_config(path), spark=spark) as rt:
        table = TableId(db, "t")
        mirror = spark.read.format("delta").load(rt.layout.mirror(table))
        found = sorted((r["micros"], r["v"]) for r in mirror.selectExpr(
            "unix_micros(id) AS micros", "v").collect())
        at = 1_793_511_000_000_000  # 2026-11-01 05:30:00 UTC
        assert found == [(at, 1), (at + 3_600_000_000, 2)]
        report = verify_table(rt.dialect, rt.sink, table)
        assert report.ok, report.summary()
        rt.state.delete("", recursive=True)


def test_vacuum_keeps_the_chunk_files_a_pending_batch_commits(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tailer stopped after recording a batch whose chunk files its capture had
    published; `dblog maintain --vacuum` ran before the next tailer, with the changelog's
    retention shortened to nothing. VACUUM deletes every file no commit added that is older
    than the retention: it took the files the replay of that batch commits."""
    import threading

    from dblog.capture import CaptureRequest
    from dblog.lake.sink import DeltaSink
    from dblog.tail.background import BackgroundTailer

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = sample_table(services, rows=30)
    raw = config_dict(source=f"loss-{uuid.uuid4().hex[:8]}", ep=services,
                      tables=[f"{db}.t"], lake=tmp_path / "lake", server_id=7918,
                      chunk_size=50, batch_seconds=0.3, poll_seconds=0.2)
    raw["spark"] = {"conf": {"spark.databricks.delta.retentionDurationCheck.enabled": False}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    table = TableId(db, "t")
    write = DeltaSink.write_table_batch

    def stop_before_the_emission(sink: Any, tb: Any, *args: Any, **kwargs: Any) -> Any:
        if tb.emissions:
            raise RuntimeError("the tailer stops before its batch's Delta write")
        return write(sink, tb, *args, **kwargs)

    with open_runtime(load_config(path), spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        monkeypatch.setattr(DeltaSink, "write_table_batch", stop_before_the_emission)
        with pytest.raises(Exception, match="stops before"), BackgroundTailer(rt.tailer()) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            capturer.run(capturer.plan(CaptureRequest((table,))), stop=threading.Event())
        monkeypatch.undo()
        monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
        intent = rt.state.get_batch_intent()
        assert intent is not None and "emitted" in intent.value.windows.values()
        spark.sql(f"ALTER TABLE delta.`{rt.layout.changelog(table)}` SET TBLPROPERTIES"
                  " ('delta.deletedFileRetentionDuration' = 'interval 0 hours')")
        _, out = run_dblog(path, "maintain", "--vacuum", password=services.mariadb_password)
        assert "changelog not vacuumed" in out
        run_dblog(path, "tail", "--until-caught-up", password=services.mariadb_password)
        report = verify_table(rt.dialect, rt.sink, table)
        assert report.ok, report.summary()
        rt.state.delete("", recursive=True)


def test_zookeeper_failing_after_a_session_interruption_is_leadership_lost(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever ZooKeeper call of the tailer first meets an interrupted session (here the
    window listing of an idle poll), the tailer stops with LeadershipLost, so an in-process
    tailer stands by again; before, a ZooKeeper error ended it, and the capture with it."""
    from dblog.core.errors import LeadershipLost
    from dblog.state import StateUnavailable

    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    config = config_for(tmp_path, services, sample_table(services), 7910)
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)

        def listing_fails(interrupt: bool) -> Any:
            def list_windows(*args: Any, **kwargs: Any) -> Any:
                if interrupt:
                    rt.state._session_lost.set()  # what kazoo's event thread reports
                raise StateUnavailable("ZooKeeper unavailable during list windows: "
                                       "SessionExpiredError")
            return list_windows

        monkeypatch.setattr(rt.state, "list_windows", listing_fails(True))
        with pytest.raises(LeadershipLost, match="interrupted"):
            rt.tailer().run(until_caught_up=True)
        # An error on an uninterrupted session stays what it is.
        monkeypatch.setattr(rt.state, "list_windows", listing_fails(False))
        with pytest.raises(StateUnavailable):
            rt.tailer().run(until_caught_up=True)
