"""The tests' oracle of "mirror == source".

The source is read with its own driver (PyMySQL, psycopg2) and the mirror as plain Delta
files, both normalised here: never through the pipeline's chunk reader or ``dblog verify``
(:func:`dblog.app.verify.verify_table`), so a value-conversion bug of the pipeline cannot show
on both sides and cancel out. :func:`verify_table` takes ``verify_table``'s arguments, so a
test's check reads the same either way; tests of ``dblog verify`` itself keep the real one.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg2
import pymysql
from pyspark.sql import types as T

from dblog.app.verify import VerifyReport
from dblog.app.verify import verify_table as pipeline_verify
from dblog.core.events import TableId
from dblog.lake.sink import DeltaSink
from dblog.lake.types import META_COLUMNS
from dblog.sources.base import SourceDialect
from tests.integration.checks import normalize

Key = tuple[Any, ...]
Rows = dict[Key, dict[str, Any]]


@dataclass
class MirrorComparison:
    """Mirror against source, by key; ``ok`` when they hold the same rows and values."""

    table: TableId
    source_rows: int
    mirror_rows: int
    missing_keys: list[Key] = field(default_factory=list)
    extra_keys: list[Key] = field(default_factory=list)
    different_keys: list[Key] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)

    @property
    def differing(self) -> int:
        return len(self.missing_keys) + len(self.extra_keys) + len(self.different_keys)

    @property
    def ok(self) -> bool:
        return not (self.differing or self.missing_columns)

    def summary(self) -> str:
        if self.ok:
            return f"{self.table}: OK ({self.source_rows} rows; independent read)"
        parts = [f"{self.table}: MISMATCH source={self.source_rows} mirror={self.mirror_rows}"
                 " (independent read)"]
        for name, found in (("missing in mirror", self.missing_keys),
                            ("not in source", self.extra_keys),
                            ("different values", self.different_keys),
                            ("source columns the mirror lacks", self.missing_columns)):
            if found:
                parts.append(f"  {name}: {', '.join(map(str, found[:10]))}"
                             + (" ..." if len(found) > 10 else ""))
        parts += [f"  {e}" for e in self.examples[:3]]
        return "\n".join(parts)


def verify_table(dialect: SourceDialect, sink: DeltaSink, table: TableId,
                 sample: int = 50, *, current: bool = False) -> MirrorComparison | VerifyReport:
    """Compare ``table``'s mirror with the source, read independently of the pipeline.
    ``current``: the lake's current state (the mirror with the changelog rows it has not
    merged yet) is what is under test, so the pipeline's own verify compares it."""
    if current:
        return pipeline_verify(dialect, sink, table, sample, current=True)
    kind = type(dialect).__name__
    if kind.startswith("Postgres"):
        columns, source, generated = _postgres_rows(dialect.settings, table)  # type: ignore[attr-defined]
    else:
        columns, source = _mysql_rows(dialect.settings, table)  # type: ignore[attr-defined]
        generated = set()
    if not sink.known_columns(table):
        return MirrorComparison(table, len(source), 0, missing_keys=sorted(source, key=repr))
    frame = sink.spark.read.format("delta").load(sink.layout.mirror(table))
    lake_types = {f.name: f.dataType for f in frame.schema.fields if f.name not in META_COLUMNS}
    key = sink.key_columns(table)
    compared = [c for c in columns if c in lake_types]
    result = MirrorComparison(table, len(source), 0, missing_columns=[
        c for c in columns if c not in lake_types and c not in generated])
    # The Python type the source's driver gives each column (an array's: its elements'):
    # how the lake's text for a type Spark lacks is read back.
    like = {c: _driver_type(source, c) for c in compared}
    mirror: Rows = {}
    for row in frame.collect():
        values = {c: _normal(row[c], lake_types[c], like[c]) for c in compared}
        mirror[tuple(values[k] for k in key)] = values
    result.mirror_rows = len(mirror)
    expected: Rows = {}
    for row in source:
        values = {c: _normal(row[c], lake_types[c]) for c in compared}
        expected[tuple(values[k] for k in key)] = values
    result.missing_keys = sorted(expected.keys() - mirror.keys(), key=repr)[:sample]
    result.extra_keys = sorted(mirror.keys() - expected.keys(), key=repr)[:sample]
    for k in sorted(expected.keys() & mirror.keys(), key=repr):
        if expected[k] != mirror[k]:
            result.different_keys.append(k)
            if len(result.examples) < 3:
                wrong = {c: (expected[k][c], mirror[k][c]) for c in compared
                         if expected[k][c] != mirror[k][c]}
                result.examples.append(f"{k}: (source, mirror) {wrong}")
    result.different_keys = result.different_keys[:sample]
    return result


def _driver_type(rows: list[dict[str, Any]], column: str) -> type | None:
    for row in rows:
        value = row[column]
        while isinstance(value, list) and value:
            value = next((v for v in value if v is not None), None)
        if value is not None and not (isinstance(value, list) and not value):
            return type(value)
    return None


