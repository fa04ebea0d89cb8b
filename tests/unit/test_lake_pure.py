"""Pure helpers of the Delta sink: value coercion, type widening, table properties."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql import types as T

from dblog.core.events import TableId
from dblog.lake.chunks import read_order_offsets
from dblog.lake.deltalog import action_rows
from dblog.lake.layout import LakeLayout, segment
from dblog.lake.sink import fold_survey_groups, table_properties, widens
from dblog.lake.types import coerce, name_apart, needs_coercion


def test_dates_become_midnight_for_timestamp_columns() -> None:
    assert coerce(date(2024, 1, 2), T.TimestampNTZType()) == datetime(2024, 1, 2)
    assert coerce(date(2024, 1, 2), T.TimestampType()) == datetime(2024, 1, 2, tzinfo=UTC)
    stamp = datetime(2024, 1, 2, 3, 4, 5)
    assert coerce(stamp, T.TimestampNTZType()) is stamp


def test_numbers_follow_the_wider_column_type() -> None:
    assert coerce(5, T.DecimalType(12, 2)) == Decimal(5)
    assert isinstance(coerce(5, T.DecimalType(12, 2)), Decimal)
    assert coerce(1.5, T.DecimalType(12, 2)) == Decimal("1.5")
    assert coerce(2, T.DoubleType()) == 2.0 and isinstance(coerce(2, T.DoubleType()), float)
    assert coerce(Decimal("2.5"), T.FloatType()) == 2.5
    assert coerce(None, T.DoubleType()) is None
    assert coerce(True, T.DoubleType()) is True  # never a bool into a number silently
    assert coerce("x", T.StringType()) == "x"


def test_only_some_types_need_coercion() -> None:
    assert needs_coercion(T.TimestampNTZType()) and needs_coercion(T.DecimalType(10, 0))
    assert not needs_coercion(T.IntegerType()) and not needs_coercion(T.StringType())


def test_new_tables_do_not_enable_type_widening() -> None:
    assert "delta.enableTypeWidening" not in table_properties(["id", "name"])
    assert "delta.columnMapping.mode" not in table_properties(["id", "name"])
    assert table_properties(["id", "a name"])["delta.columnMapping.mode"] == "name"


def test_widening_rules() -> None:
    assert widens(T.IntegerType(), T.LongType())
    assert not widens(T.LongType(), T.IntegerType())
    assert widens(T.DateType(), T.TimestampNTZType())
    assert widens(T.FloatType(), T.DoubleType())
    assert widens(T.DecimalType(10, 2), T.DecimalType(12, 2))
    assert not widens(T.DecimalType(10, 2), T.DecimalType(10, 1))


@given(st.text(), st.text())
def test_lake_path_segments_are_distinct_plain_and_never_escapes_delta_rs_decodes(
        a: str, b: str) -> None:
    for name in (a, b):
        seg = segment(name)
        assert seg and seg.isascii() and seg not in (".", "..")
        assert not any(c in seg for c in "%/\\: \"'")
    assert (segment(a) == segment(b)) == (a == b)


def test_a_lake_written_with_url_escaped_paths_is_still_found(tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path, "src")
    odd = TableId("my db", "t")
    assert layout.table_dir(odd) == str(tmp_path / "src" / "my~20db" / "t")
    assert layout.table_dir(TableId("shop", "items")) == str(tmp_path / "src" / "shop" / "items")
    (tmp_path / "src" / "my%20db" / "t").mkdir(parents=True)
    assert layout.table_dir(odd) == str(tmp_path / "src" / "my%20db" / "t")
    (tmp_path / "src" / "my~20db" / "t").mkdir(parents=True)  # renamed by the operator
    assert layout.table_dir(odd) == str(tmp_path / "src" / "my~20db" / "t")


def test_a_uri_lake_root_is_joined_as_text() -> None:
    layout = LakeLayout("s3a://bucket/lake/", "src")
    table = TableId("Sales db", "Order Lines")
    assert layout.changelog(table) == "s3a://bucket/lake/src/Sales~20db/Order~20Lines/changelog"
    assert layout.mirror(table).startswith("s3a://bucket/lake/src/")


@given(st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_read_order_offsets_number_rows_in_key_order(sizes: list[int]) -> None:
    """Read partitions read consecutive key ranges: a row's number in the chunk is the rows
    before its partition plus its index inside it (partitions without rows report none)."""
    counts = {part: n for part, n in enumerate(sizes) if n}
    offsets = read_order_offsets(counts)
    numbers = [offsets[part] + i for part, n in enumerate(sizes) for i in range(n)]
    assert numbers == list(range(sum(sizes)))


def test_action_rows_counts_the_added_rows() -> None:
    def add(n: int) -> str:
        return json.dumps({"add": {"path": f"p{n}", "stats": json.dumps({"numRecords": n})}})

    assert action_rows([add(3), add(4), json.dumps({"remove": {"path": "x"}})]) == 7
    assert action_rows([]) == 0
    with pytest.raises(ValueError, match="row count"):
        action_rows([json.dumps({"add": {"path": "p", "stats": "{}"}})])


@given(st.lists(st.from_regex(r"_{0,4}(dblog_op|OP|x)", fullmatch=True), max_size=8))
def test_a_work_column_is_named_apart_from_the_tables_columns(taken: list[str]) -> None:
    name = name_apart("_dblog_op", taken)
    assert name.lower() not in {t.lower() for t in taken}
    assert name.endswith("_dblog_op") and set(name[: -len("_dblog_op")]) <= {"_"}


_KEYS = st.floats(allow_nan=True, allow_infinity=True)


def _spark_min_max(values: list[float]) -> tuple[float, float]:
    """Spark's min and max of doubles: a NaN is above every number."""
    numbers = [v for v in values if not math.isnan(v)]
    has_nan = len(numbers) < len(values)
    low = min(numbers) if numbers else math.nan
    high = math.nan if has_nan else max(numbers)
    return low, high


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@given(st.lists(st.lists(_KEYS, min_size=1, max_size=4), min_size=1, max_size=5),
       st.randoms())
