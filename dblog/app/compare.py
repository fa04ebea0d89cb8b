"""Compare a table's mirror with its source per key range, without moving rows.

The database computes each range's row count and checksum in one snapshot
(``SourceDialect.range_checksums``) and reports that snapshot's log position; once the tailer
has committed past it, Spark computes the same figures over the mirror. Changes committed
between the snapshot and the mirror's read make a range differ spuriously, so the rolling
verification (:mod:`dblog.app.repair`) compares a differing range once more before it acts.

Ranges need Spark to order the key like the database does (integer, date and binary keys;
text keys only under binary collations): otherwise a table is compared as one range.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dblog.app.runtime import Runtime
from dblog.core.chunking import KeyRange
from dblog.core.events import Key, TableId
from dblog.lake.types import quote_ident
from dblog.sources.base import TableSchema, element_type
from dblog.sources.checksum import (
    FLOAT_TYPES,
    NAN_BITS,
    NEGATIVE_INFINITY_BITS,
    POSITIVE_INFINITY_BITS,
)

WHOLE_TABLE = "whole-table"


@dataclass(frozen=True)
class RangeComparison:
    """One range's figures on both sides."""

    name: str
    key_range: KeyRange
    source_rows: int
    source_sum: int
    mirror_rows: int
    mirror_sum: int

    @property
    def equal(self) -> bool:
        return (self.source_rows, self.source_sum) == (self.mirror_rows, self.mirror_sum)


def _plain_decimal(col: Column, scale: int) -> Column:
    """A DECIMAL as MariaDB prints it (``0.00000001``; Spark would print ``1E-8``)."""
    magnitude = F.abs(col)
    whole = F.floor(magnitude)  # DECIMAL(p - s + 1, 0): the subtraction below stays exact
    text = whole.cast("string")
    if scale > 0:
        # 1 + fraction prints plainly ("1.00000001"): keep what follows its "1".
        fraction = (magnitude - whole).cast(T.DecimalType(min(scale + 1, 38), scale))
        one_plus = (fraction + F.lit(1)).cast(T.DecimalType(min(scale + 2, 38), scale))
        text = F.concat(text, F.substring(one_plus.cast("string"), 2, scale + 1))
    return F.concat(F.when(col < 0, F.lit("-")).otherwise(F.lit("")), text)


def double_bits(x: Column) -> Column:
    """The IEEE 754 bits of the DOUBLE ``x`` as 16 hex digits (``sources.checksum``).

    Spark has no bit cast in SQL (``java_method`` of ``Double.doubleToLongBits`` is one,
    but nondeterministic, so no aggregate takes it): the value is taken apart exactly as
    ``sources.mysql.checksum.double_bits_sql`` does (Java's ``pow`` of integers is exact
    where the result is representable). A zero is the subnormal case (0 / 2^-1022), and
    -0.0, equal to 0 and not below it, prints with its sign; NaN and infinities give
    ``m0`` NaN or infinite. ``m0`` is in the first condition, so Spark computes it once.
    """
    a = F.abs(x)
    e0 = F.least(F.greatest(F.floor(F.log2(F.greatest(a, F.lit(5e-324)))), F.lit(-1022)),
                 F.lit(1023))
    m0 = a / F.pow(F.lit(2.0), e0)
    negative = (x < 0) | ((x == 0) & x.cast("string").startswith("-"))

    def bits(e: Column, m: Column, *, normal: bool) -> Column:
        whole = F.lit(1) if normal else F.floor(m)
        field = F.when(negative, F.lit(2048)).otherwise(F.lit(0)) + (e + 1023) * whole
        fraction = ((m - whole) * F.lit(float(2**52))).cast("bigint")
        return F.concat(F.lpad(F.hex(field), 3, "0"), F.lpad(F.hex(fraction), 13, "0"))

    return (F.when((m0 >= 2) | F.isnan(m0),
                   F.when(F.isnan(x), F.lit(NAN_BITS))
                   .when(x == F.lit(float("inf")), F.lit(POSITIVE_INFINITY_BITS))
                   .when(x == F.lit(float("-inf")), F.lit(NEGATIVE_INFINITY_BITS))
                   .otherwise(bits(e0 + 1, m0 / 2, normal=True)))
            .when((m0 < 1) & (e0 > -1022), bits(e0 - 1, m0 * 2, normal=True))
            .otherwise(bits(e0, m0, normal=False)))


def _text(col: Column, spark_type: str) -> Column:
    element = element_type(spark_type)
    if element is not None:

        def piece(e: Column) -> Column:
            text = _text(e, element)
            return F.when(e.isNull(), F.lit("N")).otherwise(
                F.concat(F.lit("V"), F.length(text).cast("string"), F.lit(":"), text))

        return F.concat_ws(",", F.transform(col, piece))
    if spark_type in FLOAT_TYPES:
        return double_bits(col.cast("double"))
    if spark_type.startswith("DECIMAL("):
        scale = int(spark_type[:-1].split(",")[1])
        return _plain_decimal(col, scale)
    if spark_type == "BINARY":
        return F.hex(col)
    if spark_type in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return F.date_format(col, "yyyy-MM-dd HH:mm:ss.SSSSSS")
    if spark_type == "DATE":
        return F.date_format(col, "yyyy-MM-dd")
    return col.cast("string")


