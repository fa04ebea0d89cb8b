"""Captures against the real services: every capture ends (its upper bound is fixed when it
starts, even while rows keep arriving at the end of the key space), and chunks continue from
their last key in the database's own order and time zone (TIMESTAMP keys east of UTC,
case-insensitive VARCHAR, ENUM, SET, TIME and wide DECIMAL keys)."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from dblog.app.config import parse_config
from dblog.app.runtime import Runtime, open_runtime
from dblog.capture import (
    CaptureRequest,
    RangeReport,
    bounds_path,
    read_summary,
    summary_frame,
)
from dblog.core.events import TableId, key_from_json
from dblog.lake.chunks import PARTITION_SHIFT
from dblog.sources.base import Column, TableSchema
from dblog.tail import chunk_path
from dblog.tail.background import BackgroundTailer
from devtools.sample import config_dict, connect, q
from devtools.services import Endpoints
from tests.integration.helpers import make_db, wait_for_a_held_chunk
from tests.integration.oracle import verify_table
from tests.integration.sources import MariaDbKit, SourceKit

pytestmark = pytest.mark.integration


@contextmanager
def runtime(ep: Endpoints, tmp_path: Path, db: str, tables: list[str], *, server_id: int,
            chunk_size: int, max_in_flight: int = 4, kit: SourceKit | None = None,
            capture: dict[str, Any] | None = None,
            ) -> Iterator[tuple[Runtime, BackgroundTailer]]:
    """A runtime of ``tables`` of ``db`` (on ``kit``'s database; MariaDB without one) with
    its tailer running in the background; ``capture``: more capture settings."""
    options: dict[str, Any] = {"chunk_size": chunk_size, "max_in_flight": max_in_flight,
                               "batch_seconds": 1.0, "poll_seconds": 0.2}
    source = f"cb-{uuid.uuid4().hex[:8]}"
    if kit is None:
        data = config_dict(source=source, ep=ep, tables=[f"{db}.{t}" for t in tables],
                           lake=tmp_path / "lake", server_id=server_id, **options)
    else:
        data = kit.config_data(source=source, db=db, tables=[f"{db}.{t}" for t in tables],
                               lake=tmp_path / "lake", **options)
    data["capture"].update(capture or {})
    try:
        with open_runtime(parse_config(data)) as rt:
            bg = BackgroundTailer(rt.tailer()).start()
            try:
                rt.wait_started(bg.check)
                yield rt, bg
            finally:
                bg.stop()
                if kit is not None:
                    rt.state.delete("", recursive=True)
    finally:
        if kit is not None:
            kit.forget(source)


def capture_within(rt: Runtime, bg: BackgroundTailer, tables: list[TableId],
                   deadline_s: float) -> list[RangeReport]:
    """Run a capture, its ranges in parallel; fail (after stopping it) if it does not end in
    time."""
    capturer = rt.capturer()
    capturer.health_check = bg.check
    capture_id = capturer.plan(CaptureRequest(tuple(tables)))
    stop = threading.Event()
    result: list[RangeReport] = []
    failure: list[BaseException] = []
    latest: dict[str, RangeReport] = {}

    def main(range_id: str) -> None:
        try:
            result.append(capturer.run_range(
                capture_id, range_id, stop=stop,
                on_progress=lambda r: latest.__setitem__(r.range_id, replace(r)),
            ))
        except BaseException as exc:  # surfaced below
            failure.append(exc)

    threads = [threading.Thread(target=main, args=(range_id,), name=f"capture-{range_id}",
                                daemon=True)
               for range_id in rt.state.list_ranges(capture_id)]
    for thread in threads:
        thread.start()
    ends = time.monotonic() + deadline_s
    for thread in threads:
        thread.join(max(0.0, ends - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        stop.set()
        for thread in threads:
            thread.join(120)
        windows = [(w.value.status, w.value.detail) for w in rt.state.list_windows()]
        pytest.fail(f"the capture did not end within {deadline_s:.0f}s: "
                    f"{list(latest.values())}, open windows {windows[:5]}")
    if failure:
        raise failure[0]
    assert [r.status for r in result] == ["done"] * len(threads), result
    return result


def capture_counts(rt: Runtime, table: TableId, key: list[str]) -> dict[tuple[Any, ...], int]:
    """How often each key appears among the changelog's capture rows (``op = 'r'``), keys as
    text; compared inside Spark (TIMESTAMP as epoch microseconds: no local-time conversion)."""
    frame = rt.spark.read.format("delta").load(rt.layout.changelog(table))
    after = frame.schema["after"].dataType
    cols = []
    for k in key:
        col = F.col("after").getField(k)
        if isinstance(after[k].dataType, TimestampType):
            col = F.unix_micros(col)
        cols.append(col.cast("string").alias(k))
    rows = frame.where(F.col("op") == "r").groupBy(*cols).count().collect()
    return {tuple(r[k] for k in key): int(r["count"]) for r in rows}


def source_keys(ep: Endpoints, db: str, table: str, key: list[str],
                timestamps: tuple[str, ...]) -> set[tuple[Any, ...]]:
    """The source's keys as text (TIMESTAMP columns as epoch microseconds)."""
    conn = connect(ep, db)
    with conn.cursor() as cur:
        exprs = ", ".join(
            f"CAST(UNIX_TIMESTAMP({q(k)}) * 1000000 AS SIGNED)" if k in timestamps
            else f"CAST({q(k)} AS CHAR)"
            for k in key
        )
        cur.execute(f"SELECT {exprs} FROM {q(table)}")  # noqa: S608 - quoted identifiers
        rows = cur.fetchall()
    conn.close()
    return {tuple(str(v) for v in r) for r in rows}


def assert_captured_once(rt: Runtime, ep: Endpoints, db: str, table: str, key: list[str],
                         timestamps: tuple[str, ...] = ()) -> None:
    """Without concurrent writes, every source row is a capture row exactly once."""
    counts = capture_counts(rt, TableId(db, table), key)
    expected = source_keys(ep, db, table, key, timestamps)
    twice = {k: n for k, n in counts.items() if n != 1}
    missing = expected - counts.keys()
    extra = counts.keys() - expected
    assert not (twice or missing or extra), (
        f"{table}: captured more than once {sorted(twice.items())[:5]}, never captured "
        f"{sorted(missing)[:5]}, unknown {sorted(extra)[:5]}"
    )


def id_table(kit: SourceKit, rows: int) -> str:
    """A new schema with ``t (id BIGINT PRIMARY KEY, v INT)`` holding ids 1..rows."""
    db = f"cb_{uuid.uuid4().hex[:8]}"
    kit.run_sql(db, *kit_ddl(kit, db, "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v INT NOT NULL)"))
    if rows:
        conn = kit.connect()
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {kit.qualified(db, 't')} VALUES (%s, %s)",  # noqa: S608
                            [(i, i) for i in range(1, rows + 1)])
        conn.close()
    return db


