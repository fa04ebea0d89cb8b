# ruff: noqa: S608 - test SQL is built from quote_table and constants
"""The compiled row-image reader (``dblog.sources.mysql.rowimage``) against
mysql-replication's own decoding, on the same binlog events of the real server: random rows
of every type it compiles (extremes, NULLs, zero dates, several charsets and length sizes),
updated and deleted, decode to equal values of equal types both ways."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from dblog.core.events import Op, TableId
from dblog.sources.mysql import MySqlDialect
from dblog.sources.mysql.binlog import plan_from_table_map, row_images, update_images
from dblog.sources.mysql.sqltext import quote_table
from devtools.services import Endpoints
from tests.integration.helpers import run_statements
from tests.integration.test_mysql_source import changes, read_until

pytestmark = pytest.mark.integration

ENUM_300 = ", ".join(f"'e{n}'" for n in range(300))  # two bytes per value
FAST_DDL = f"""(
 id INT NOT NULL PRIMARY KEY,
 ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED, mi MEDIUMINT,
 miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
 d DECIMAL(12,4), d0 DECIMAL(5,5), dbig DECIMAL(50,10), dint DECIMAL(19,0), d9 DECIMAL(18,9),
 fl FLOAT, db DOUBLE,
 dt DATE, dtt DATETIME(6), dt0 DATETIME, dt1 DATETIME(1), dt3 DATETIME(3), dt5 DATETIME(5),
 ts TIMESTAMP(6) NULL, ts0 TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL, yr YEAR,
 c CHAR(5), cl CHAR(200), vc VARCHAR(300), vl VARCHAR(20) CHARACTER SET latin1,
 vcs VARCHAR(40) CHARACTER SET ascii,
 ttx TINYTEXT, tx TEXT, mtx MEDIUMTEXT, ltx LONGTEXT, tbl TINYBLOB, bl BLOB, mbl MEDIUMBLOB,
 bn BINARY(6), vb VARBINARY(10), en ENUM('a','b','c'), en2 ENUM({ENUM_300})
)"""
COLUMNS = ["id", "ti", "tiu", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu", "d", "d0",
           "dbig", "dint", "d9", "fl", "db", "dt", "dtt", "dt0", "dt1", "dt3", "dt5", "ts",
           "ts0", "ts3", "yr", "c", "cl", "vc", "vl", "vcs", "ttx", "tx", "mtx", "ltx", "tbl",
           "bl", "mbl", "bn", "vb", "en", "en2"]
TEXT = "aé😀 zß\u4e2d\x00"


def _decimal(rng: random.Random, integral: int, scale: int) -> str:
    whole = rng.choice([0, 1, 10**integral - 1, rng.randrange(10**integral)]) if integral else 0
    frac = rng.choice([0, 1, 10**scale - 1, rng.randrange(10**scale)]) if scale else 0
    sign = rng.choice(["", "-"])
    return f"{sign}{whole}.{frac:0{scale}d}" if scale else f"{sign}{whole}"


def _datetime(rng: random.Random, low: int = 1000, high: int = 9999) -> str:
    base = dt.datetime(rng.randint(low, high), rng.randint(1, 12), rng.randint(1, 28),
                       rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                       rng.choice([0, 1, 999999, rng.randrange(10**6)]))
    return base.isoformat(sep=" ")


def _text(rng: random.Random, longest: int) -> str:
    return "".join(rng.choice(TEXT) for _ in range(rng.randint(0, longest)))


def random_row(rng: random.Random, key: int) -> list[Any]:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    def ints(bits: int, unsigned: bool) -> int:
        low, high = (0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return rng.choice([low, high, 0, rng.randint(low, high)])

    return [
        key,
        *(maybe(ints(bits, u)) for bits in (8, 16, 24, 32, 64) for u in (False, True)),
        maybe(_decimal(rng, 8, 4)), maybe(_decimal(rng, 0, 5)), maybe(_decimal(rng, 40, 10)),
        maybe(_decimal(rng, 19, 0)), maybe(_decimal(rng, 9, 9)),
        maybe(rng.choice([0.0, -1.5, 3.4e38, rng.uniform(-1e6, 1e6)])),
        maybe(rng.choice([0.0, -1e-300, 1.7976931348623157e308, rng.uniform(-1e12, 1e12)])),
        maybe(f"{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"),
        maybe(_datetime(rng)), maybe(_datetime(rng)), maybe(_datetime(rng)),
        maybe(_datetime(rng)), maybe(_datetime(rng)),
        maybe(_datetime(rng, 1971, 2037)), maybe(_datetime(rng, 1971, 2037)),
        maybe(_datetime(rng, 1971, 2037)), maybe(rng.randint(1901, 2155)),
        maybe(_text(rng, 5)), maybe(_text(rng, 200)), maybe(_text(rng, 300)),
        maybe("".join(rng.choice("aéß ü") for _ in range(rng.randint(0, 20)))),
        maybe("".join(rng.choice("ab ~") for _ in range(rng.randint(0, 40)))),
        maybe(_text(rng, 60)), maybe(_text(rng, 400)), maybe(_text(rng, 70000 // 4)),
        maybe(_text(rng, 300)),
        *(maybe(bytes(rng.randrange(256) for _ in range(rng.randint(0, n))))
          for n in (255, 1000, 70000, 6, 10)),
        maybe(rng.choice("abc")), maybe(f"e{rng.randrange(300)}"),
    ]


def _events(services: Endpoints, db: str, start: dict[str, Any], end: dict[str, Any],
            compiled: bool) -> list[tuple[str, list[Any]]]:
    """Every row image of ``db``'s tables in [start, end), decoded one way or the other."""
    stream = BinLogStreamReader(
        connection_settings={"host": services.host, "port": services.mariadb_port,
                             "user": services.user, "password": services.mariadb_password,
                             "charset": "utf8mb4"},
        server_id=random.randint(20_000, 30_000), log_file=start["file"],
        log_pos=start["pos"], resume_stream=True, blocking=False, end_log_pos=end["pos"],
        only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_schemas=[db], freeze_schema=True, is_mariadb=False,
    )
    out: list[tuple[str, list[Any]]] = []
    plans: dict[int, Any] = {}
    try:
        for event in stream:
            if isinstance(event, TableMapEvent):
                plan = plan_from_table_map(event, TableId(db, event.table), False)
                assert plan.image is not None, "every column type here compiles"
                plans[event.table_id] = plan if compiled else dataclasses.replace(
                    plan, image=None)
                continue
            plan = plans[event.table_id]
            if isinstance(event, UpdateRowsEvent):
                out.append(("update", list(update_images(plan, event))))
            else:
                out.append((type(event).__name__, list(row_images(plan, event))))
    finally:
        stream.close()
    return out


