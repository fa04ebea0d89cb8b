"""Independent checks of a source's lake against the source database.

Deliberately plain (PyMySQL, pandas, dicts): they judge the pipeline, so they do not use
the pipeline's own readers.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pandas as pd
import pymysql
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline.sample import connect, q
from pipeline.services import Endpoints


def source_rows(ep: Endpoints, db: str, table: str, key: tuple[str, ...]) -> dict[tuple[Any, ...],
                                                                                   dict[str, Any]]:
    conn = connect(ep, db)
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(f"SELECT * FROM {q(table)}")  # noqa: S608 - quoted identifier
        rows = cur.fetchall()
    conn.close()
    return {tuple(r[k] for k in key): dict(r) for r in rows}


def replay_changelog(changelog: pd.DataFrame, key: tuple[str, ...]) -> dict[tuple[Any, ...],
                                                                            dict[str, Any]]:
    """Apply the changelog in (_dblog_lsn, _dblog_seq) order with plain pandas + dicts
    (``t``: the table was truncated or dropped, every earlier row is gone)."""
    ordered = changelog.sort_values(["_dblog_lsn", "_dblog_seq"], kind="stable")
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for op, before, after in zip(ordered["op"], ordered["before"], ordered["after"], strict=True):
        if op == "t":
            state.clear()
        elif op == "d":
            state.pop(tuple(before[k] for k in key), None)
        else:
            state[tuple(after[k] for k in key)] = dict(after)
    return state


def normalize(value: Any) -> Any:
    """Integral DECIMAL(20,0) (unsigned BIGINT) compares equal to the int it holds."""
    if isinstance(value, Decimal) and value == value.to_integral_value() \
            and value.as_tuple().exponent == 0:
        return int(value)
    return value


def normalize_rows(rows: dict[tuple[Any, ...], dict[str, Any]]) -> dict[Any, Any]:
    return {
        tuple(normalize(k) for k in key): {c: normalize(v) for c, v in row.items()}
        for key, row in rows.items()
    }


def changelog_frame(spark: SparkSession, path: str) -> pd.DataFrame:
    """The changelog with each row's Delta commit version (commit order), read through the
    Change Data Feed. Delta refuses CDF reads across a column type change; there the commit
    order is taken from ``_dblog_batch`` (one append per batch, batches commit in order)."""
    try:
        df = (spark.read.format("delta").option("readChangeFeed", "true")
              .option("startingVersion", 0).load(path))
        rows = [r.asDict(recursive=True) for r in df.collect()]
    except Exception as exc:  # noqa: BLE001 - only the schema-change refusal is expected
        if "INCOMPATIBLE_SCHEMA_CHANGE" not in str(exc):
            raise
        df = spark.read.format("delta").load(path)
        df = df.withColumn("_change_type", F.lit("insert")).withColumn(
            "_commit_version", F.col("_dblog_batch"))
        rows = [r.asDict(recursive=True) for r in df.collect()]
    return pd.DataFrame(rows, columns=df.columns)


def check_table(spark: SparkSession, ep: Any, db: str, table: str, key: tuple[str, ...],
                changelog_path: str,
                expected_rows: dict[tuple[Any, ...], dict[str, Any]] | None = None
                ) -> pd.DataFrame:
    """Invariants 2, 3 and no duplicates; returns the changelog frame for further checks.
    ``expected_rows``: the source's rows read by the caller (another database than
    MariaDB); by default they are read from MariaDB here."""
    frame = changelog_frame(spark, changelog_path)
    assert set(frame["_change_type"]) <= {"insert"}, "changelog must be append-only"
    # No event twice.
    dupes = frame.duplicated(["_dblog_lsn", "_dblog_seq"]).sum()
    assert dupes == 0, f"{table}: {dupes} duplicate (lsn, seq) rows in the changelog"
    # Commit order equals log order: each commit's positions come after the previous one's.
    by_commit = frame.groupby("_commit_version").agg(
        lo=("_dblog_lsn", "min"), hi=("_dblog_lsn", "max")).sort_index()
    assert (by_commit["lo"].iloc[1:].values >= by_commit["hi"].iloc[:-1].values).all(), \
        f"{table}: a commit holds positions older than an earlier commit"
    # Per key, positions never go back in commit order.
    ordered = frame.sort_values(["_commit_version", "_dblog_lsn", "_dblog_seq"], kind="stable")
    last: dict[Any, tuple[int, int]] = {}
    for op, before, after, lsn, seq in zip(ordered["op"], ordered["before"], ordered["after"],
                                           ordered["_dblog_lsn"], ordered["_dblog_seq"],
                                           strict=True):
        if op == "t":
            continue  # no key: a table reset
        image = before if op == "d" else after
        k = tuple(normalize(image[c]) for c in key)
        assert last.get(k, (-1, -1)) < (lsn, seq), f"{table}: key {k} went back in position"
        last[k] = (lsn, seq)
    # An independent replay with pandas equals the source.
    expected = normalize_rows(expected_rows if expected_rows is not None
                              else source_rows(ep, db, table, key))
    columns = next(iter(expected.values())).keys() if expected else ()
    # The lake keeps columns the source dropped; compare the source's current ones.
    replayed = {k: {c: v.get(c) for c in columns}
                for k, v in normalize_rows(replay_changelog(frame, key)).items()}
    missing = expected.keys() - replayed.keys()
    extra = replayed.keys() - expected.keys()
    wrong = [k for k in expected.keys() & replayed.keys() if expected[k] != replayed[k]]
    assert not (missing or extra or wrong), (
        f"{table}: replay != source; missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}, "
        f"different {[(k, expected[k], replayed[k]) for k in wrong[:3]]}"
    )
    return frame


def check_untouched_captured_once(frame: pd.DataFrame, table: str, key: tuple[str, ...],
                                  initial: set[tuple[Any, ...]],
                                  touched: set[tuple[str, tuple[Any, ...]]]) -> int:
    """Invariant 4: rows that existed throughout and were never written appear exactly once
    among the capture rows (``op = 'r'``). Returns how many such rows there were."""
    counts: dict[tuple[Any, ...], int] = {}
    for after in frame[frame["op"] == "r"]["after"]:
        k = tuple(normalize(after[c]) for c in key)
        counts[k] = counts.get(k, 0) + 1
    untouched = {
        tuple(normalize(v) for v in k) for k in initial if (table, tuple(k)) not in touched
    }
    wrong = {k: counts.get(k, 0) for k in untouched if counts.get(k, 0) != 1}
    sample = dict(list(wrong.items())[:10])
    assert not wrong, f"{table}: untouched rows not captured exactly once: {sample}"
    return len(untouched)
