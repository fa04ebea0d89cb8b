"""PostgreSQL as a source (issue 9), against the real local PostgreSQL 15.

What only PostgreSQL has: its types, identifiers, TOAST, replica identity, slot and
publication. The randomized concurrent-write and crash tests run for PostgreSQL as part of
the contract suite (``source_kit``).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.errors import ConfigError, LogPurgedError, SourceError
from dblog.core.events import TableId
from dblog.sources.base import ChunkSpec
from dblog.tail.background import BackgroundTailer
from devtools.services import Endpoints
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table
from tests.integration.pg import (
    PG_DATABASE,
    drop_replication,
    dropped_after,
    pg_config,
    pg_connect,
    pg_execute,
    pg_rows,
)
from tests.integration.test_end_to_end import run_with_deadline

pytestmark = pytest.mark.integration

KEYS = {"accounts": ("id",), "orders": ("region", "order_no")}


@pytest.fixture
def pg_env(services: Endpoints, monkeypatch: pytest.MonkeyPatch) -> Endpoints:
    monkeypatch.setenv("DBLOG_PG_PASSWORD", services.pg_password)
    return services


def test_types_hostile_names_and_toast_through_capture_and_tail(
        pg_env: Endpoints, spark: Any, tmp_path: Path) -> None:
    """Every documented type, NULLs, and a schema, table and columns named with mixed case,
    spaces and quotes: captured, then changed through the log (a TOASTed value left
    unchanged by an update included), and the mirror equals the source."""
    schema, table = 'Odd "Schema"', 'My Table "x"'
    qs, qt = '"Odd ""Schema"""', '"My Table ""x"""'
    qual = f"{qs}.{qt}"
    pg_execute(
        pg_env,
        "DO $$ BEGIN CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
        " EXCEPTION WHEN duplicate_object THEN NULL; END $$",
        f"DROP SCHEMA IF EXISTS {qs} CASCADE", f"CREATE SCHEMA {qs}",
        f'CREATE TABLE {qual} ("Id" int PRIMARY KEY, "a b" smallint, c bigint,'
        ' "n""q" numeric(12,3), un numeric, r real, d double precision, ok boolean,'
        " t text, v varchar(10), ch char(4), by bytea, day date, tm time, ts timestamp,"
        " tz timestamptz, iv interval, u uuid, j json, jb jsonb, arr int[], tarr text[],"
        " m mood, big text, narr numeric(6,2)[], tzarr timestamptz[], darr date[],"
        " barr boolean[], byarr bytea[], uarr uuid[], farr double precision[],"
        " earr bigint[], marr mood[], ivarr interval[])",
        f"ALTER TABLE {qual} REPLICA IDENTITY FULL",
        f"INSERT INTO {qual} VALUES (1, -3, 9007199254740993, -12.345, 'NaN', 'Infinity',"
        " 'NaN', true, 'ünï ✓', 'vv', 'ab', '\\x00ff', '2024-02-29', '12:34:56.789',"
        " '2024-01-02 03:04:05.678901', '2024-01-02 03:04:05+02', '1 year 2 days 00:00:01',"
        " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"k\": [1, 2]}', '{\"k\": [1, 2]}',"
        " '{1,NULL,3}', '{\"x y\",z,NULL,\"NULL\",\"\",\"q\\\"b\\\\\"}', 'happy',"
        " repeat('B', 20000), '{1.5,NULL,-2}', '{\"2024-01-02 03:04:05.5+02\",NULL}',"
        " '{2024-02-29}', '{t,f,NULL}', '{\"\\\\x00ff\",NULL}',"
        " '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '{1.5,NaN,-Infinity}', '{}',"
        " '{ok,sad}', '{\"1 day\"}')",
        f"INSERT INTO {qual} (\"Id\") VALUES (2)",
    )
    tid = TableId(schema, table)
    name = f"pgtypes-{uuid.uuid4().hex[:6]}"
    config = pg_config(pg_env, name=name, tables=[f"{schema}.{table}"], lake=tmp_path / "lake")
    try:
        with open_runtime(config, spark=spark) as rt:
            bg = BackgroundTailer(rt.tailer()).start()
            try:
                rt.wait_started(bg.check)
                capturer = rt.capturer()
                capturer.health_check = bg.check
                reports = run_with_deadline(capturer, capturer.plan(CaptureRequest((tid,))), 300)
                assert [r.status for r in reports] == ["done"]
                pg_execute(
                    pg_env,
                    f"UPDATE {qual} SET c = c + 1 WHERE \"Id\" = 1",  # big: unchanged TOAST
                    f"INSERT INTO {qual} SELECT 3, \"a b\", c, \"n\"\"q\", un, r, d, ok, t, v,"
                    f" ch, by, day, tm, ts, tz, iv, u, j, jb, arr, tarr, m, big, narr, tzarr,"
                    f" darr, barr, byarr, uarr, farr, earr, marr, ivarr FROM {qual}"
                    " WHERE \"Id\" = 1",
                    f"UPDATE {qual} SET \"Id\" = 4 WHERE \"Id\" = 2",
                )
                rt.wait_caught_up(bg.check)
            finally:
                bg.stop()
            report = verify_table(rt.dialect, rt.sink, tid)
            assert report.ok, report.summary() + _lake_account(spark, rt, tid)
            # The database's checksums (a repair's comparison) agree on every type.
            from dblog.app.compare import compare_ranges
            from dblog.core.chunking import KeyRange

            compared = compare_ranges(rt, tid, {"low": KeyRange(None, (1,)),
                                                "rest": KeyRange((1,), None)},
                                      wait_for_tailer=False)
            assert [(c.source_rows, c.equal) for c in compared] == [(1, True), (2, True)]
            mirror = {r["Id"]: r.asDict() for r in spark.read.format("delta")
                      .load(rt.layout.mirror(tid)).collect()}
            assert sorted(mirror) == [1, 3, 4]
            row = mirror[3]
            assert row["big"] == "B" * 20000  # the unchanged TOASTed value, filled in
            assert row["un"] == "NaN" and row["r"] == float("inf")
            assert row["d"] != row["d"]  # NaN kept
            assert row["iv"] == "P1Y2DT1S" and row["tm"] == "12:34:56.789"
            assert row["arr"] == [1, None, 3] and row["m"] == "happy" and row["ch"] == "ab  "
            assert row["tarr"] == ["x y", "z", None, "NULL", "", 'q"b\\']
            assert row["narr"] == [Decimal("1.50"), None, Decimal("-2.00")]
            assert row["tzarr"] == [dt.datetime(2024, 1, 2, 1, 4, 5, 500000), None]
            assert row["darr"] == [dt.date(2024, 2, 29)] and row["barr"] == [True, False, None]
            assert row["byarr"] == [b"\x00\xff", None] and row["earr"] == []
            assert row["uarr"] == ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]
            assert row["farr"][0] == 1.5 and row["farr"][2] == float("-inf")
            assert row["marr"] == "{ok,sad}" and row["ivarr"] == ["P1D"]
            assert mirror[1] == {**row, "Id": 1} | {
                k: mirror[1][k] for k in ("farr", "d", "_dblog_lsn", "_dblog_seq")}
            assert row["by"] == b"\x00\xff" and row["t"] == "ünï ✓"
            assert str(row["n\"q"]) == "-12.345" and row["c"] == 9007199254740994
            assert mirror[4]["t"] is None
            rt.state.delete("", recursive=True)
    finally:
        drop_replication(pg_env, name)
        pg_execute(pg_env, f"DROP SCHEMA IF EXISTS {qs} CASCADE")


