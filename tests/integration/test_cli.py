"""The ``dblog`` command against the real services: bad input gets one clear line and loses
nothing; verify finds differences; pause and resume continue where the capture stopped;
hostile identifiers survive the whole path into Delta."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dblog.app.cli import main
from dblog.app.config import load_config
from dblog.app.runtime import open_runtime
from dblog.core.events import TableId
from devtools.sample import config_dict, connect, q
from devtools.services import Endpoints
from tests.integration.checks import check_table
from tests.integration.helpers import make_db
from tests.integration.sources import SourceKit

pytestmark = pytest.mark.integration


def write_cfg(path: Path, ep: Endpoints, tables: list[str], **overrides: Any) -> Path:
    config = config_dict(source=f"cli-{uuid.uuid4().hex[:8]}", ep=ep, tables=tables,
                         lake=path.parent / "lake", server_id=7400, chunk_size=50,
                         max_in_flight=2)
    config["source"].update(overrides.pop("source", {}))
    config.update(overrides)
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


@pytest.fixture
def env(services: Endpoints, monkeypatch: pytest.MonkeyPatch) -> Endpoints:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    return services


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_without_primary_key_is_refused(
    env: Endpoints, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_db(env, prefix="cli", ddl=["CREATE TABLE {db}.heap (a INT, b TEXT)"])
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.heap"])
    code, _, err = run(capsys, "-c", str(cfg), "capture")
    assert code == 2
    assert f"{db}.heap has no primary key" in err and err.count("\n") == 1


def test_unknown_table_wrong_password_unreachable_server(
    env: Endpoints, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = make_db(env, prefix="cli", ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY)"])
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.missing"])
    code, _, err = run(capsys, "-c", str(cfg), "capture")
    assert code == 2 and f"{db}.missing" in err
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", "not-the-password")
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.t"])
    code, _, err = run(capsys, "-c", str(cfg), "status")
    assert code == 2 and "access denied" in err.lower()
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.t"], source={"port": 1})
    code, _, err = run(capsys, "-c", str(cfg), "capture")
    assert code == 2 and "127.0.0.1:1" in err


def test_malformed_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("source: {name: x}\ntables: []\n")
    code, _, err = run(capsys, "-c", str(cfg), "status")
    assert code == 2 and "config error" in err


def test_purged_position_says_to_run_a_capture(
    env: Endpoints, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = make_db(env, prefix="cli", ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY)"])
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.t"])
    config = load_config(cfg)
    from dblog.core.events import Position
    from dblog.state import PositionState

    with open_runtime(config, validate=False) as rt:
        gone = {"file": "mysql-bin.000000", "pos": 4}
        rt.state.commit_batch(PositionState(Position.from_binlog(0, 4), gone, 0), None,
                              clear_intent=False)
    code, _, err = run(capsys, "-c", str(cfg), "tail", "--until-caught-up")
    assert code == 2 and "capture" in err
    with open_runtime(config, validate=False) as rt:  # nothing was overwritten
        pos = rt.state.get_position()
        assert pos is not None and dict(pos.value.source_position) == gone


def test_verify_status_pause_resume(
    source_kit: SourceKit, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Part of the contract suite (runs for every source database): pause, status, resume,
    verify, and repair captures of chosen keys and of a WHERE filter."""
    db = source_kit.simple_table("cli", 400)
    with source_kit.cleaned(db, "cli") as source:
        _verify_status_pause_resume(source_kit, spark, tmp_path, capsys, db, source)