def kit_ddl(kit: SourceKit, db: str, create: str) -> list[str]:
    """The schema ``db`` and one table ``t`` made by ``create`` (full row images)."""
    if kit.kind == "postgres":
        return [f'CREATE SCHEMA "{db}"', create, "ALTER TABLE {t} REPLICA IDENTITY FULL"]
    return [f"CREATE DATABASE `{db}`", create]


def assert_mirror_equals_source(rt: Runtime, table: TableId) -> None:
    report = verify_table(rt.dialect, rt.sink, table)
    assert report.ok, report.summary()


class Inserter:
    """Inserts increasing ids at the end of the key space as fast as it can (a few rows per
    statement), and updates random existing rows now and then."""

    def __init__(self, kit: SourceKit, db: str, table: str, first_id: int,
                 existing: int) -> None:
        self.kit, self.qualified = kit, kit.qualified(db, table)
        self.next_id = first_id
        self.existing = existing
        self.inserted = 0
        self.updated = 0
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inserter", daemon=True)

    def start(self) -> Inserter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        rng = random.Random(7)
        try:
            conn = self.kit.connect()
            table = self.qualified
            with conn.cursor() as cur:
                while not self._stop.is_set():
                    rows = [(self.next_id + i, rng.randrange(10**6)) for i in range(5)]
                    cur.executemany(
                        f"INSERT INTO {table} (id, v) VALUES (%s, %s)", rows  # noqa: S608
                    )
                    self.next_id += len(rows)
                    self.inserted += len(rows)
                    if self.existing and rng.random() < 0.3:
                        cur.execute(
                            f"UPDATE {table} SET v = v + 1 WHERE id = %s",  # noqa: S608
                            (rng.randrange(1, self.existing + 1),),
                        )
                        self.updated += 1
                    time.sleep(0.05)  # the tail must keep up on a busy 2-core machine
            conn.close()
        except BaseException as exc:  # surfaced by stop()
            self._error = exc


# ---- 1. every capture ends -----------------------------------------------------------------


