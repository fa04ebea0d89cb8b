"""Repair dumps: per-range count + checksum computed on the database and on the mirror agree
for every column type; a damaged mirror (a changed row, a lost row, a row the source no
longer has) is found range by range while writers run, only those ranges are captured, and
the mirror equals the source again. Part of the contract suite: it runs for every source
database."""

from __future__ import annotations

import math
import queue
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from delta.tables import DeltaTable
from pyspark.sql import Column
from pyspark.sql import functions as F

from dblog.app.cli import main
from dblog.app.compare import compare_ranges, row_text
from dblog.app.config import RepairConfig, load_config
from dblog.app.repair import Repairer, repair_table, table_walk
from dblog.app.rolling import Place, place_path
from dblog.app.runtime import Runtime, open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from dblog.core.ranges import key_ranges, plan_more
from dblog.sources.checksum import NAN_BITS
from dblog.sources.mysql import checksum as mysql_checksum
from dblog.sources.postgres import checksum as postgres_checksum
from dblog.tail.background import BackgroundTailer
from devtools.services import Endpoints
from tests.integration.checks import check_table
from tests.integration.oracle import verify_table
from tests.integration.sources import SourceKit, kit

pytestmark = pytest.mark.integration


def ranges_of(rt: Runtime, table: TableId, rows: int) -> dict[str, Any]:
    names = plan_more([], lambda after, off: rt.dialect.key_after(table, after, off), rows)
    return key_ranges(names, names)