def test_bad_input_is_refused_clearly(pg_env: Endpoints, spark: Any, tmp_path: Path) -> None:
    schema = f"bad_pg_{uuid.uuid4().hex[:6]}"
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f'CREATE TABLE "{schema}".nokey (a int)',
               f'CREATE TABLE "{schema}".partial (id int PRIMARY KEY, v text)',
               f'CREATE TABLE "{schema}".good (id int PRIMARY KEY, v text)',
               f'ALTER TABLE "{schema}".good REPLICA IDENTITY FULL',
               f'CREATE TABLE "{schema}".arrkey (k int[] PRIMARY KEY)',
               f'ALTER TABLE "{schema}".arrkey REPLICA IDENTITY FULL',
               f'CREATE TABLE "{schema}".shape (id int PRIMARY KEY, a int[])',
               f'ALTER TABLE "{schema}".shape REPLICA IDENTITY FULL',
               f"""INSERT INTO "{schema}".shape VALUES (1, '{{{{1,2}},{{3,4}}}}')""")
    names: list[str] = []

    def config(table: str) -> Any:
        names.append(f"pgbad-{uuid.uuid4().hex[:6]}")
        return pg_config(pg_env, name=names[-1], tables=[f"{schema}.{table}"],
                         lake=tmp_path / names[-1])

    try:
        with pytest.raises(SourceError, match="no primary key"), \
                open_runtime(config("nokey"), spark=spark):
            pass
        with pytest.raises(SourceError, match="REPLICA IDENTITY FULL"), \
                open_runtime(config("partial"), spark=spark):
            pass
        with pytest.raises(SourceError, match="not found"), \
                open_runtime(config("missing"), spark=spark):
            pass
        with pytest.raises(SourceError, match=r"array columns \['k'\] in its primary key"), \
                open_runtime(config("arrkey"), spark=spark):
            pass
        # An array the lake's ARRAY cannot hold stops a capture and the tailer, column named.
        with open_runtime(config("shape"), spark=spark) as rt:
            shape = TableId(schema, "shape")
            chunk = rt.dialect.read_chunk(spark, ChunkSpec(shape, 10),
                                          rt.dialect.table_schema(shape))
            with pytest.raises(Exception, match=r'column "a" holds an array that is not one-d'):
                chunk.collect()
            log = rt.dialect.open_log(rt.dialect.head_position(), [shape])
            try:
                pg_execute(pg_env, f"""INSERT INTO "{schema}".shape VALUES (2, '[0:1]={{5,6}}')""")
                with pytest.raises(SourceError, match=r"shape column 'a': an array with explicit"
                                   r" bounds \[0:1\] cannot be held by the lake's ARRAY<INT>"):
                    for _ in range(20):
                        log.read(max_transactions=10, max_wait_s=0.5)
            finally:
                log.close()
        good = config("good")
        with open_runtime(good, spark=spark) as rt:
            start = rt.dialect.head_position()
            first = rt.dialect.open_log(start, [TableId(schema, "good")])
            second = rt.dialect.open_log(start, [TableId(schema, "good")])
            try:
                first.read(max_transactions=1, max_wait_s=0.5)
                with pytest.raises(SourceError, match="in use by another consumer"):
                    second.read(max_transactions=1, max_wait_s=0.5)
            finally:
                first.close()
                second.close()
            drop_replication(pg_env, names[-1])
            with pytest.raises(LogPurgedError, match="does not exist"):
                rt.dialect.open_log(start, [TableId(schema, "good")])
            # The slot made again (the next start): a position of the old one is refused.
            rt.dialect.ensure_watermark_table()
            with pytest.raises(LogPurgedError, match="earlier replication slot"):
                rt.dialect.open_log(start, [TableId(schema, "good")])
            with pytest.raises(LogPurgedError, match="older than replication slot"):
                rt.dialect.open_log({"lsn": 16}, [TableId(schema, "good")])
        with pytest.raises(ConfigError, match="source.database"):
            from dblog.app.config import parse_config

            parse_config({"source": {"name": "x", "kind": "postgres", "host": "h", "port": 1,
                                     "user": "u", "password_env": "P"},
                          "tables": ["a.b"]})
    finally:
        for name in names:
            drop_replication(pg_env, name)
        pg_execute(pg_env, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_an_idle_tailer_lets_the_slot_release_wal(pg_env: Endpoints, spark: Any,
                                                  tmp_path: Path) -> None:
    """With nothing to capture but WAL written elsewhere, the slot's confirmed position
    follows the server (it never keeps WAL forever)."""
    schema = f"idle_pg_{uuid.uuid4().hex[:6]}"
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f'CREATE TABLE "{schema}".quiet (id int PRIMARY KEY)',
               f'ALTER TABLE "{schema}".quiet REPLICA IDENTITY FULL',
               f'CREATE TABLE "{schema}".busy (id int PRIMARY KEY, v text)')
    name = f"pgidle-{uuid.uuid4().hex[:6]}"
    config = pg_config(pg_env, name=name, tables=[f"{schema}.quiet"], lake=tmp_path / "lake")
    from dblog.sources.postgres.connection import default_slot

    with dropped_after(pg_env, schema, name):
        with open_runtime(config, spark=spark) as rt:
            bg = BackgroundTailer(rt.tailer()).start()
            try:
                rt.wait_started(bg.check)
                pg_execute(pg_env, f'INSERT INTO "{schema}".busy SELECT i, repeat(\'w\', 100)'
                                   " FROM generate_series(1, 5000) i")
                head = int(rt.dialect.head_position()["lsn"])
                conn = pg_connect(pg_env)
                deadline = time.monotonic() + 60
                confirmed = 0
                try:
                    while time.monotonic() < deadline and confirmed < head:
                        bg.check()
                        with conn.cursor() as cur:
                            cur.execute("SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint"
                                        " FROM pg_replication_slots WHERE slot_name = %s",
                                        (default_slot(name),))
                            confirmed = int(cur.fetchone()[0])
                        time.sleep(0.5)
                finally:
                    conn.close()
                assert confirmed >= head, "the idle tailer never confirmed the WAL past it"
            finally:
                bg.stop()
            rt.state.delete("", recursive=True)


