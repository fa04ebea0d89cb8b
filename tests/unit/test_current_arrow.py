"""The current-state readers' pure parts: the newest row per key (delta-rs reader) and the
mirror's mark from its commit history (both readers)."""

from __future__ import annotations

import json
from datetime import timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dblog.lake.current import mark_in_history
from dblog.lake.current_arrow import _newest_per_key
from dblog.lake.types import MIRROR_LSN

_rows = st.lists(
    st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(["a", "b"]),
              st.integers(0, 5), st.integers(0, 3)),
    max_size=40, unique_by=lambda r: (r[2], r[3], r[0], r[1]))


@settings(deadline=timedelta(seconds=10))  # the first example loads pyarrow.compute
@given(_rows)
def test_the_newest_row_of_every_key_is_kept(rows: list[tuple[int | None, str, int, int]]
                                            ) -> None:
    table = pa.table({
        "k1": pa.array([r[0] for r in rows], pa.int64()),
        "k2": pa.array([r[1] for r in rows], pa.string()),
        "_dblog_lsn": pa.array([r[2] for r in rows], pa.int64()),
        "_dblog_seq": pa.array([r[3] for r in rows], pa.int64()),
    })
    expected: dict[tuple[int | None, str], tuple[int, int]] = {}
    for k1, k2, lsn, seq in rows:
        expected[(k1, k2)] = max(expected.get((k1, k2), (lsn, seq)), (lsn, seq))
    got = _newest_per_key(table, ["k1", "k2"]).to_pylist()
    assert {(r["k1"], r["k2"]): (r["_dblog_lsn"], r["_dblog_seq"]) for r in got} == expected
    assert len(got) == len(expected)


def test_the_mark_is_the_latest_merges_at_or_before_the_version() -> None:
    def commit(version: int, operation: str, **meta: object) -> dict[str, object]:
        return {"version": version, "operation": operation,
                "userMetadata": json.dumps(meta) if meta else None}

    history = [  # newest first, as delta-rs gives it
        commit(6, "MERGE", **{MIRROR_LSN: 60}),
        commit(5, "WRITE", **{"dblog.batch": 9}),  # a partial append: no mark
        commit(4, "OPTIMIZE"),
        commit(3, "WRITE", **{MIRROR_LSN: 30}),  # an append that merged everything
        commit(2, "MERGE", **{"dblog.to_lsn": 20}),  # written before the mark had its name
        commit(1, "CREATE TABLE"),
    ]
    assert mark_in_history(history, 6) == 60
    assert mark_in_history(history, 5) == 30
    assert mark_in_history(history, 3) == 30
    assert mark_in_history(history, 2) == 20
    assert mark_in_history(history, 1) is None
    assert mark_in_history([{"operation": "MERGE", "userMetadata": "not json"}], 0) is None