def test_checksums_agree_then_damage_is_found_and_repaired_by_range(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    db = source_kit.create("repair", accounts=600, orders=200, seed=9)
    with source_kit.cleaned(db, "repair") as source:
        typed_name = source_kit.create_typed(db)
        _damage_found_and_repaired(source_kit, spark, tmp_path, db, typed_name, source)


def _damage_found_and_repaired(source_kit: SourceKit, spark: Any, tmp_path: Path, db: str,
                               typed_name: str, source: str) -> None:
    path = source_kit.config(tmp_path / "dblog.yaml", source=source, db=db,
                             lake=tmp_path / "lake", chunk_size=600, batch_seconds=0.5,
                             chunk_max_rows=2000,
                             tables=[f"{db}.accounts", f"{db}.{typed_name}"])
    accounts, typed = TableId(db, "accounts"), TableId(db, typed_name)
    with open_runtime(load_config(path), spark=spark) as rt:
        with BackgroundTailer(rt.tailer()) as bg:
            rt.wait_started(bg.check)
            capturer = rt.capturer()
            capturer.health_check = bg.check
            done = capturer.run(capturer.plan(CaptureRequest((accounts, typed))))
            assert [r.status for r in done] == ["done", "done"]
            rt.wait_caught_up(bg.check)

            # Every column type renders the same on both sides: nothing differs.
            clean = repair_table(rt, typed, ranges_of(rt, typed, 2))
            assert clean.ranges_checked == 2 and not clean.suspects, clean

            # Damage the mirror behind the tailer's back, in ranges 0, 2 and 4 of 200 rows.
            mirror = DeltaTable.forPath(spark, rt.layout.mirror(accounts))
            mirror.update(F.col("id") == 10, {"name": F.lit("tampered")})
            mirror.delete(F.col("id") == 450)
            extra = (spark.read.format("delta").load(rt.layout.mirror(accounts))
                     .where(F.col("id") == 1).withColumn("id", F.col("id") + 4999))
            extra.write.format("delta").mode("append").save(rt.layout.mirror(accounts))
            ranges = ranges_of(rt, accounts, 200)
            names = list(ranges)
            assert len(names) == 3  # (start, 200], (200, 400], (400, open)
            workload = source_kit.workload(db, 9, pause_s=0.05, reserve_every=10)
            try:
                report = repair_table(rt, accounts, ranges, health_check=bg.check)
            finally:
                workload.stop()
            assert report.ranges_checked == 3
            differing = {c.name for c in report.differing}
            assert {names[0], names[2]} <= differing, report
            assert set(report.repaired) == differing
            rt.wait_caught_up(bg.check)
            # A repair compares at a log position the tailer must reach: it runs beside one.
            again = repair_table(rt, accounts, ranges_of(rt, accounts, 200),
                                 health_check=bg.check)
            assert not again.differing, again
        assert verify_table(rt.dialect, rt.sink, accounts).ok
        check_table(spark, source_kit.ep, db, "accounts", ("id",),
                    rt.layout.changelog(accounts), expected_rows=source_kit.rows(db, "accounts"))
        rt.state.delete("", recursive=True)


# ---- FLOAT and DOUBLE values: checksummed by their bits -----------------------------------

FLT_MAX = 3.4028234663852886e38


def float32(value: float) -> float | None:
    """``value`` rounded to the nearest float32; None beyond the float32 range."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return None


def float32_after(value: float, up: bool) -> float:
    """The float32 next to the float32 ``value``, towards +inf (``up``) or -inf."""
    if value == 0:
        return 1.401298464324817e-45 * (1 if up else -1)
    bits = struct.unpack("<I", struct.pack("<f", value))[0] + (1 if (value > 0) == up else -1)
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def tricky_doubles(seed: int) -> list[float]:
    """Finite doubles that a text form could confuse, each with both neighbours, both
    signs, distinct bits."""
    listed = [0.0, 5e-324, 1e-323, math.nextafter(2.2250738585072014e-308, 0.0),
              2.2250738585072014e-308, sys.float_info.max, FLT_MAX, 1.401298464324817e-45,
              1.1754943508222875e-38, 1e15, 1e16, 1e17, 1e21, 1e22, 1e23, 0.1, 0.2, 0.3,
              0.30000000000000004, 1 / 3, 2 / 3, 2.0**53, 2.0**53 + 2, 2.0**63, 2.0**64,
              123456789012345678.0, 9007199254740993.0, 1e-5, 1e-7, 0.5, 1.0, 1.5, 2.0, 100.0,
              1234567.0, 16777217.0, math.pi, math.e, 1e308, 1e-308]
    listed += [2.0**k for k in range(-1074, 1024, 41)]
    rng = random.Random(seed)
    while len(listed) < 260:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            listed.append(value)
    found: dict[bytes, float] = {}
    for v in listed:
        for near in (v, math.nextafter(v, math.inf), math.nextafter(v, -math.inf)):
            for signed in (near, -near):
                if math.isfinite(signed):
                    found.setdefault(struct.pack("<d", signed), signed)
    return list(found.values())


def tricky_floats(doubles: list[float]) -> list[float]:
    """The float32 roundings of ``doubles``, with their float32 neighbours, distinct bits."""
    found: dict[bytes, float] = {}
    for v in doubles:
        f = float32(v)
        if f is None:
            continue
        for near in (f, float32_after(f, True), float32_after(f, False)):
            if math.isfinite(near):
                found.setdefault(struct.pack("<d", near), near)
    return list(found.values())


def bits_text(value: float | None) -> str:
    """A value's piece of the row text, by the checksum's contract (sources.checksum)."""
    if value is None:
        return "N"
    return "V16:" + (NAN_BITS if math.isnan(value) else struct.pack(">d", value).hex().upper())


def array_text(values: list[float | None] | None) -> str:
    if values is None:
        return "N"
    inner = ",".join(bits_text(v) for v in values)
    return f"V{len(inner)}:{inner}"


def pg_float(value: float | None) -> str | None:
    """A float as PostgreSQL reads it exactly (text cast: -0 and NaN kept)."""
    if value is None:
        return None
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def pg_array(values: list[float | None] | None) -> str | None:
    if values is None:
        return None
    return "{" + ",".join("NULL" if v is None else str(pg_float(v)) for v in values) + "}"


FloatRow = tuple[int, float, float | None, list[float | None] | None, list[float | None]]
"""id, d (DOUBLE), f (FLOAT) and, on PostgreSQL, da (double precision[]) and fa (real[])."""


def float_rows(postgres: bool) -> list[FloatRow]:
    doubles = tricky_doubles(17)
    floats = tricky_floats(doubles)
    rows: list[FloatRow] = []
    for i, d in enumerate(doubles):
        f = floats[i % len(floats)]
        rows.append((i + 1, d, f if i % 7 else None, [d, None, -d] if i % 3 else None,
                     [f] if i % 2 else []))
    if postgres:  # what only PostgreSQL stores: NaN, infinities, -0.0 (also in arrays)
        special = [math.nan, math.inf, -math.inf, -0.0]
        elements: list[float | None] = [*special, None]
        rows += [(len(doubles) + 1 + i, v, v, elements, elements)
                 for i, v in enumerate(special)]
    return rows


def create_float_tables(source_kit: SourceKit, db: str, rows: list[FloatRow],
                        keys: list[float]) -> Callable[[list[FloatRow]], None]:
    """Tables ``vals`` (``rows``) and ``fkey`` (a FLOAT key: ``keys``, v = index) in ``db``;
    returns a function inserting more rows into ``vals``."""
    postgres = source_kit.kind == "postgres"
    vals, fkey = source_kit.qualified(db, "vals"), source_kit.qualified(db, "fkey")
    if postgres:
        ddl = [f"CREATE TABLE {vals} (id int PRIMARY KEY, d double precision, f real,"
               " da double precision[], fa real[])",
               f"ALTER TABLE {vals} REPLICA IDENTITY FULL",
               f"CREATE TABLE {fkey} (f real PRIMARY KEY, v int)",
               f"ALTER TABLE {fkey} REPLICA IDENTITY FULL"]
        insert = f"INSERT INTO {vals} VALUES (%s, %s::float8, %s::real, %s::float8[], %s::real[])"  # noqa: S608
        insert_key = f"INSERT INTO {fkey} VALUES (%s::real, %s)"  # noqa: S608
    else:
        ddl = [f"CREATE TABLE {vals} (id INT PRIMARY KEY, d DOUBLE, f FLOAT)",
               f"CREATE TABLE {fkey} (f FLOAT PRIMARY KEY, v INT)"]
        insert = f"INSERT INTO {vals} VALUES (%s, %s, %s)"  # noqa: S608
        insert_key = f"INSERT INTO {fkey} VALUES (%s, %s)"  # noqa: S608

    def params(row: FloatRow) -> tuple[Any, ...]:
        if not postgres:
            return row[:3]
        return (row[0], pg_float(row[1]), pg_float(row[2]), pg_array(row[3]), pg_array(row[4]))

    def insert_rows(more: list[FloatRow]) -> None:
        conn = source_kit.connect()
        with conn.cursor() as cur:
            cur.executemany(insert, [params(r) for r in more])
        conn.close()

    conn = source_kit.connect()
    with conn.cursor() as cur:
        for sql in ddl:
            cur.execute(sql)
        cur.executemany(insert_key, [(pg_float(k) if postgres else k, i)
                                     for i, k in enumerate(keys)])
    conn.close()
    insert_rows(rows)
    return insert_rows


def expected_text(row: FloatRow, postgres: bool) -> str:
    """The row's checksum text by the contract (MariaDB stores -0.0 as 0.0)."""
    i, d, f, da, fa = row
    if not postgres:
        d, f = d or 0.0, None if f is None else f or 0.0
    pieces = [f"V{len(str(i))}:{i}", bits_text(d), bits_text(f)]
    if postgres:
        pieces += [array_text(da), array_text(fa)]
    return "|".join(pieces)


def test_float_and_double_values_are_checksummed_by_their_bits(
    source_kit: SourceKit, spark: Any, tmp_path: Path
) -> None:
    """FLOAT and DOUBLE values (PostgreSQL arrays of them too), captured and tailed: the
    database renders each row's checksum text exactly as the mirror does, each value as its
    IEEE 754 bits (each value's neighbours are among the values: their texts differ from
    its), and one unit in the last place changed in the mirror, in a value or a FLOAT key,
    makes its range differ."""
    postgres = source_kit.kind == "postgres"
    rows = float_rows(postgres)
    keys = list(dict.fromkeys(tricky_floats(tricky_doubles(3))))[::3][:60]  # 0.0 = -0.0
    half = len(rows) // 2
    db = source_kit.simple_table("floats", 0)
    with source_kit.cleaned(db, "floats") as source:
        insert_rows = create_float_tables(source_kit, db, rows[:half], keys)
        path = source_kit.config(tmp_path / "dblog.yaml", source=source, db=db,
                                 lake=tmp_path / "lake", chunk_size=2000, batch_seconds=0.3,
                                 tables=[f"{db}.vals", f"{db}.fkey"])
        table, key_table = TableId(db, "vals"), TableId(db, "fkey")
        with open_runtime(load_config(path), spark=spark) as rt:
            with BackgroundTailer(rt.tailer()) as bg:
                rt.wait_started(bg.check)
                capturer = rt.capturer()
                capturer.health_check = bg.check
                done = capturer.run(capturer.plan(CaptureRequest((table, key_table))))
                assert [r.status for r in done] == ["done", "done"]
                insert_rows(rows[half:])  # the rest through the log
                if postgres:  # a NaN with the sign bit set (inf - inf): NaN's text still
                    nan_id = next(r[0] for r in rows if math.isnan(r[1]))
                    conn = source_kit.connect()
                    with conn.cursor() as cur:
                        cur.execute(f"UPDATE {source_kit.qualified(db, 'vals')} SET d ="  # noqa: S608
                                    " 'Infinity'::float8 - 'Infinity' WHERE id = %s", (nan_id,))
                    conn.close()
                rt.wait_caught_up(bg.check)

                schema = rt.dialect.table_schema(table)
                checksum = postgres_checksum if postgres else mysql_checksum
                conn = source_kit.connect()
                with conn.cursor() as cur:
                    cur.execute(f"SELECT id, {checksum.row_text_sql(schema)} "  # noqa: S608
                                f"FROM {source_kit.qualified(db, 'vals')}")
                    source_texts = {int(i): str(t) for i, t in cur.fetchall()}
                conn.close()
                mirror = spark.read.format("delta").load(rt.layout.mirror(table))
                lake_texts = {int(r[0]): str(r[1])
                              for r in mirror.select("id", row_text(mirror, schema)).collect()}
                expected = {r[0]: expected_text(r, postgres) for r in rows}
                assert source_texts == expected
                assert lake_texts == expected

                ranges = ranges_of(rt, table, 600)
                names = list(ranges)
                assert len(names) == 3
                assert all(c.equal for c in compare_ranges(rt, table, ranges, check=bg.check))
                whole = repair_table(rt, key_table, dry_run=True, health_check=bg.check)
                assert whole.ranges_checked == 1 and not whole.suspects, whole

                # One unit in the last place, in the mirror only: a DOUBLE in range 0, a
                # FLOAT in range 2, an array element in range 1, a FLOAT key.
                d_id, d = rows[9][0], rows[9][1]
                f_id, f = next((r[0], r[2]) for r in rows[1300:] if r[2] is not None)
                a_id, a = next((r[0], r[1]) for r in rows[700:] if r[3] is not None)  # [a, N, -a]
                damaged = {names[0], names[2]} | ({names[1]} if postgres else set())
                ids = F.col("id")
                changes: dict[str, str | Column] = {
                    "d": F.when(ids == d_id, F.lit(math.nextafter(d, math.inf)))
                    .otherwise(F.col("d")),
                    "f": F.when(ids == f_id, F.lit(float32_after(f, True)).cast("float"))
                    .otherwise(F.col("f"))}
                if postgres:
                    changes["da"] = F.when(ids == a_id, F.array(
                        F.lit(math.nextafter(a, -math.inf)), F.lit(None).cast("double"),
                        F.lit(-a))).otherwise(F.col("da"))
                DeltaTable.forPath(spark, rt.layout.mirror(table)).update(
                    ids.isin(d_id, f_id, a_id), changes)
                DeltaTable.forPath(spark, rt.layout.mirror(key_table)).update(
                    F.col("v") == 5, {"f": F.lit(float32_after(keys[5], False)).cast("float")})
                found = compare_ranges(rt, table, ranges, check=bg.check)
                assert {c.name for c in found if not c.equal} == damaged, found
                whole = repair_table(rt, key_table, dry_run=True, health_check=bg.check)
                assert len(whole.differing) == 1, whole
            rt.state.delete("", recursive=True)


# ---- the rolling verification: `dblog repair` -------------------------------------------

def repair_config(source_kit: SourceKit, tmp_path: Path, db: str, source: str,
                  rate: float = 150.0) -> Path:
    path = source_kit.config(tmp_path / "dblog.yaml", source=source, db=db,
                             lake=tmp_path / "lake", chunk_size=200, batch_seconds=0.3,
                             tables=[f"{db}.t"])
    data = yaml.safe_load(path.read_text())
    data["repair"] = {"max_rows_per_s": rate, "range_rows": 100}
    path.write_text(yaml.safe_dump(data))
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def diverge(source_kit: SourceKit, spark: Any, rt: Runtime, db: str) -> None:
    """A changed row in range 0 (ids 1-100), a lost one in range 2 (201-300) and one the
    source does not have in the last range (501-), behind the pipeline's back: on MariaDB
    with the binlog off for the session; PostgreSQL cannot skip the WAL of a logged table,
    so there the mirror's Delta table is changed instead."""
    if source_kit.kind != "postgres":
        source_kit.run_sql(db, "SET sql_log_bin = 0",
                           "UPDATE {t} SET v = 'behind' WHERE id = 10",
                           "DELETE FROM {t} WHERE id = 250",
                           "INSERT INTO {t} VALUES (5000, 'unseen')")
        return
    path = rt.layout.mirror(TableId(db, "t"))
    mirror = DeltaTable.forPath(spark, path)
    mirror.update(F.col("id") == 10, {"v": F.lit("behind")})
    mirror.delete(F.col("id") == 250)
    (spark.read.format("delta").load(path).where(F.col("id") == 1)
     .withColumn("id", F.lit(5000)).write.format("delta").mode("append").save(path))


def outcomes(out: str, db: str) -> dict[str, str]:
    """Range name -> result of each per-range row of a pass's table."""
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] == f"{db}.t":
            found[parts[1]] = parts[4]
    return found


