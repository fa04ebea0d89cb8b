"""Independent checks of a source's lake against the source database.

Deliberately plain (PyMySQL, pandas, dicts): they judge the pipeline, so they do not use
the pipeline's own readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import pandas as pd
import pymysql
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from devtools.sample import Change, connect, q
from devtools.services import Endpoints


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
    order is taken from ``_dblog_batch`` (one append per batch, batches commit in order)
    and the table's history shows it append-only instead (its ``_change_type`` is then
    ``insert`` because that was checked here)."""
    try:
        df = (spark.read.format("delta").option("readChangeFeed", "true")
              .option("startingVersion", 0).load(path))
        rows = [r.asDict(recursive=True) for r in df.collect()]
    except Exception as exc:  # noqa: BLE001 - only the schema-change refusal is expected
        if "INCOMPATIBLE_SCHEMA_CHANGE" not in str(exc):
            raise
        assert_appends_only(spark, path)
        df = spark.read.format("delta").load(path)
        df = df.withColumn("_change_type", F.lit("insert")).withColumn(
            "_commit_version", F.col("_dblog_batch"))
        rows = [r.asDict(recursive=True) for r in df.collect()]
    return pd.DataFrame(rows, columns=df.columns)


REWRITING_OPERATIONS = frozenset({"DELETE", "UPDATE", "MERGE", "TRUNCATE", "RESTORE",
                                  "REPLACE TABLE", "CREATE OR REPLACE TABLE"})


def assert_appends_only(spark: SparkSession, path: str) -> None:
    """No commit of the Delta table at ``path`` removed or rewrote rows: every one is an
    append, a schema or property change, or a compaction that changes no data."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path.replace('`', '``')}`").collect()
    for commit in history:
        operation = str(commit["operation"])
        mode = (commit["operationParameters"] or {}).get("mode", "")
        overwrite = operation == "WRITE" and mode == "Overwrite"
        assert operation not in REWRITING_OPERATIONS and not overwrite, \
            f"changelog must be append-only: version {commit['version']} is {operation} {mode}"


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


Image = dict[str, Any] | None
Event = tuple[str, Image, Image]
"""A log event as the checks compare it: (op, before, after)."""


class HistoryChecked(NamedTuple):
    changes: int
    """How many committed changes were found in the changelog."""
    rewritten_keys: int
    """How many keys changed more than once (where a lost change can hide)."""


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 24:
        return f"{value[:12]}...({len(value)} chars)"
    if isinstance(value, dict):
        return {c: _short(v) for c, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_short(v) for v in value)
    return value


def _first_difference(expected: list[Event], logged: list[Event]) -> str:
    at = next((i for i, (e, a) in enumerate(zip(expected, logged, strict=False)) if e != a),
              min(len(expected), len(logged)))
    return (f"{len(expected)} committed, {len(logged)} logged; first difference at #{at}:"
            f" committed {_short(expected[at:at + 2])}, logged {_short(logged[at:at + 2])}")


def check_history(frame: pd.DataFrame, table: str, key: tuple[str, ...],
                  initial: dict[tuple[Any, ...], dict[str, Any]], changes: Sequence[Change],
                  final: dict[tuple[Any, ...], dict[str, Any]]) -> HistoryChecked:
    """Every change the writers committed is in the changelog exactly once, as a log event
    (``c``/``u``/``d``, no ``_dblog_window_id``) with the values written, and each key's
    log events, by ``(_dblog_lsn, _dblog_seq)``, are its changes in commit order: none lost
    (not even one a later change overwrote), none twice, none the writers did not commit,
    none out of order, no other before or after image.

    ``initial``: the table's rows before the writers started; ``changes``: every change
    the writers committed to ``table`` (:class:`devtools.sample.ChangeHistory`), all after
    the tailer's start (the log must hold each); ``final``: the table's rows now. Capture
    rows (``r``, and a capture's ``d`` rows) are no log events: the other checks judge them.

    The expected events follow from the history alone: a change of a key that does not
    exist is a ``c``, of one that does a ``u`` (its before image the key's previous row),
    a delete a ``d`` of the previous row. Two checks of the record itself come first: the
    row each delete's ``RETURNING`` gave is the row the history says was there (the
    per-key order is right), and replaying the history from ``initial`` gives ``final``
    (no committed change is missing from it)."""
    columns = list(next(iter(final.values()), None) or next(iter(initial.values()), {}))

    def image(row: dict[str, Any] | None) -> Image:
        return None if row is None else {c: normalize(row.get(c)) for c in columns}

    def key_of(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(normalize(row[c]) for c in key)

    state: dict[tuple[Any, ...], Image] = {key_of(row): image(row) for row in initial.values()}
    expected: dict[tuple[Any, ...], list[Event]] = {}
    for change in sorted(changes, key=lambda c: c.stamp):
        k = tuple(normalize(v) for v in change.key)
        before, after = state.get(k), image(change.after)
        if after is None:
            assert before is not None, f"{table}: the writers recorded a delete of {k}, " \
                "which the history says did not exist"
            assert change.deleted is None or image(change.deleted) == before, (
                f"{table}: the writers' history is out of order at {k}: the database "
                f"deleted {_short(image(change.deleted))}, the history had {_short(before)}")
            expected.setdefault(k, []).append(("d", before, None))
            state.pop(k)
        else:
            expected.setdefault(k, []).append(("c" if before is None else "u", before, after))
            state[k] = after
    now = {key_of(row): image(row) for row in final.values()}
    differ = [k for k in state.keys() | now.keys() if state.get(k) != now.get(k)]
    assert not differ, (
        f"{table}: the writers' history does not end in the source's rows: "
        f"{[(k, _short(state.get(k)), _short(now.get(k))) for k in sorted(differ)[:3]]}")

    events = frame[frame["op"].isin(["c", "u", "d"]) & frame["_dblog_window_id"].isna()]
    events = events.sort_values(["_dblog_lsn", "_dblog_seq"], kind="stable")
    logged: dict[tuple[Any, ...], list[Event]] = {}
    for op, before, after in zip(events["op"], events["before"], events["after"], strict=True):
        k = key_of(before if op == "d" else after)
        logged.setdefault(k, []).append((op, image(before), image(after)))
    wrong = sorted(k for k in expected.keys() | logged.keys()
                   if expected.get(k, []) != logged.get(k, []))
    assert not wrong, (
        f"{table}: {len(wrong)} keys whose log events are not their committed changes in "
        "order: " + "; ".join(f"{k}: {_first_difference(expected.get(k, []), logged.get(k, []))}"
                             for k in wrong[:3]))
    return HistoryChecked(sum(len(v) for v in expected.values()),
                          sum(1 for v in expected.values() if len(v) > 1))