def _slot_confirmed(ep: Endpoints, slot: str) -> int:
    conn = pg_connect(ep)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint"
                        " FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def test_a_keepalive_inside_a_long_transaction_never_confirms_unwritten_changes(
        pg_env: Endpoints) -> None:
    """The slot is confirmed only where the tailer said (what the lake holds). A long
    transaction T changed a captured table before the confirmed position, then many rows
    of a table that is not captured; another transaction X2 committed after that position
    and was read, not confirmed. T commits: while the server skips T's other rows, its
    keepalives reach the reader between T's changes (a 2 s ``wal_sender_timeout`` asks for
    one a second after the last reply). psycopg2 confirmed such a keepalive's position by
    itself (its last message, T's change, started before the confirmed position): past X2,
    which a restart would then never read again."""
    import dataclasses

    from dblog.sources.postgres import PostgresDialect, PostgresSettings
    from dblog.sources.postgres.connection import default_slot

    @dataclasses.dataclass(frozen=True)
    class QuickKeepalives(PostgresSettings):
        def options(self) -> str:
            return super().options() + " -c wal_sender_timeout=2000"

    name = f"pgka-{uuid.uuid4().hex[:6]}"
    schema = f"ka_pg_{uuid.uuid4().hex[:6]}"
    table = TableId(schema, "t")
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, v text)',
               f'ALTER TABLE "{schema}".t REPLICA IDENTITY FULL',
               f'CREATE TABLE "{schema}".other (id int, v text)')
    dialect = PostgresDialect(QuickKeepalives(
        name=name, host=pg_env.host, port=pg_env.pg_port, user=pg_env.user,
        database=PG_DATABASE, password=pg_env.pg_password, tables=(table,),
        status_interval_s=10.0))  # the reader's own reports come rarer than the requests
    long_tx = pg_connect(pg_env, autocommit=False)
    reader: Any = None

    def read_until(wanted: int) -> Any:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for tx in reader.read(max_transactions=1, max_wait_s=0.5):
                if len(tx.items) == wanted:
                    return tx
        raise AssertionError(f"no transaction of {wanted} changes was read")

    try:
        dialect.ensure_watermark_table()
        with long_tx.cursor() as cur:  # T's changes lie before everything below
            cur.execute(f"INSERT INTO \"{schema}\".t VALUES (1, 't')")
            cur.execute(f'INSERT INTO "{schema}".other SELECT i, \'o\' FROM'
                        " generate_series(1, 1000000) i")
        # Opened after T's changes (a stream left unread for two seconds times out); T
        # commits after the start, so it is read.
        reader = dialect.open_log(dialect.head_position(), [table])
        pg_execute(pg_env, f'INSERT INTO "{schema}".t VALUES (-1, \'x1\')')
        x1 = read_until(1)
        reader.confirm(x1.resume)  # the lake holds X1
        pg_execute(pg_env, f'INSERT INTO "{schema}".t VALUES (-2, \'x2\')')
        x2 = read_until(1)  # read, never confirmed
        long_tx.commit()
        read_until(1)
        for _ in range(6):  # feedback goes out meanwhile (every status interval)
            reader.read(max_transactions=1, max_wait_s=0.5)
        confirmed = _slot_confirmed(pg_env, default_slot(name))
        assert confirmed == x1.resume["lsn"], (
            f"the slot was confirmed at {confirmed} (X2 ends at {x2.resume['lsn']}), "
            f"though the reader was told {x1.resume['lsn']}")
        assert reader.keepalives_in_transactions > 0  # the case this test is about
    finally:
        long_tx.close()
        if reader is not None:
            reader.close()
        dialect.close()
        drop_replication(pg_env, name)
        pg_execute(pg_env, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

def test_a_transaction_in_the_wal_but_not_visible_yet_is_not_overwritten_by_a_chunk(
        pg_env: Endpoints, spark: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit record reaches the WAL (and the log reader) before the transaction becomes
    visible: with a synchronous standby configured, a commit waits for it in between. Here
    the standby (``ghost``) never answers, so an application transaction T that updates a
    row and inserts one hangs there: decoded before the chunk's low watermark, invisible to
    a select after it. The chunk must not overwrite T's update with the old value nor
    delete T's insert. dblog's own sessions run with ``synchronous_commit = on`` (the
    server's default here is off): its watermark writes must not hang on the standby."""
    import threading

    from dblog.sources.postgres.connection import PostgresSettings
    from tests.integration.helpers import wait_for

    with_sync_commit = PostgresSettings.options
    monkeypatch.setattr(PostgresSettings, "options",
                        lambda self: with_sync_commit(self) + " -c synchronous_commit=on")
    schema = f"vis_pg_{uuid.uuid4().hex[:6]}"
    qual = f'"{schema}".t'
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f"CREATE TABLE {qual} (id int PRIMARY KEY, v text)",
               f"ALTER TABLE {qual} REPLICA IDENTITY FULL",
               f"INSERT INTO {qual} SELECT i, 'old' FROM generate_series(1, 10) i",
               f'CREATE TABLE "{schema}".probe (n int)')
    name = f"pgvis-{uuid.uuid4().hex[:6]}"
    config = pg_config(pg_env, name=name, tables=[f"{schema}.t"], lake=tmp_path / "lake")
    table = TableId(schema, "t")
    admin = pg_connect(pg_env)
    app = pg_connect(pg_env, autocommit=False)

    def run(conn: Any, sql: str, *args: Any) -> list[Any]:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall()) if cur.description else []

    def server_standby(names: str | None) -> None:
        if names is None:
            run(admin, "ALTER SYSTEM RESET synchronous_standby_names")
        else:
            run(admin, "ALTER SYSTEM SET synchronous_standby_names = %s", names)
        run(admin, "SELECT pg_reload_conf()")

    def waiting_for_the_standby(pid: int) -> bool:
        return bool(run(admin, "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
                               " AND wait_event = 'SyncRep'", pid))

    def commit_waiting_for_the_standby(conn: Any, pid: int) -> threading.Thread | None:
        """Commit ``conn`` (synchronous_commit on) in a thread; returns it once the commit
        waits for the standby, or None if it committed (the setting not in force yet)."""
        committing = threading.Thread(target=conn.commit, daemon=True)
        committing.start()
        deadline = time.monotonic() + 2
        while committing.is_alive() and time.monotonic() < deadline:
            if waiting_for_the_standby(pid):
                return committing
            time.sleep(0.02)
        committing.join(30)
        assert not committing.is_alive(), "a commit hung, not waiting for the standby"
        return None

    def require_the_standby() -> None:
        """The ghost standby in force: reloaded until a probe's commit waits for it (the
        checkpointer applies the setting a moment after the reload)."""
        server_standby("ghost")
        probe = pg_connect(pg_env, autocommit=False)
        try:
            pid = int(run(probe, "SELECT pg_backend_pid()")[0][0])
            run(probe, "SET synchronous_commit = on")
            for _ in range(50):
                run(probe, f'INSERT INTO "{schema}".probe VALUES (1)')
                waiting = commit_waiting_for_the_standby(probe, pid)
                if waiting is not None:
                    run(admin, "SELECT pg_cancel_backend(%s)", pid)  # committed locally
                    waiting.join(30)
                    return
                run(admin, "SELECT pg_reload_conf()")
            raise AssertionError("commits never waited for the ghost standby")
        finally:
            probe.close()

    def chunk_selected_or_waiting(earlier: set[str]) -> bool:
        """A new chunk was selected (its rows are held), or the capture polls for T."""
        return bool(set(held_chunks()) - earlier) or bool(run(
            admin, "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                   " AND query LIKE '%%dblog: the chunk select waits%%'", f"dblog-{name}"))

    app_pid = int(run(app, "SELECT pg_backend_pid()")[0][0])
    app.commit()
    try:
        with dropped_after(pg_env, schema, name), open_runtime(config, spark=spark) as rt:

            def held_chunks() -> list[str]:
                from dblog.state.handoff import chunk_path

                return [w.value.window.window_id for w in rt.state.list_windows()
                        if rt.state.get(chunk_path(w.value.window.window_id)) is not None]

            with BackgroundTailer(rt.tailer()) as bg:
                rt.wait_started(bg.check)
                capturer = rt.capturer()
                capturer.health_check = bg.check
                # A first capture warms Spark up: the standby is required only for the
                # seconds the second one needs to reach its select.
                first = run_with_deadline(capturer, capturer.plan(CaptureRequest((table,))), 300)
                assert [r.status for r in first] == ["done"]
                earlier = {w.value.window.window_id for w in rt.state.list_windows()}
                reports: list[Any] = []
                capturing = threading.Thread(target=lambda: reports.extend(capturer.run(
                    capturer.plan(CaptureRequest((table,))))), daemon=True)
                try:
                    require_the_standby()
                    run(app, "SET synchronous_commit = on")
                    run(app, f"UPDATE {qual} SET v = 'new' WHERE id = 5")
                    run(app, f"INSERT INTO {qual} VALUES (11, 'new')")
                    committing = commit_waiting_for_the_standby(app, app_pid)
                    assert committing is not None, "T did not wait for the standby"
                    capturing.start()
                    wait_for("the chunk's select, or its wait for T",
                             lambda: chunk_selected_or_waiting(earlier), timeout=60, poll=0.05)
                    run(admin, "SELECT pg_cancel_backend(%s)", app_pid)  # T commits locally
                    committing.join(30)
                    assert not committing.is_alive()
                finally:
                    server_standby(None)  # at once: the services are shared
                capturing.join(240)
                assert [r.status for r in reports] == ["done"]
                rt.wait_caught_up(bg.check)
            assert pg_rows(pg_env, qual, ("id",))[(5,)]["v"] == "new"
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary() + _lake_account(spark, rt, table)
            rt.state.delete("", recursive=True)
    finally:
        server_standby(None)
        app.close()
        admin.close()


def test_ddl_and_truncate_while_the_tailer_is_behind(pg_env: Endpoints, spark: Any,
                                                     tmp_path: Path) -> None:
    """ADD / DROP / ALTER TYPE and TRUNCATE: events decode with the columns they were
    written with (the log's relation messages), the Delta tables evolve, a TRUNCATE empties
    the mirror at its position, and after a capture mirror and replay equal the source."""
    schema = f"ddl_pg_{uuid.uuid4().hex[:6]}"
    items = f'"{schema}".items'
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f"CREATE TABLE {items} (id int PRIMARY KEY, a int, b varchar(20))",
               f"ALTER TABLE {items} REPLICA IDENTITY FULL")
    name = f"pgddl-{uuid.uuid4().hex[:6]}"
    config = pg_config(pg_env, name=name, tables=[f"{schema}.items"], lake=tmp_path / "lake")
    table = TableId(schema, "items")
    with dropped_after(pg_env, schema, name):
        with open_runtime(config, spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)  # the position starts here, before any row
            pg_execute(
                pg_env,
                f"INSERT INTO {items} SELECT i, i * 10, 'b' || i FROM generate_series(1, 300) i",
                f"ALTER TABLE {items} ADD COLUMN c numeric(10,2) DEFAULT 1.50",
                f"UPDATE {items} SET c = id / 4.0 WHERE id % 3 = 0",
                f"ALTER TABLE {items} DROP COLUMN b",
                f"INSERT INTO {items} (id, a, c) SELECT i, -i, NULL"
                " FROM generate_series(301, 350) i",
                f"ALTER TABLE {items} ALTER COLUMN a TYPE bigint",
                f"UPDATE {items} SET a = a * 1099511627776 WHERE id % 5 = 0",
                f"DELETE FROM {items} WHERE id % 7 = 0",
            )
            rt.tailer().run(until_caught_up=True)
            lake_types = {c.name: c.spark_type for c in rt.sink.known_columns(table)}
            assert lake_types == {"id": "INT", "a": "BIGINT", "b": "STRING",
                                  "c": "DECIMAL(10,2)"}
            with BackgroundTailer(rt.tailer()) as bg:
                capturer = rt.capturer()
                capturer.health_check = bg.check
                reports = capturer.run(capturer.plan(CaptureRequest((table,))))
            assert [r.status for r in reports] == ["done"]
            assert sum(r.rows_emitted for r in reports) == 350 - 50
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary()
            frame = check_table(spark, pg_env, schema, "items", ("id",),
                                rt.layout.changelog(table),
                                expected_rows=pg_rows(pg_env, items, ("id",)))
            early = frame[(frame["op"] == "c")].sort_values("_dblog_lsn").iloc[0]["after"]
            assert early["b"] == "b1" and early["c"] is None
            # TRUNCATE in the log empties the lake table at its position.
            pg_execute(pg_env, f"TRUNCATE {items}",
                       f"INSERT INTO {items} (id, a) VALUES (1, 1), (2, 2)")
            rt.tailer().run(until_caught_up=True)
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary()
            frame = check_table(spark, pg_env, schema, "items", ("id",),
                                rt.layout.changelog(table),
                                expected_rows=pg_rows(pg_env, items, ("id",)))
            assert (frame["op"] == "t").sum() == 1
            rt.state.delete("", recursive=True)


def test_a_role_without_replication_and_a_foreign_publication_are_refused(
        pg_env: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = f"priv_pg_{uuid.uuid4().hex[:6]}"
    role = f"norepl_{uuid.uuid4().hex[:6]}"
    publication = f"theirs_{uuid.uuid4().hex[:6]}"
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f'CREATE TABLE "{schema}".good (id int PRIMARY KEY, v text)',
               f'CREATE TABLE "{schema}".other (id int PRIMARY KEY)',
               f'ALTER TABLE "{schema}".good REPLICA IDENTITY FULL',
               f"CREATE ROLE {role} LOGIN PASSWORD 'x-{role}'",
               f'GRANT USAGE ON SCHEMA "{schema}" TO {role}',
               f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO {role}',
               f'CREATE PUBLICATION {publication} FOR TABLE "{schema}".other')
    names: list[str] = []
    try:
        monkeypatch.setenv("DBLOG_PG_PASSWORD", f"x-{role}")
        names.append(f"pgpriv-{uuid.uuid4().hex[:6]}")
        config = pg_config(pg_env, name=names[-1], tables=[f"{schema}.good"],
                           lake=tmp_path / "a", source={"user": role})
        with pytest.raises(SourceError, match=f"role '{role}' lacks the REPLICATION"), \
                open_runtime(config, spark=spark):
            pass
        monkeypatch.setenv("DBLOG_PG_PASSWORD", pg_env.pg_password)
        names.append(f"pgpub-{uuid.uuid4().hex[:6]}")
        config = pg_config(pg_env, name=names[-1], tables=[f"{schema}.good"],
                           lake=tmp_path / "b", source={"publication": publication})
        with pytest.raises(SourceError, match=f"publication '{publication}' .* lacks"), \
                open_runtime(config, spark=spark):
            pass
    finally:
        for name in names:
            drop_replication(pg_env, name)
        pg_execute(pg_env, f"DROP PUBLICATION IF EXISTS {publication}",
                   f'DROP SCHEMA IF EXISTS "{schema}" CASCADE', f"DROP ROLE IF EXISTS {role}")


def _lake_account(spark: Any, rt: Any, table: TableId) -> str:
    """What a failing comparison needs: the committed and merged positions, the changelog's
    rows by position, and the mirror's commits."""
    from delta.tables import DeltaTable

    lines = [f"\nposition: {rt.state.get_position()}", f"mirror doc: {rt.state.get('mirror')}",
             f"head: {rt.dialect.head_position()}"]
    changelog = spark.read.format("delta").load(rt.layout.changelog(table))
    for row in changelog.select("op", "_dblog_lsn", "_dblog_seq", "_dblog_batch",
                                "_dblog_window_id").orderBy("_dblog_lsn", "_dblog_seq").collect():
        lines.append(f"changelog: {tuple(row)}")
    history = DeltaTable.forPath(spark, rt.layout.mirror(table)).history()
    for row in history.select("version", "operation", "userMetadata").collect():
        lines.append(f"mirror commit: {tuple(row)}")
    return "\n".join(lines)


def test_the_head_includes_every_committed_transaction(pg_env: Endpoints) -> None:
    """With ``synchronous_commit = off`` (the local server's setting) a commit record may not
    be written when the commit returns: the head must still lie past it, or a tailer would
    be called caught up before it read the transaction (this failed with the write
    position, ``pg_current_wal_lsn()``)."""
    from dblog.sources.postgres import PostgresDialect, PostgresSettings

    name = f"pghead-{uuid.uuid4().hex[:6]}"
    schema = f"head_pg_{uuid.uuid4().hex[:6]}"
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f'CREATE TABLE "{schema}".t (id int PRIMARY KEY)',
               f'ALTER TABLE "{schema}".t REPLICA IDENTITY FULL')
    dialect = PostgresDialect(PostgresSettings(
        name=name, host=pg_env.host, port=pg_env.pg_port, user=pg_env.user,
        database=PG_DATABASE, password=pg_env.pg_password, tables=(TableId(schema, "t"),)))
    conn = pg_connect(pg_env)
    try:
        dialect.ensure_watermark_table()
        late = 0
        with conn.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
            for i in range(50):
                cur.execute(f'INSERT INTO "{schema}".t VALUES (%s)', (i,))
                cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
                insert = int(cur.fetchone()[0])
                # At a page's start the insert position lies past the page header (24
                # bytes, 40 on a 16 MiB segment's first page): the commit ended before it.
                header = (40 if insert % (16 * 2**20) == 40 else
                          24 if insert % 8192 == 24 else 0)
                committed_by = insert - header
                late += dialect.head_position()["lsn"] < committed_by
        assert late == 0, f"the head lay before {late} of 50 just committed transactions"
    finally:
        conn.close()
        dialect.close()
        drop_replication(pg_env, name)
        pg_execute(pg_env, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


KEY_TABLES = {
    # ICU orders a000, B001, c002, ... case-insensitively; byte order puts capitals first.
    "ci": ('k text COLLATE "en-x-icu" PRIMARY KEY',
           "SELECT CASE WHEN i % 2 = 1 THEN upper(chr(97 + i % 8)) ELSE chr(97 + i % 8) END"
           " || lpad(i::text, 3, '0') || CASE WHEN i % 10 = 0 THEN 'é' ELSE '' END"
           " FROM generate_series(0, 59) i", ["k"]),
    "uu": ("k uuid PRIMARY KEY",
           "SELECT md5(i::text)::uuid FROM generate_series(1, 60) i", ["k"]),
    # Unconstrained numeric (a STRING in the lake): text order is not numeric order.
    "nm": ("k numeric PRIMARY KEY",
           "SELECT (i - 30) * 10.0 ^ (i % 7 * 5) / 3 FROM generate_series(0, 59) i", ["k"]),
    "tz": ("k timestamptz PRIMARY KEY",
           "SELECT timestamptz '2024-03-01 00:00:00+00' + i * interval '37 min 0.000123 s'"
           " FROM generate_series(0, 59) i", ["k"]),
    # char(5): trailing blanks are insignificant, inner ones are not.
    "ch": ("k char(5) PRIMARY KEY",
           "SELECT DISTINCT rtrim(substr('ab  c!' || chr(65 + i % 26), 1 + i % 4, 1 + i % 4))"
           " || chr(97 + i % 3) FROM generate_series(0, 59) i", ["k"]),
    "en": ("e order_mood NOT NULL, n int, PRIMARY KEY (e, n)",
           "SELECT (ARRAY['zeta', 'alpha', 'mid'])[1 + i % 3]::order_mood, i"
           " FROM generate_series(0, 53) i", ["e", "n"]),
    "tm": ("k time(3) PRIMARY KEY",
           "SELECT time '00:00' + i * interval '14 min 23.125 s' FROM generate_series(0, 59) i",
           ["k"]),
    "by": ("k bytea PRIMARY KEY",
           "SELECT DISTINCT decode(md5(i::text), 'hex') FROM generate_series(1, 60) i", ["k"]),
}


def test_chunks_continue_from_the_last_key_in_the_databases_order(
        pg_env: Endpoints, spark: Any, tmp_path: Path) -> None:
    """Keys whose order or literal form is the database's own (an ICU collation, uuid,
    unconstrained numeric, timestamptz east of UTC, char(n), an enum, time, bytea): small
    chunks continue exactly after the previous chunk's last key, so every row is captured
    once and the mirror equals the source."""
    from pyspark.sql import functions as F

    from tests.integration.test_capture_bounds import host_time_zone

    schema = f"keys_pg_{uuid.uuid4().hex[:6]}"
    qs = f'"{schema}"'
    statements = [f"CREATE SCHEMA {qs}", f"CREATE TYPE {qs}.order_mood AS ENUM"
                  " ('zeta', 'alpha', 'mid')", f"SET search_path = {qs}"]
    for name, (columns, rows, _) in KEY_TABLES.items():
        statements += [f"CREATE TABLE {qs}.{name} ({columns}, v serial)",
                       f"ALTER TABLE {qs}.{name} REPLICA IDENTITY FULL",
                       f"INSERT INTO {qs}.{name} ({', '.join(KEY_TABLES[name][2])}) {rows}"]
    pg_execute(pg_env, *statements)
    source = f"pgkeys-{uuid.uuid4().hex[:6]}"
    tables = [TableId(schema, name) for name in KEY_TABLES]
    config = pg_config(pg_env, name=source, tables=[f"{schema}.{n}" for n in KEY_TABLES],
                       lake=tmp_path / "lake", chunk_size=25)
    try:
        with host_time_zone("Asia/Tokyo"), open_runtime(config, spark=spark) as rt:
            with BackgroundTailer(rt.tailer()) as bg:
                rt.wait_started(bg.check)
                capturer = rt.capturer()
                capturer.health_check = bg.check
                reports = run_with_deadline(capturer, capturer.plan(CaptureRequest(
                    tuple(tables))), 600)
                assert [r.status for r in reports] == ["done"] * len(tables), reports
                rt.wait_caught_up(bg.check)
            problems = []
            for table in tables:
                key = KEY_TABLES[table.table][2]
                expected = len(pg_rows(pg_env, f"{qs}.{table.table}", tuple(key)))
                captured = (spark.read.format("delta").load(rt.layout.changelog(table))
                            .where(F.col("op") == "r")
                            .select(*(F.col("after").getField(k).alias(k) for k in key)))
                total, distinct = captured.count(), captured.distinct().count()
                if (total, distinct) != (expected, expected):
                    problems.append(f"{table.table}: {total} capture rows, {distinct} keys, "
                                    f"{expected} source rows")
                report = verify_table(rt.dialect, rt.sink, table)
                if not report.ok:
                    problems.append(report.summary())
            assert not problems, "\n".join(problems)
            rt.state.delete("", recursive=True)
    finally:
        drop_replication(pg_env, source)
        pg_execute(pg_env, f"DROP SCHEMA IF EXISTS {qs} CASCADE")


def test_an_idle_tailer_is_caught_up_after_a_wal_segment_switch(
        pg_env: Endpoints, spark: Any, tmp_path: Path) -> None:
    """After ``pg_switch_wal()`` the insert position lies past the new segment's page
    header, where no record ends: the head must be the segment's start, or a tailer of an
    idle database would never be called caught up."""
    schema = f"switch_pg_{uuid.uuid4().hex[:6]}"
    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"',
               f'CREATE TABLE "{schema}".t (id int PRIMARY KEY)',
               f'ALTER TABLE "{schema}".t REPLICA IDENTITY FULL')
    name = f"pgswitch-{uuid.uuid4().hex[:6]}"
    config = pg_config(pg_env, name=name, tables=[f"{schema}.t"], lake=tmp_path / "lake")
    with dropped_after(pg_env, schema, name):
        with open_runtime(config, spark=spark) as rt:
            with BackgroundTailer(rt.tailer()) as bg:
                rt.wait_started(bg.check)
                # The server writes records of its own now and then (a snapshot of running
                # transactions every 15 s after activity, with wal_level=logical): one
                # landing between the switch and the read moves the head past the page
                # header, so the switch is made again until the read meets the case.
                heads = []
                for row in range(1, 6):
                    pg_execute(pg_env, f'INSERT INTO "{schema}".t VALUES ({row})',
                               "SELECT pg_switch_wal()")
                    heads.append(rt.dialect.head_position())
                    if heads[-1]["lsn"] % (16 * 2**20) == 0:  # the local server's segments
                        break
                else:
                    raise AssertionError(f"no head at a segment's start after a switch: {heads}")
                # A termination check, not a speed one: a cold JVM creates the lake tables
                # and merges the mirror first.
                rt.wait_caught_up(bg.check, timeout=120)
            rt.state.delete("", recursive=True)


def test_a_dropped_and_recreated_table_is_reset_and_flagged_for_a_capture(
        pg_env: Endpoints, spark: Any, tmp_path: Path) -> None:
    """PostgreSQL drops a table from its publications without a word in the log, and the
    table made again under its name is in none. Whether the tailer runs or not when that
    happens, the table is published again, the lake table is emptied at that point of the
    log, and the rows written before it are healed: the tailer captures the table again
    (``tail.heal: capture``, the default), and ``dblog status`` advises a capture until
    that is done."""
    from rich.console import Console

    from dblog.app.status import render_status

    schema = f"drop_pg_{uuid.uuid4().hex[:6]}"
    qt = f'"{schema}".t'
    create = [f"CREATE TABLE {qt} (id int PRIMARY KEY, v int)",
              f"ALTER TABLE {qt} REPLICA IDENTITY FULL"]

    def recreate(row: int) -> None:  # one transaction: the check sees all of it or none
        pg_execute(pg_env, "BEGIN", f"DROP TABLE {qt}", *create,
                   f"INSERT INTO {qt} VALUES ({row}, {row})", "COMMIT")

    pg_execute(pg_env, f'CREATE SCHEMA "{schema}"', *create,
               f"INSERT INTO {qt} SELECT i, i FROM generate_series(1, 3) i")
    name = f"pgdrop-{uuid.uuid4().hex[:6]}"
    config = pg_config(pg_env, name=name, tables=[f"{schema}.t"], lake=tmp_path / "lake")
    table = TableId(schema, "t")

    def status(rt: Any) -> str:
        console = Console(width=200, record=True)
        render_status(rt, console)
        return console.export_text()

    def lake(rt: Any) -> tuple[set[int], int]:
        mirror = {r["id"] for r in spark.read.format("delta").load(rt.layout.mirror(table))
                  .collect()}
        resets = (spark.read.format("delta").load(rt.layout.changelog(table))
                  .where("op = 't'").count())
        return mirror, resets

    def capture(rt: Any, bg: BackgroundTailer) -> None:
        capturer = rt.capturer()
        capturer.health_check = bg.check
        assert [r.status for r in capturer.run(capturer.plan(CaptureRequest((table,))))] \
            == ["done"]
        rt.wait_caught_up(bg.check)

    with dropped_after(pg_env, schema, name):
        with open_runtime(config, spark=spark) as rt:
            with BackgroundTailer(rt.tailer()) as bg:
                rt.wait_started(bg.check)
                capture(rt, bg)
                # Dropped and made again while the tailer runs; row 10 lands before dblog
                # publishes the new table, row 11 after.
                recreate(10)
                deadline = time.monotonic() + 60
                while lake(rt)[1] < 1:
                    bg.check()
                    assert time.monotonic() < deadline, "the dropped table was never reset"
                    time.sleep(0.5)
                pg_execute(pg_env, f"INSERT INTO {qt} VALUES (11, 11)")
                deadline = time.monotonic() + 240
                while lake(rt) != ({10, 11}, 1):  # row 10 came back with the heal
                    bg.check()
                    assert time.monotonic() < deadline, f"never healed: {lake(rt)}"
                    time.sleep(1.0)
                rt.wait_caught_up(bg.check)
            report = verify_table(rt.dialect, rt.sink, table)
            assert report.ok, report.summary()
            assert "repair advised" not in status(rt)
        # Dropped and made again while nothing runs: the next start resets and heals it.
        recreate(20)
        with open_runtime(config, spark=spark) as rt:
            rt.tailer().run(until_caught_up=True)
            assert lake(rt) == ({20}, 2)
            assert "repair advised" not in status(rt)
            rt.state.delete("", recursive=True)


def test_a_lost_wal_stream_that_cannot_reconnect_stops_with_a_clear_error(
        pg_env: Endpoints, spark: Any, tmp_path: Path) -> None:
    """The reader reconnects a lost stream at its last commit (``test_log_connection.py``)
    for ``RECONNECT_S``; a server that stays unreachable then ends it with a clear error."""
    import dataclasses

    from dblog.core.errors import SourceUnavailable
    from dblog.sources.postgres import wal
    from tests.integration.sources import PostgresKit

    pg = PostgresKit(pg_env)
    schema = pg.simple_table("walgone", 0)
    table = TableId(schema, "t")
    with pg.cleaned(schema, "walgone") as name:
        config = pg_config(pg_env, name=name, tables=[f"{schema}.t"], lake=tmp_path / "lake")
        with open_runtime(config, spark=spark) as rt:
            reader = rt.dialect.open_log(rt.dialect.head_position(), [table])
            try:
                reader.read(max_transactions=1, max_wait_s=0.2)  # streaming
                settings = reader._settings  # noqa: SLF001 - the server "moves away"
                reader._settings = dataclasses.replace(settings, port=1)  # noqa: SLF001
                assert pg.end_log_streams(name) == 1
                began = time.monotonic()
                with pytest.raises(SourceUnavailable, match="cannot reach PostgreSQL"), \
                        pytest.MonkeyPatch.context() as patch:
                    patch.setattr(wal, "RECONNECT_S", 2.0)
                    while time.monotonic() - began < 30:
                        reader.read(max_transactions=1, max_wait_s=0.2)
                assert 2.0 <= time.monotonic() - began < 10
            finally:
                reader.close()
            rt.state.delete("", recursive=True)


def test_a_server_without_logical_wal_is_refused_with_the_settings_to_change(
        pg_env: Endpoints, tmp_path: Path) -> None:
    """A second, throwaway PostgreSQL 15 server with ``wal_level = replica`` and no
    replication slots: the source refuses it, naming each setting and its fix."""
    import os
    import shutil
    import socket
    import subprocess
    import tempfile

    from dblog.app.config import parse_config
    from dblog.app.runtime import make_dialect
    from devtools.services import PG_BIN
    from tests.integration.sources import PostgresKit

    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="dblog-pg-replica-"))
    if os.geteuid() == 0:
        shutil.chown(home, "postgres", "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = home / "data"

    def run(*argv: str) -> None:
        done = subprocess.run([*as_postgres, *argv], capture_output=True, text=True,
                              check=False, timeout=120)
        assert done.returncode == 0, done.stderr

    try:
        run(str(PG_BIN / "initdb"), "-D", str(data), "-U", pg_env.user, "-A", "trust",
            "-E", "UTF8", "--locale=C.UTF-8")
        run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(home / "log"), "-w", "-o",
            f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c wal_level=replica"
            " -c max_replication_slots=0 -c max_wal_senders=0", "start")
        data_cfg = PostgresKit(pg_env).config_data(source="replica", db="public",
                                                   lake=tmp_path / "lake", tables=["public.t"])
        data_cfg["source"]["port"] = port
        dialect = make_dialect(parse_config(data_cfg))
        try:
            with pytest.raises(SourceError) as refused:
                dialect.validate()
        finally:
            dialect.close()
        message = str(refused.value)
        assert "wal_level is 'replica': set wal_level = logical" in message
        assert "max_replication_slots is 0" in message
    finally:
        subprocess.run([*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m",
                        "immediate", "stop"], capture_output=True, check=False, timeout=60)
        shutil.rmtree(home, ignore_errors=True)