def test_a_divergence_behind_the_pipelines_back_is_found_and_repaired_by_one_paced_pass(
    source_kit: SourceKit, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = source_kit.simple_table("rolling", 600)
    with source_kit.cleaned(db, "rolling") as source:
        path = repair_config(source_kit, tmp_path, db, source)
        table = TableId(db, "t")
        assert cli(capsys, "-c", str(path), "capture")[0] == 0
        code, out = cli(capsys, "-c", str(path), "repair", "--dry-run")
        assert code == 0, out
        assert set(outcomes(out, db).values()) == {"equal"} and len(outcomes(out, db)) == 6
        with open_runtime(load_config(path), spark=spark) as rt:
            diverge(source_kit, spark, rt, db)
            captures = len(rt.state.list_captures())
            mirror_version = DeltaTable.forPath(spark, rt.layout.mirror(table)).history(
                1).collect()[0]["version"]

            # A dry run reports the three ranges and changes nothing.
            code, out = cli(capsys, "-c", str(path), "repair", "--dry-run", f"{db}.t")
            assert code == 1, out
            names = list(outcomes(out, db))
            assert len(names) == 6, out
            differing = {n for n, o in outcomes(out, db).items() if o == "differing"}
            assert differing == {names[0], names[2], names[5]}, out
            assert "(dry run)" in out and "3 differing" in out
            assert len(rt.state.list_captures()) == captures
            assert DeltaTable.forPath(spark, rt.layout.mirror(table)).history(
                1).collect()[0]["version"] == mirror_version
            assert not verify_table(rt.dialect, rt.sink, table).ok

            # One pass finds and repairs them.
            code, out = cli(capsys, "-c", str(path), "repair")
            assert code == 0, out
            repaired = {n for n, o in outcomes(out, db).items() if o == "repaired"}
            assert repaired == differing, out
            assert {o for n, o in outcomes(out, db).items() if n not in repaired} == {"equal"}
            summary = out.strip().splitlines()[-1]
            assert "6 ranges of 1 table(s)" in summary and "3 repaired" in summary, out
            assert len(rt.state.list_captures()) == captures + 3  # one range each
            assert verify_table(rt.dialect, rt.sink, table).ok
        code, out = cli(capsys, "-c", str(path), "repair", "--dry-run")
        assert code == 0 and "0 differing" in out, out
        assert cli(capsys, "-c", str(path), "repair", "--all", "--dry-run")[0] == 2


def test_a_continuous_repair_finds_a_divergence_injected_while_it_runs_and_keeps_its_place(
    services: Endpoints, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mariadb = kit("mariadb", services)
    monkeypatch.setenv(mariadb.password_env, mariadb.password)
    db = mariadb.simple_table("rolling", 600)
    with mariadb.cleaned(db, "rolling") as source:
        path = repair_config(mariadb, tmp_path, db, source, rate=300.0)
        table = TableId(db, "t")
        assert cli(capsys, "-c", str(path), "capture")[0] == 0
        lines: queue.Queue[str] = queue.Queue()
        walk = subprocess.Popen(
            [sys.executable, "-m", "dblog.app.cli", "-c", str(path), "repair", "--continuous"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=Path(__file__).resolve().parents[2])
        assert walk.stdout is not None
        reader = threading.Thread(target=lambda: [lines.put(x) for x in walk.stdout or ()],
                                  daemon=True)
        reader.start()
        seen: list[str] = []

        def wait_for(wanted: Callable[[str], bool], timeout: float = 300.0) -> str:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    assert walk.poll() is None, "".join(seen)
                    continue
                seen.append(line)
                if wanted(line):
                    return line
            raise AssertionError(f"not seen within {timeout:.0f}s:\n{''.join(seen)}")

        try:
            wait_for(lambda line: line.startswith(f"pass 1 of {db}.t: 6 ranges"))
            # Range 3 (ids 301-400) changes behind the pipeline's back while the walk runs.
            mariadb.run_sql(db, "SET sql_log_bin = 0",
                            "UPDATE {t} SET v = 'behind' WHERE id = 350")
            wait_for(lambda line: "000003:[300]: differs" in line and "capturing" in line)
            wait_for(lambda line: line.split()[1:2] == ["000003:[300]"]
                     and "repaired" in line)
        finally:
            walk.send_signal(signal.SIGTERM)
            code = walk.wait(120)
        reader.join(10)
        while not lines.empty():
            seen.append(lines.get())
        assert code == 0, "".join(seen)
        assert "(stopped)" in seen[-1] and "1 repaired" in seen[-1], "".join(seen)

        paced = replace(load_config(path), repair=RepairConfig(max_rows_per_s=20.0,
                                                                range_rows=100))
        with open_runtime(paced, spark=spark) as rt:
            assert verify_table(rt.dialect, rt.sink, table).ok
            found = rt.state.get(place_path(table))
            assert found is not None
            place = Place.from_json(found.value)
            assert place.pass_number >= 2 and place.last_pass is not None
            # A walk started again continues at the range the stopped one was to compare.
            expected = place.next.name if place.next is not None else "000000:start"
            names: list[str] = []
            with BackgroundTailer(rt.tailer()) as bg:
                repairer = Repairer(rt, health_check=bg.check,
                                    on_result=lambda r: names.append(r.name))
                repairer.next_range(table, table_walk(rt, table))
                assert names == [expected]
                moved = rt.state.get(place_path(table))
                assert moved is not None and moved.version == found.version + 1
                # The pace holds: unpaced, a pass over the 600 rows takes ~6 s once the
                # tailer runs; at 20 rows/s it takes 30 s at least (a generous upper bound).
                began = time.monotonic()
                report = repairer.one_pass(table)
                seconds = time.monotonic() - began
            assert report.ranges_checked == 6 and report.rows_checked == 600
            assert 600 / 20.0 <= seconds < 600 / 20.0 + 120, seconds
            rt.state.delete("", recursive=True)