def _verify_status_pause_resume(source_kit: SourceKit, spark: Any, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str], db: str,
                                source: str) -> None:
    # The lake root as a URI: every lake path goes through Spark's Hadoop filesystems as
    # text (as for s3a://), none through the driver's local disk.
    cfg = source_kit.config(tmp_path / "c.yaml", source=source, db=db,
                            lake=f"file://{tmp_path}/lake", chunk_size=50, tables=[f"{db}.t"])
    data = yaml.safe_load(cfg.read_text())
    data["capture"]["max_in_flight"] = 2
    cfg.write_text(yaml.safe_dump(data))
    config = load_config(cfg)
    table = TableId(db, "t")
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        from dblog.capture import CaptureRequest
        from dblog.tail.background import BackgroundTailer

        with BackgroundTailer(rt.tailer()) as bg:
            capturer = rt.capturer()
            capturer.health_check = bg.check
            capture_id = capturer.plan(CaptureRequest((table,)))
            reports: list[Any] = []
            worker = threading.Thread(target=lambda: reports.extend(capturer.run(capture_id)))
            worker.start()
            deadline = time.monotonic() + 300
            while True:  # pause once a few chunks are emitted
                ranges = rt.state.list_ranges(capture_id)
                if sum(r.value.chunks_emitted for r in ranges.values()) >= 2:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert run(capsys, "-c", str(cfg), "pause", f"{db}.t")[0] == 0
            worker.join(300)
        assert [r.status for r in reports] == ["paused"]
        paused_at = next(iter(rt.state.list_ranges(capture_id).values())).value
        assert not paused_at.done and paused_at.last_emitted_key is not None
        code, out, _ = run(capsys, "-c", str(cfg), "status")
        assert code == 0 and f"{db}.t" in out and "paused" in out
        code, out, _ = run(capsys, "-c", str(cfg), "resume", f"{db}.t")
        assert code == 0, out
        final = next(iter(rt.state.list_ranges(capture_id).values())).value
        assert final.done and final.rows_emitted == 400
        code, out, _ = run(capsys, "-c", str(cfg), "verify")
        assert code == 0 and "verify: OK" in out
        # A change the tailer has not seen: verify exits 1 and names the key.
        source_kit.run_sql(db, "UPDATE {t} SET v = 'changed' WHERE id = 123")
        code, out, _ = run(capsys, "-c", str(cfg), "verify")
        assert code == 1 and "(123,)" in out
        # Tailed without the mirror's last merge: the current state has the change.
        code, out, err = run(capsys, "-c", str(cfg), "tail", "--until-caught-up",
                             "--no-final-merge")
        assert code == 0, out + err
        code, out, _ = run(capsys, "-c", str(cfg), "verify", "--current")
        assert code == 0 and "verify: OK" in out, out
        assert run(capsys, "-c", str(cfg), "tail", "--no-final-merge")[0] == 2  # refused
        rt.tailer().run(until_caught_up=True)
        frame = check_table(spark, source_kit.ep, db, "t", ("id",), rt.layout.changelog(table),
                            expected_rows=source_kit.rows(db, "t", ("id",)))
        reads = frame[frame["op"] == "r"]
        assert len(reads) == 400 and reads["after"].map(lambda a: a["id"]).is_unique
    # Repair captures: chosen keys, and a WHERE filter.
    assert run(capsys, "-c", str(cfg), "capture", f"{db}.t", "--keys", "5", "7", "123")[0] == 0
    assert run(capsys, "-c", str(cfg), "capture", f"{db}.t", "--where", "id > 390")[0] == 0
    with open_runtime(config, spark=spark) as rt:
        frame = check_table(spark, source_kit.ep, db, "t", ("id",), rt.layout.changelog(table),
                            expected_rows=source_kit.rows(db, "t", ("id",)))
        reads = frame[frame["op"] == "r"]
        counts = reads["after"].map(lambda a: a["id"]).value_counts()
        twice = sorted(int(k) for k, n in counts.items() if n == 2)
        assert twice == [5, 7, 123, *range(391, 401)] and counts.max() == 2
        history = spark.sql(f"DESCRIBE HISTORY delta.`{rt.layout.changelog(table)}`").collect()
        metadata = [h["userMetadata"] for h in history if h["operation"] == "WRITE"]
        assert metadata and all('"dblog.batch"' in m for m in metadata)
        rt.state.delete("", recursive=True)