@pytest.mark.timeout(1800)
def test_capture_ends_while_rows_keep_arriving_at_the_end_of_the_key_space(
    source_kit: SourceKit, tmp_path: Path
) -> None:
    db = id_table(source_kit, 1000)
    table = TableId(db, "t")
    try:
        with runtime(source_kit.ep, tmp_path, db, ["t"], server_id=7601, chunk_size=100,
                     max_in_flight=8, kit=source_kit) as (rt, bg):
            writer = Inserter(source_kit, db, "t", first_id=1001, existing=1000).start()
            try:
                time.sleep(2.0)  # the writer is well ahead when the capture starts
                reports = capture_within(rt, bg, [table], deadline_s=900)
            finally:
                writer.stop()
            assert writer.inserted > 500, f"the writer barely ran ({writer.inserted} rows)"
            # The range's upper bound was fixed once, below keys the writer went on to
            # insert; the capture's chunks walked up to it and read past it once (that read
            # has no upper limit: what arrived up there is current at its high watermark),
            # never chasing the new end chunk by chunk.
            report = reports[0]
            note = rt.state.get(bounds_path(report.capture_id, report.range_id))
            assert note is not None and not note.value["empty"], note
            (bound,) = key_from_json(note.value["upper"]) or (None,)
            assert isinstance(bound, int) and bound < writer.next_id - 1, (bound, writer.next_id)
            assert report.chunks <= bound // 100 + 2, (report, bound)
            rt.wait_caught_up(bg.check, timeout=600)
            assert_mirror_equals_source(rt, table)
    finally:
        source_kit.drop(db)


def test_capture_of_an_empty_table_ends_while_rows_arrive(
    source_kit: SourceKit, tmp_path: Path
) -> None:
    """The table is empty when the capture fixes its range's upper bound; rows arrive from
    then on. The range ends with one chunk; the log brings the rest."""
    db = id_table(source_kit, 0)
    table = TableId(db, "t")
    try:
        with runtime(source_kit.ep, tmp_path, db, ["t"], server_id=7602, chunk_size=20,
                     kit=source_kit) as (rt, bg):
            _empty_table_capture(rt, bg, source_kit, db, table)
            assert_mirror_equals_source(rt, table)
    finally:
        source_kit.drop(db)


def _empty_table_capture(rt: Runtime, bg: BackgroundTailer, kit: SourceKit, db: str,
                         table: TableId) -> None:
    writer = Inserter(kit, db, "t", first_id=1, existing=0)
    started: list[bool] = []

    def start_writer_once_the_bound_is_fixed() -> None:
        ends = time.monotonic() + 300
        while time.monotonic() < ends:
            for capture in rt.state.list_captures():
                cid = capture.value.capture_id
                if any(rt.state.get(bounds_path(cid, rid)) is not None
                       for rid in rt.state.list_ranges(cid)):
                    writer.start()
                    started.append(True)
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=start_writer_once_the_bound_is_fixed, daemon=True)
    watcher.start()
    try:
        reports = capture_within(rt, bg, [table], deadline_s=300)
        time.sleep(3.0)  # rows keep arriving after the capture
    finally:
        watcher.join(310)
        if started:
            writer.stop()
    assert started, "the capture never fixed its range's upper bound"
    assert reports[0].chunks == 1, reports
    assert writer.inserted > 20, f"the writer barely ran ({writer.inserted} rows)"
    rt.wait_caught_up(bg.check, timeout=600)


# ---- 2. TIMESTAMP keys and the host's time zone ---------------------------------------------


@contextmanager
def host_time_zone(zone: str) -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


@pytest.mark.parametrize(("zone", "server_id"), [("Asia/Tokyo", 7603),
                                                 ("America/Los_Angeles", 7606)])