def test_survey_groups_fold_to_the_bounds_of_every_change(
        groups_keys: list[list[float]], rng: Any) -> None:
    """However the groups come back from Spark, the fold bounds every change's key as one
    aggregate would (a NaN key the greatest), counts them all and keeps the last
    TRUNCATE's position and each chunk's span apart from the log's."""
    groups = [Row(window=None if i == 0 else f"w{i}", rows=len(keys),
                  low=_spark_min_max(keys)[0], high=_spark_min_max(keys)[1],
                  top=100 + i, truncated=Row(_dblog_lsn=50 + i % 3, _dblog_seq=i))
              for i, keys in enumerate(groups_keys)]
    rng.shuffle(groups)
    folded = fold_survey_groups(groups)
    low, high = _spark_min_max([k for keys in groups_keys for k in keys])
    assert _same(folded.low, low) and _same(folded.high, high)
    assert folded.rows == sum(len(keys) for keys in groups_keys)
    assert folded.top == 100 + len(groups_keys) - 1
    last = max((50 + i % 3, i) for i in range(len(groups_keys)))
    assert folded.truncated is not None and tuple(folded.truncated) == last
    assert sorted(s["window"] for s in folded.spans) == sorted(
        f"w{i}" for i in range(1, len(groups_keys)))


def test_an_empty_survey_has_no_bounds() -> None:
    assert fold_survey_groups([]).rows == 0


def test_timestamp_bounds_never_go_through_local_time() -> None:
    """A TIMESTAMP literal is built from epoch microseconds: from an aware datetime exactly,
    in any zone; a naive one (a host's local time) is refused."""
    import datetime as dt

    import pytest

    from dblog.lake.sink import epoch_micros

    second = dt.datetime(2026, 11, 1, 6, 30, tzinfo=dt.UTC)  # 01:30 in New York, twice
    assert epoch_micros(second) == 1_793_514_600_000_000
    east = dt.timezone(dt.timedelta(hours=-5))
    assert epoch_micros(second.astimezone(east)) == epoch_micros(second)
    assert epoch_micros(dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)) == -1
    assert epoch_micros(123) == 123
    with pytest.raises(ValueError, match="aware"):
        epoch_micros(dt.datetime(2026, 11, 1, 1, 30))