def _typed(value: Any) -> Any:
    """A value with its type, so that 1 == 1.0 == Decimal(1) do not pass for each other."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_typed(v) for v in value]
    return (type(value).__name__, getattr(value, "tzinfo", None), value)


@pytest.mark.parametrize("values_seed", [1, 2])
def test_compiled_images_equal_the_librarys(services: Endpoints, dialect: MySqlDialect,
                                            sql: Any, db: str, values_seed: int) -> None:
    rng = random.Random(values_seed)
    table = TableId(db, "fast")
    marks = ", ".join(["%s"] * len(COLUMNS))
    insert = f"INSERT INTO {quote_table(table)} ({', '.join(COLUMNS)}) VALUES ({marks})"
    run_statements(sql, f"CREATE TABLE {quote_table(table)} {FAST_DDL}", "SET time_zone = '+05:00'")
    start = dialect.head_position()
    with sql.cursor() as cur:
        cur.executemany(insert, [random_row(rng, key) for key in range(1, 121)])  # multi-row
        for key in range(121, 161):
            cur.execute(insert, random_row(rng, key))
        cur.execute("SET sql_mode = ''")
        cur.execute(f"INSERT INTO {quote_table(table)} (id, dt, dtt, dt3, ts, yr, en) VALUES "
                    "(0, '0000-00-00', '0000-00-00 00:00:00', '2024-00-00 00:00:00.5', "
                    "'0000-00-00 00:00:00', 0, 'nope')")
        cur.execute("SET sql_mode = DEFAULT")
        for key in rng.sample(range(1, 161), 60):
            row = random_row(rng, key)
            sets = ", ".join(f"{c} = %s" for c in COLUMNS[1:])
            cur.execute(f"UPDATE {quote_table(table)} SET {sets} WHERE id = %s",
                        [*row[1:], key])
        cur.execute(f"UPDATE {quote_table(table)} SET id = id + 1000, d = -d WHERE id < 30")
        cur.execute(f"DELETE FROM {quote_table(table)} WHERE id % 3 = 0")
    end = dialect.head_position()
    library = _events(services, db, start, end, compiled=False)
    compiled = _events(services, db, start, end, compiled=True)
    images = sum(len(rows) for _, rows in library)
    assert images > 250 and [kind for kind, _ in library].count("update") >= 61
    assert _typed(compiled) == _typed(library)


def test_the_log_reader_uses_the_compiled_reader_and_gets_the_expected_values(
        dialect: MySqlDialect, sql: Any, db: str) -> None:
    table = TableId(db, "plain")
    run_statements(sql, f"CREATE TABLE {quote_table(table)} (id BIGINT PRIMARY KEY, "
                   "biu BIGINT UNSIGNED, d DECIMAL(12,4), dt DATE, dtt DATETIME(6), "
                   "ts TIMESTAMP(6) NULL, yr YEAR, vc VARCHAR(300), bn BINARY(4), "
                   "en ENUM('a','b'))")
    start = dialect.head_position()
    insert = f"INSERT INTO {quote_table(table)} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    run_statements(sql, "SET time_zone = '+05:00'",
                   (insert, (1, 2**64 - 1, "-12.5", "2024-02-29", "2024-01-02 03:04:05.000007",
                             "2024-06-30 12:00:00.654321", 2000, "x😀y  ", b"\x01", "b")),
                   f"INSERT INTO {quote_table(table)} (id) VALUES (2)",
                   f"UPDATE {quote_table(table)} SET vc = 'z' WHERE id = 1",
                   "SET time_zone = '+00:00'")
    reader = dialect.open_log(start, [table])
    try:
        events = changes(read_until(reader, 3))
        plans = [p for p in reader._plans.values() if p is not None]  # noqa: SLF001
    finally:
        reader.close()
    assert plans and all(p.image is not None for p in plans if p.table == table)
    first = {"id": 1, "biu": Decimal(2**64 - 1), "d": Decimal("-12.5000"),
             "dt": dt.date(2024, 2, 29), "dtt": dt.datetime(2024, 1, 2, 3, 4, 5, 7),
             "ts": dt.datetime(2024, 6, 30, 7, 0, 0, 654321, tzinfo=dt.UTC), "yr": 2000,
             "vc": "x😀y  ", "bn": b"\x01\x00\x00\x00", "en": "b"}
    assert [e.op for e in events] == [Op.CREATE, Op.CREATE, Op.UPDATE]
    assert _typed(events[0].after) == _typed(first)
    assert events[1].after == {c: None for c in first} | {"id": 2}
    assert _typed(events[2].before) == _typed(first)
    assert _typed(events[2].after) == _typed(first | {"vc": "z"})