def row_hash(frame: DataFrame, schema: TableSchema) -> Column:
    """The 60-bit hash of a mirror row, as ``checksum.row_hash_sql`` computes it."""
    return F.conv(F.substring(F.md5(F.encode(row_text(frame, schema), "UTF-8")), 1, 15),
                  16, 10).cast(T.DecimalType(20, 0))


def row_text(frame: DataFrame, schema: TableSchema) -> Column:
    """The text a mirror row's hash is taken of (``checksum.row_text_sql``)."""
    present = set(frame.columns)
    pieces = []
    for column in schema.columns:
        name = column.name
        col = F.col(quote_ident(name)) if name in present else F.lit(None)
        text = _text(col, column.spark_type)
        pieces.append(F.when(col.isNull(), F.lit("N")).otherwise(
            F.concat(F.lit("V"), F.length(text).cast("string"), F.lit(":"), text)))
    return F.concat_ws("|", *pieces) if pieces else F.lit("")


def _after(cols: Sequence[Column], key: Key, strict_last: bool) -> Column:
    """Lexicographic ``cols > key`` (``strict_last``) or ``cols <= key``."""
    out: Column | None = None
    for i in reversed(range(len(cols))):
        if strict_last:
            here = cols[i] > F.lit(key[i])
        else:
            here = cols[i] < F.lit(key[i]) if i < len(cols) - 1 else cols[i] <= F.lit(key[i])
        if out is not None:
            here = here | ((cols[i] == F.lit(key[i])) & out)
        out = here
    assert out is not None
    return out


def in_range(cols: Sequence[Column], key_range: KeyRange) -> Column:
    cond = F.lit(True)
    if key_range.lower is not None:
        cond = cond & _after(cols, key_range.lower, True)
    if key_range.upper is not None:
        cond = cond & _after(cols, key_range.upper, False)
    return cond


def mirror_checksums(rt: Runtime, schema: TableSchema, ranges: Sequence[KeyRange]
                     ) -> list[tuple[int, int]]:
    """Per range, the mirror's ``(row count, checksum)`` (one Spark job for all ranges)."""
    if not rt.sink.known_columns(schema.table):
        return [(0, 0) for _ in ranges]
    mirror = rt.spark.read.format("delta").load(rt.sink.layout.mirror(schema.table))
    types = {f.name: f.dataType for f in mirror.schema.fields}
    keys = [F.col(quote_ident(k)).cast(types[k]) for k in schema.key]
    index: Column = F.lit(None).cast("int")
    for i in reversed(range(len(ranges))):
        index = F.when(in_range(keys, ranges[i]), F.lit(i)).otherwise(index)
    if len(ranges) == 1:  # the files' key statistics skip the files outside the range
        mirror = mirror.where(in_range(keys, ranges[0]))
    rows = (mirror.select(index.alias("_range"), row_hash(mirror, schema).alias("_hash"))
            .where(F.col("_range").isNotNull())
            .groupBy("_range").agg(F.count(F.lit(1)).alias("n"), F.sum("_hash").alias("s"))
            .collect())
    found = {int(r["_range"]): (int(r["n"]), int(r["s"] or 0)) for r in rows}
    return [found.get(i, (0, 0)) for i in range(len(ranges))]


def compare_ranges(rt: Runtime, table: TableId, ranges: Mapping[str, KeyRange], *,
                   timeout_s: float = 600.0, check: Callable[[], None] | None = None,
                   wait_for_tailer: bool = True) -> list[RangeComparison]:
    """Compare each range once. The database sums its ranges in a snapshot on a thread of
    its own while Spark, once the tailer has passed that snapshot's position, sums the
    mirror's: the two sides overlap. ``wait_for_tailer=False``: nothing writes the mirror
    (a stopped pipeline, a benchmark), so it is read at once."""
    schema = rt.dialect.table_schema(table)
    names = list(ranges)
    wanted = [ranges[n] for n in names]
    snapshot: queue.Queue[dict[str, Any]] = queue.Queue()
    outcome: dict[str, Any] = {}

    def source_side() -> None:
        try:
            outcome["source"] = rt.dialect.range_checksums(table, wanted, snapshot.put)[1]
        except BaseException as exc:  # re-raised below
            outcome["error"] = exc
            snapshot.put({})

    thread = threading.Thread(target=source_side, name="dblog-checksums", daemon=True)
    thread.start()
    try:
        position = snapshot.get(timeout=timeout_s)
        if "error" not in outcome and wait_for_tailer:
            rt.wait_for_position(position, check or (lambda: None), timeout_s,
                                 "the tailer did not reach the comparison's log position "
                                 "(is it running?)")
        if "error" not in outcome:
            mirror = mirror_checksums(rt, schema, wanted)
    finally:
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    source = outcome["source"]
    return [RangeComparison(n, r, s[0], s[1], m[0], m[1])
            for n, r, s, m in zip(names, wanted, source, mirror, strict=True)]
