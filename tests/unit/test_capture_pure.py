"""Unit tests for the pure chunk-outcome rule (dblog.core.chunking.chunk_outcome): when a chunk
ends its range, and which key range its select read completely (the tailer's delete range)."""

from __future__ import annotations

import datetime as dt
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.capture import key_from_values
from dblog.core.chunking import ChunkOutcome, chunk_outcome
from dblog.core.events import Key, TableId
from dblog.sources.base import ChunkSpec, Column, TableSchema
from dblog.sources.mysql.snapshot import build_chunk_sql, max_key_sql


def test_a_full_chunk_covers_up_to_its_last_key_and_is_not_final() -> None:
    out = chunk_outcome(after=(10,), upper=(500,), rows=100, limit=100, last=(120,),
                        filtered=False)
    assert out == ChunkOutcome(final=False, delete_range=((10,), (120,)))


def test_a_short_chunk_covers_up_to_the_fixed_upper_and_is_final() -> None:
    out = chunk_outcome(after=(400,), upper=(500,), rows=7, limit=100, last=(480,),
                        filtered=False)
    assert out == ChunkOutcome(final=True, delete_range=((400,), (500,)))


def test_a_full_chunk_ending_at_the_fixed_upper_is_final() -> None:
    out = chunk_outcome(after=(400,), upper=(500,), rows=100, limit=100, last=(500,),
                        filtered=False)
    assert out == ChunkOutcome(final=True, delete_range=((400,), (500,)))


def test_a_short_chunk_with_an_open_upper_covers_everything_above_after() -> None:
    out = chunk_outcome(after=None, upper=None, rows=0, limit=100, last=None, filtered=False)
    assert out == ChunkOutcome(final=True, delete_range=(None, None))


def test_a_chunk_that_ends_its_range_is_final_even_when_full() -> None:
    """An empty table when the upper bound was fixed: one chunk, final whatever it reads."""
    out = chunk_outcome(after=None, upper=None, rows=100, limit=100, last=(99,),
                        filtered=False, ends_range=True)
    assert out == ChunkOutcome(final=True, delete_range=(None, (99,)))


def test_filtered_chunks_delete_nothing() -> None:
    out = chunk_outcome(after=(1,), upper=(500,), rows=3, limit=100, last=(9,), filtered=True)
    assert out == ChunkOutcome(final=True, delete_range=None)
    out = chunk_outcome(after=(1,), upper=(500,), rows=100, limit=100, last=(200,),
                        filtered=True)
    assert out == ChunkOutcome(final=False, delete_range=None)


def test_composite_keys() -> None:
    out = chunk_outcome(after=("eu", 5), upper=("us", 1), rows=2, limit=2, last=("eu", 9),
                        filtered=False)
    assert out == ChunkOutcome(final=False, delete_range=(("eu", 5), ("eu", 9)))


@pytest.mark.parametrize(("rows", "last"), [(-1, None), (101, (5,)), (3, None)])
def test_rejects_impossible_chunks(rows: int, last: Key | None) -> None:
    with pytest.raises(ValueError):
        chunk_outcome(after=None, upper=None, rows=rows, limit=100, last=last, filtered=False)


@settings(deadline=timedelta(seconds=10))
@given(
    keys=st.lists(st.integers(0, 60), unique=True).map(sorted),
    upper=st.integers(0, 60),
    limit=st.integers(1, 7),
)
def test_walking_a_range_covers_it_contiguously_and_ends(
    keys: list[int], upper: int, limit: int
) -> None:
    """Simulate a capture of (None, upper]: the delete ranges tile it without gaps or overlap,
    every key is read exactly once, and the walk ends with a final chunk."""
    in_range = [k for k in keys if k <= upper]
    after: Key | None = None
    read: list[int] = []
    covered: list[tuple[Key | None, Key | None]] = []
    for _ in range(len(in_range) + 2):
        chunk = [k for k in in_range if after is None or k > after[0]][:limit]
        last = (chunk[-1],) if chunk else None
        out = chunk_outcome(after=after, upper=(upper,), rows=len(chunk), limit=limit,
                            last=last, filtered=False)
        assert out.delete_range is not None
        covered.append(out.delete_range)
        read += chunk
        if out.final:
            break
        after = last
    else:
        pytest.fail("the walk did not end")
    assert read == in_range
    assert covered[0][0] is None and covered[-1][1] == (upper,)
    for (_, through), (nxt, _) in zip(covered, covered[1:], strict=False):
        assert through == nxt


# ---- key values and the key order of chunk selects ----------------------------------------


def _schema(*cols: tuple[str, str, str], key: tuple[str, ...]) -> TableSchema:
    return TableSchema(TableId("d", "t"), tuple(Column(n, s, False, src) for n, s, src in cols),
                       key)


def test_timestamp_key_values_become_utc_aware_datetimes_like_the_log_gives_them() -> None:
    schema = _schema(("ts", "TIMESTAMP", "timestamp(6)"), ("dt", "TIMESTAMP_NTZ", "datetime(0)"),
                     ("n", "INT", "int"), key=("ts", "dt", "n"))
    naive = dt.datetime(2024, 3, 1, 9, 0)
    key = key_from_values(schema, (1_709_283_600_000_123, naive, 5))
    assert key == (dt.datetime(2024, 3, 1, 9, 0, 0, 123, tzinfo=dt.UTC), naive, 5)
    assert key[0].utcoffset() == dt.timedelta(0)


def test_enum_and_set_keys_are_ordered_as_their_predicates_compare_them() -> None:
    """ENUM/SET sort by index but compare with a string literal as strings: the chunk's
    ORDER BY must be the string order, or `e > 'last'` skips or repeats rows."""
    schema = _schema(("e", "STRING", "enum"), ("s", "STRING", "set"), ("n", "INT", "int"),
                     ("v", "STRING", "varchar"), key=("e", "s", "n"))
    sql = build_chunk_sql(ChunkSpec(TableId("d", "t"), 10, after_key=("a", "", 1)), schema)
    assert sql.endswith(
        " ORDER BY CONCAT(`d`.`t`.`e`), CONCAT(`d`.`t`.`s`), `d`.`t`.`n` LIMIT 10")


def test_max_key_sql_reads_the_greatest_key_above_the_lower_bound() -> None:
    schema = _schema(("a", "INT", "int"), ("e", "STRING", "enum"), ("v", "STRING", "text"),
                     key=("a", "e"))
    sql = max_key_sql(schema, None)
    assert sql == (
        "SELECT `a` AS `a`, CAST(`e` AS CHAR) AS `e` FROM `d`.`t` "
        "ORDER BY `d`.`t`.`a` DESC, CONCAT(`d`.`t`.`e`) DESC LIMIT 1"
    )
    above = max_key_sql(schema, (5, "x"))
    assert " WHERE (`a` >= 5 AND ((`a` > 5) OR (`a` = 5 AND `e` > _utf8mb4 X'78'))) " in above