def test_hostile_identifiers_end_to_end(
    env: Endpoints, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"we'ird `db` {uuid.uuid4().hex[:6]} é"
    conn = connect(env)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {q(db)}")
        quoted = q('quo"te')
        cur.execute(f"CREATE TABLE {q(db)}.{q('ta`ble ü')} ({q('i d')} INT, "
                    f"{q('na,me')} VARCHAR(20), {quoted} INT, PRIMARY KEY ({q('i d')}))")
        cur.executemany(f"INSERT INTO {q(db)}.{q('ta`ble ü')} VALUES (%s, %s, %s)",  # noqa: S608
                        [(i, f"n{i}", i) for i in range(1, 121)])
    table = TableId(db, "ta`ble ü")
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.ta`ble ü"])
    config = load_config(cfg)
    with open_runtime(config, spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)
        with conn.cursor() as cur:
            cur.execute(f"UPDATE {q(db)}.{q('ta`ble ü')} SET {q('na,me')} = 'upd' "  # noqa: S608
                        f"WHERE {q('i d')} < 10")
            cur.execute(f"DELETE FROM {q(db)}.{q('ta`ble ü')} WHERE {q('i d')} > 110")  # noqa: S608
    code, out, err = run(capsys, "-c", str(cfg), "capture")
    assert code == 0, err
    code, out, err = run(capsys, "-c", str(cfg), "verify")
    assert code == 0 and "verify: OK" in out, out + err
    with open_runtime(config, spark=spark) as rt:
        check_table(spark, env, db, "ta`ble ü", ("i d",), rt.layout.changelog(table))
    conn.close()


def test_maintain_compacts_small_files_refuses_beside_a_tailer_and_the_tailer_does_it_too(
    env: Endpoints, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import deltalake

    db = make_db(env, prefix="cli", ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT)"])
    cfg = write_cfg(tmp_path / "c.yaml", env, [f"{db}.t"], lake=f"file://{tmp_path}/lake")
    conn = connect(env, db)

    def insert_and_tail(first: int) -> None:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (%s, %s), (%s, %s)", (first, 1, first + 1, 2))
        code, _, err = run(capsys, "-c", str(cfg), "tail", "--until-caught-up")
        assert code == 0, err

    run(capsys, "-c", str(cfg), "tail", "--until-caught-up")  # stores the head position
    for first in (1, 11, 21):
        insert_and_tail(first)  # one batch, one changelog file each
    config = load_config(cfg)
    table = TableId(db, "t")
    with open_runtime(config, validate=False) as rt:
        changelog = rt.layout.changelog(table)
        before = len(deltalake.DeltaTable(changelog).file_uris())
        assert before >= 3
        with rt.state.tailer_lock("a-running-tailer"):
            code, _, err = run(capsys, "-c", str(cfg), "maintain")
        assert code == 2 and "a-running-tailer" in err and "maintain_every_s" in err
    code, out, err = run(capsys, "-c", str(cfg), "maintain", "--vacuum")
    assert code == 0, err
    assert f"changelog {before} -> 1 files" in out, out
    log = deltalake.DeltaTable(changelog)
    assert len(log.file_uris()) == 1
    assert sorted(r["id"] for r in log.to_pyarrow_table().column("after").to_pylist()) == [
        1, 2, 11, 12, 21, 22]

    # A tailer compacts between batches every tail.maintain_every_s.
    raw = yaml.safe_load(cfg.read_text())
    raw["tail"]["maintain_every_s"] = 0.001
    cfg.write_text(yaml.safe_dump(raw, allow_unicode=True))
    insert_and_tail(31)  # its batch adds a second file; the compaction after it leaves one
    conn.close()
    assert len(deltalake.DeltaTable(changelog).file_uris()) == 1
    code, out, err = run(capsys, "-c", str(cfg), "verify")
    assert code == 0, out + err