def _mysql_rows(settings: Any, table: TableId) -> tuple[list[str], list[dict[str, Any]]]:
    conn = pymysql.connect(host=settings.host, port=settings.port, user=settings.user,
                           password=settings.password, database=table.database,
                           charset="utf8mb4", autocommit=True)
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SELECT * FROM `{table.table.replace('`', '``')}`")  # noqa: S608
            names = [d[0] for d in cur.description]
            return names, list(cur.fetchall())
    finally:
        conn.close()


def _postgres_rows(settings: Any, table: TableId
                   ) -> tuple[list[str], list[dict[str, Any]], set[str]]:
    """The rows, their columns, and the generated columns (which the lake leaves out)."""
    conn = psycopg2.connect(host=settings.host, port=settings.port, user=settings.user,
                            password=settings.password, dbname=settings.database)
    try:
        with conn.cursor() as cur:
            ident = ".".join('"' + p.replace('"', '""') + '"'
                             for p in (table.database, table.table))
            cur.execute("SET TIME ZONE 'UTC'")
            cur.execute(f"SELECT * FROM {ident}")  # noqa: S608 - quoted identifiers
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
            cur.execute("SELECT column_name FROM information_schema.columns WHERE "
                        "table_schema = %s AND table_name = %s AND is_generated = 'ALWAYS'",
                        (table.database, table.table))
            generated = {r[0] for r in cur.fetchall()}
        return names, rows, generated
    finally:
        conn.close()


def _normal(value: Any, lake_type: T.DataType, like: type | None = None) -> Any:
    """One value, from either side, as both can be compared; the lake's type decides (a
    FLOAT column's single-precision bits, an array element by element, a timestamp in UTC,
    text the lake keeps for a type Spark lacks read back as that type: ``like``, the
    Python type the source's driver gives the column)."""
    if value is None:
        return None
    if isinstance(value, float | Decimal) and value != value:
        return "NaN"  # equal to itself on both sides
    if isinstance(lake_type, T.ArrayType) and isinstance(value, str):
        value = _pg_array(value)  # an array psycopg2 has no caster for (uuid[]): its text
    if isinstance(lake_type, T.ArrayType) and isinstance(value, list | tuple):
        return tuple(_normal(v, lake_type.elementType, like) for v in value)
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, bool):
        return value
    if isinstance(lake_type, T.FloatType) and isinstance(value, float | int | Decimal):
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    if isinstance(value, Decimal):
        return normalize(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        if isinstance(lake_type, T.TimestampType):  # PySpark gives the host's local time
            return value.astimezone(dt.UTC).replace(tzinfo=None)
        return value
    if isinstance(lake_type, T.StringType) and isinstance(value, str):
        return _text(value, like)
    if isinstance(value, Mapping | list):  # json/jsonb through psycopg2
        return ("json", json.dumps(value, sort_keys=True, default=str))
    if isinstance(value, dt.time):
        return value.replace(tzinfo=None) if value.utcoffset() in (None, dt.timedelta(0)) \
            else value
    if isinstance(value, dt.timedelta):
        return ("duration", value)
    return value


def _pg_array(text: str) -> list[str | None]:
    """A one-dimensional PostgreSQL array literal's elements (``{a,"b c",NULL}``)."""
    assert text.startswith("{") and text.endswith("}"), f"not an array: {text!r}"
    out: list[str | None] = []
    for raw in re.findall(r'"((?:[^"\\]|\\.)*)"|([^,{}]+)', text[1:-1]):
        quoted, plain = raw
        if plain:
            out.append(None if plain == "NULL" else plain)
        else:
            out.append(re.sub(r"\\(.)", r"\1", quoted))
    return out


_DURATION = re.compile(r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
                       r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?)?")


def _text(value: str, like: type | None) -> Any:
    """Text the lake holds for a value Spark has no type for, read as the source's driver
    gives it (``like``): a number, a time of day, an ISO-8601 duration, JSON; text of a
    text column stays as it is."""
    if like is None or issubclass(like, str):
        return value
    if issubclass(like, Mapping | list):
        return ("json", json.dumps(json.loads(value), sort_keys=True, default=str))
    if issubclass(like, dt.timedelta):
        clock = re.fullmatch(r"(-?)(\d+):(\d{2}):(\d{2}(?:\.\d+)?)", value)
        if clock is not None:  # [-]HH:MM:SS[.f]
            sign, hours, minutes, seconds = clock.groups()
            span = dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds))
            return ("duration", -span if sign else span)
        duration = _DURATION.fullmatch(value)
        assert duration is not None, f"not a duration: {value!r}"
        years, months, days, hours, minutes, seconds = (
            float(g) if g else 0.0 for g in duration.groups())
        # psycopg2 reads an interval's year as 365 days and its month as 30
        return ("duration", dt.timedelta(days=years * 365 + months * 30 + days, hours=hours,
                                         minutes=minutes, seconds=seconds))
    if issubclass(like, dt.time):
        return dt.time.fromisoformat(value)
    if issubclass(like, Decimal | int | float):
        number = Decimal(value)
        return "NaN" if number.is_nan() else normalize(number)
    return value