def test_timestamp_keys_are_captured_once_whatever_the_host_time_zone(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zone: str,
    server_id: int,
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = make_db(services, prefix="cb", ddl=[
        "CREATE TABLE {db}.ts (t TIMESTAMP(6) NOT NULL PRIMARY KEY, v INT NOT NULL)",
    ])
    conn = connect(services, db)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        # 300 rows 37 minutes 0.000123 s apart: chunks of 40 span ~25 hours
        cur.executemany(
            "INSERT INTO ts VALUES (TIMESTAMP'2024-03-01 00:00:00' + INTERVAL %s MICROSECOND,"
            " %s)",
            [(i * (37 * 60 * 10**6 + 123), i) for i in range(300)],
        )
    conn.close()
    table = TableId(db, "ts")
    with host_time_zone(zone):
        with runtime(services, tmp_path, db, ["ts"], server_id=server_id,
                     chunk_size=40) as (rt, bg):
            capture_within(rt, bg, [table], deadline_s=300)
            rt.wait_caught_up(bg.check)
    assert_captured_once(rt, services, db, "ts", ["t"], timestamps=("t",))
    assert_mirror_equals_source(rt, table)


# ---- 3. the last key in the database's order ------------------------------------------------


KEY_TABLES = {
    "ci": ("CREATE TABLE {db}.ci (k VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY,"
           " v INT NOT NULL) DEFAULT CHARSET=utf8mb4", ["k"]),
    "en": ("CREATE TABLE {db}.en (e ENUM('zeta','alpha','mid','beta','omega') NOT NULL,"
           " n INT NOT NULL, v INT NOT NULL, PRIMARY KEY (e, n))", ["e", "n"]),
    "st": ("CREATE TABLE {db}.st (s SET('z','a','m') NOT NULL, n INT NOT NULL,"
           " v INT NOT NULL, PRIMARY KEY (s, n))", ["s", "n"]),
    "tm": ("CREATE TABLE {db}.tm (t TIME(3) NOT NULL PRIMARY KEY, v INT NOT NULL)", ["t"]),
    "dc": ("CREATE TABLE {db}.dc (d DECIMAL(50,0) NOT NULL PRIMARY KEY, v INT NOT NULL)",
           ["d"]),
}


def fill_key_tables(ep: Endpoints, db: str) -> None:
    conn = connect(ep, db)
    with conn.cursor() as cur:
        # Alternating case: the database orders a1, B2, c3, ... (case-insensitively).
        cur.executemany("INSERT INTO ci VALUES (%s, %s)", [
            (f"{'abcdefgh'[i % 8]}{i:03d}".upper() if i % 2 else f"{'abcdefgh'[i % 8]}{i:03d}", i)
            for i in range(100)
        ])
        members = ["zeta", "alpha", "mid", "beta", "omega"]
        cur.executemany("INSERT INTO en VALUES (%s, %s, %s)",
                        [(m, n, n) for m in members for n in range(20)])
        sets = ["", "z", "a", "z,a", "m", "z,m", "a,m", "z,a,m"]
        cur.executemany("INSERT INTO st VALUES (%s, %s, %s)",
                        [(s, n, n) for s in sets for n in range(12)])
        cur.executemany(
            "INSERT INTO tm VALUES (SEC_TO_TIME(%s), %s)",
            [((i - 50) * 12671.125, i) for i in range(100)],  # -176h .. +176h
        )
        cur.executemany("INSERT INTO dc VALUES (%s, %s)",
                        [(str(10**45 + i * 10**30 + i), i) for i in range(0, 100, 2)]
                        + [(str(i * 7), i) for i in range(50)])
    conn.close()


def test_chunks_continue_from_the_last_key_in_the_databases_order(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = make_db(services, prefix="cb", ddl=[ddl for ddl, _ in KEY_TABLES.values()])
    fill_key_tables(services, db)
    tables = [TableId(db, name) for name in KEY_TABLES]
    with runtime(services, tmp_path, db, list(KEY_TABLES), server_id=7604,
                 chunk_size=30) as (rt, bg):
        capture_within(rt, bg, tables, deadline_s=600)
        rt.wait_caught_up(bg.check)
    problems = []
    for name, (_, key) in KEY_TABLES.items():
        try:
            assert_captured_once(rt, services, db, name, key)
            assert_mirror_equals_source(rt, TableId(db, name))
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)



def test_a_planned_chunks_summary_counts_its_rows_without_sorting_them(spark: Any) -> None:
    # Two read partitions of a composite (string, int) key, tagged in read order.
    schema = TableSchema(TableId("db", "t"), (
        Column("k", "STRING", False, "varchar(10)"), Column("n", "BIGINT", False, "int"),
        Column("v", "STRING", True, "varchar(10)")), ("k", "n"))
    rows = [(f"k{i // 10}", i % 10, "x") for i in range(50)]
    tagged = (spark.createDataFrame(rows, "k STRING, n BIGINT, v STRING").repartition(2)
              .withColumn("_o", F.monotonically_increasing_id()).localCheckpoint())
    parts = {int(r[0]): int(r[1]) for r in tagged.groupBy(
        F.shiftright("_o", PARTITION_SHIFT)).count().collect()}
    last = tuple(tagged.orderBy(F.desc("_o")).select("k", "n").first() or ())

    assert read_summary(tagged, schema, "_o") == (50, last, parts)
    assert read_summary(tagged, schema, "_o", with_last=False) == (50, None, parts)
    # The last row's key is a struct: Spark sorts every row to aggregate it. A planned
    # chunk (the capture's hot path) does without it, in a hash aggregation.
    plan = summary_frame(tagged, schema, "_o", with_last=False)._jdf.queryExecution()
    assert "Sort" not in plan.executedPlan().toString()
    plan = summary_frame(tagged, schema, "_o", with_last=True)._jdf.queryExecution()
    assert "Sort" in plan.executedPlan().toString()  # what the hot path avoids


# ---- 4. chunk coverage for deletes ------------------------------------------------------------


def _small_table(services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
                 rows: int, server_id: int) -> tuple[TableId, Any]:
    """A new database's table ``t (id INT PRIMARY KEY, v INT)`` holding ids 1..rows, and a
    configuration of it with 25-row chunks (its password in the environment)."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = make_db(services, prefix="cb",
                 ddl=["CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT NOT NULL)"])
    conn = connect(services, db)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s)", [(i, i) for i in range(1, rows + 1)])
    conn.close()
    return TableId(db, "t"), parse_config(config_dict(
        source=f"cb-{uuid.uuid4().hex[:8]}", ep=services, tables=[f"{db}.t"],
        lake=tmp_path / "lake", server_id=server_id, chunk_size=25,
    ))


def test_chunk_documents_name_the_key_range_their_select_read_completely(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The note a capture writes before a chunk's high watermark says which keys the select
    read completely (the tailer deletes mirror keys of that range the select did not return):
    up to the last key of a full chunk, up to the range's upper bound of a short one, and
    nothing for a filtered capture."""
    table, config = _small_table(services, tmp_path, monkeypatch, rows=40, server_id=7607)
    with open_runtime(config) as rt:
        capturer = rt.capturer()
        schema = rt.dialect.table_schema(table)

        def note(request: CaptureRequest, after: Any, upper: Any) -> dict[str, Any]:
            capture_id = capturer.plan(request)
            range_id = next(iter(rt.state.list_ranges(capture_id)))
            held, rows, _, _ = capturer._chunk(capture_id, range_id, table, schema, after,
                                               upper, request.keys, request.where, 25)
            found = rt.state.get(chunk_path(held.window_id))
            assert found is not None
            return {**found.value, "rows": rows}

        full = note(CaptureRequest((table,)), None, (40,))
        assert (full["rows"], full["final"]) == (25, False)
        assert full["delete_range"] == {"after": None, "through": [25]}
        short = note(CaptureRequest((table,)), (25,), (40,))
        assert (short["rows"], short["final"], short["last_key"]) == (15, True, [40])
        assert short["delete_range"] == {"after": [25], "through": [40]}
        assert note(CaptureRequest((table,), where="v > 3"), None, (40,))["delete_range"] is None
        assert note(CaptureRequest((table,), keys=((2,), (3,))), None, None)["delete_range"] \
            is None


def test_a_ranges_last_planned_chunk_reads_on_past_its_fixed_bound_in_the_same_window(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range whose upper bound was fixed from "open" ends with a read past that bound
    (rows inserted up there since the bound was fixed). When a planned chunk reaches the
    bound, that read is part of it: the chunk reads on to the key space's end and ends the
    range, so a table smaller than a chunk is captured in one window, not two."""
    # 40 rows when the bound was fixed at 40, 5 inserted since
    table, config = _small_table(services, tmp_path, monkeypatch, rows=45, server_id=7608)
    with open_runtime(config) as rt:
        capturer = rt.capturer()
        schema = rt.dialect.table_schema(table)
        capture_id = capturer.plan(CaptureRequest((table,)))
        range_id = next(iter(rt.state.list_ranges(capture_id)))

        def note(after: Any, limit: int) -> tuple[dict[str, Any], int, Any, bool]:
            held, rows, last, reached_end = capturer._chunk(
                capture_id, range_id, table, schema, after, (40,), None, None, limit,
                not_final=True)
            found = rt.state.get(chunk_path(held.window_id))
            assert found is not None
            return found.value, rows, last, reached_end

        # A chunk that stops short of the bound reads its planned extent only.
        doc, rows, last, reached_end = note(None, 25)
        assert (rows, last, reached_end, doc["final"]) == (25, (25,), False, False)
        assert doc["delete_range"] == {"after": None, "through": [25]}
        # One that reaches it reads on past it, ends the range, and proves every key above
        # ``after`` that it did not return gone.
        doc, rows, last, reached_end = note((25,), 25)
        assert (rows, last, reached_end, doc["final"]) == (20, (40,), True, True)
        assert doc["delete_range"] == {"after": [25], "through": None}
        doc, rows, last, reached_end = note(None, 100)
        assert (rows, reached_end, doc["final"]) == (45, True, True)
        assert doc["delete_range"] == {"after": None, "through": None}
        rt.state.delete("", recursive=True)

    with runtime(services, tmp_path / "whole", table.database, ["t"], server_id=7609,
                 chunk_size=100) as (rt, bg):
        reports = capture_within(rt, bg, [table], deadline_s=300)
        assert (reports[0].chunks, reports[0].rows_selected) == (1, 45), reports
        rt.wait_caught_up(bg.check)
        assert_captured_once(rt, services, table.database, "t", ["id"])
        assert_mirror_equals_source(rt, table)


def test_a_stopped_capture_stops_waiting_for_its_windows_and_a_rerun_finishes_it(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no tailer emitting, a stop ends the capture at once (its windows stay open, not
    for ``emission_timeout_s``); the next run settles them and finishes."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    db = id_table(MariaDbKit(services), 300)
    table = TableId(db, "t")
    with runtime(services, tmp_path, db, ["t"], server_id=7608, chunk_size=50,
                 max_in_flight=2) as (rt, bg):
        bg.stop()  # a position is committed; nothing emits from now on
        capturer = rt.capturer()
        capture_id = capturer.plan(CaptureRequest((table,)))
        stop = threading.Event()
        stopped_at: list[float] = []

        def stop_once_windows_wait() -> None:
            wait_for_a_held_chunk(rt)
            time.sleep(1.0)
            stopped_at.append(time.monotonic())
            stop.set()

        stopper = threading.Thread(target=stop_once_windows_wait, daemon=True)
        stopper.start()
        reports = capturer.run(capture_id, stop=stop)
        stopper.join(130)
        stopped_after = time.monotonic() - stopped_at[0]
        assert [r.status for r in reports] == ["stopped"], reports
        assert stopped_after < 10, f"the capture returned {stopped_after:.0f}s after its stop"
        assert any(w.value.status == "registered" for w in rt.state.list_windows())

        with BackgroundTailer(rt.tailer()) as again:
            capturer = rt.capturer()
            capturer.health_check = again.check
            reports = capturer.run(capture_id, stop=threading.Event())
            assert [r.status for r in reports] == ["done"], reports
            rt.wait_caught_up(again.check)
        assert_mirror_equals_source(rt, table)


def test_a_throttled_capture_reads_no_faster_than_its_rate(
    services: Endpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``capture.max_rows_per_s``: chunks of at most ``chunk_target_seconds`` of the rate's
    rows (one second here), under one limit
    for all captures of the process: when another capture has just read five seconds'
    worth, the next chunk waits for it. The mirror still equals the source."""
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    rate, total = 200, 600
    db = id_table(MariaDbKit(services), total)
    table = TableId(db, "t")
    try:
        with runtime(services, tmp_path, db, ["t"], server_id=7609, chunk_size=100_000,
                     max_in_flight=1,
                     capture={"max_rows_per_s": rate, "chunk_target_seconds": 1}) as (rt, bg):
            capturer, other = rt.capturer(), rt.capturer()
            assert capturer.read_rate is not None and capturer.read_rate is other.read_rate
            capturer.health_check = bg.check
            capture_id = capturer.plan(CaptureRequest((table,)))
            seen: list[tuple[float, int]] = []

            def progress(report: RangeReport) -> None:
                # One chunk in flight: called once a chunk is emitted, before the next.
                seen.append((time.monotonic(), report.rows_selected))
                if len(seen) == 1 and other.read_rate is not None:
                    other.read_rate.charge(5 * rate)

            reports = capturer.run(capture_id, on_progress=progress)
            assert [r.status for r in reports] == ["done"], reports
            assert reports[0].rows_selected == total
            assert reports[0].chunks >= total // rate, reports
            assert seen[0][1] == rate, seen
            assert seen[1][0] - seen[0][0] >= 4, seen
            rt.wait_caught_up(bg.check, timeout=300)
            assert_mirror_equals_source(rt, table)
    finally:
        MariaDbKit(services).drop(db)
