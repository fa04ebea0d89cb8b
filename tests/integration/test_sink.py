"""The Delta sink driven directly (no database): chunks written once and committed as
written, crash-safe schema evolution, type coercion, non-Spark readers, capture deletes,
truncates and the mirror."""

from __future__ import annotations

import json
import threading
import time
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dblog.core.errors import DblogError, LeadershipLost
from dblog.core.events import ChangeEvent, Op, Position, TableId
from dblog.core.window import ChunkEmission
from dblog.lake.chunks import PARTITION_SHIFT, read_order_offsets, write_chunk_files
from dblog.lake.layout import LakeLayout
from dblog.lake.sink import DeltaSink, TableBatch, WriteAttempt
from dblog.lake.types import ATTEMPT_COLUMN, MIRROR_LSN, frame_of_columns, quote_ident
from dblog.sources.base import Column, TableSchema
from dblog.state.handoff import ChunkFiles, ChunkPin

pytestmark = pytest.mark.integration

TABLE = TableId("shop", "items")
SCHEMA = TableSchema(TABLE, (Column("id", "INT"), Column("name", "STRING")), ("id",))


def make_sink(spark: Any, tmp_path: Path) -> DeltaSink:
    return DeltaSink(spark, LakeLayout(tmp_path / "lake", "src"))


def ev(op: Op, key: int, lsn: int, seq: int = 0, **cols: Any) -> ChangeEvent:
    row = {"id": key, "name": f"n{key}", **cols}
    before = row if op in (Op.UPDATE, Op.DELETE) else None
    after = None if op is Op.DELETE else row
    return ChangeEvent(TABLE, op, (key,), Position(lsn, seq), before=before, after=after)


def rows(spark: Any, path: str) -> list[Any]:
    return list(spark.read.format("delta").load(path).collect())


def history(spark: Any, path: str) -> list[Any]:
    return list(spark.sql(f"DESCRIBE HISTORY delta.{quote_ident(path)}").collect())


def _emission(table: TableId, wid: str, lsn: int, dropped: set[Any]) -> ChunkEmission:
    from dblog.core.events import Window

    window = Window(wid, table, low=f"{wid}-lw", high=f"{wid}-hw")
    return ChunkEmission(window, Position(lsn, 0), frozenset(dropped), None)


def chunk(spark: Any, sink: DeltaSink, em: ChunkEmission, selected: list[tuple[Any, ...]],
          batch: int, attempt: WriteAttempt, *, ddl: str = "id INT, name STRING",
          key: tuple[str, ...] = ("id",), parts: int = 1) -> ChunkFiles:
    """Play a capture's part: ``selected`` rows (in any order), read in key order by
    ``parts`` selects and held, written as the changelog files the pin of ``em`` for
    ``batch`` and ``attempt`` asks for (nothing committed)."""
    table = em.window.table
    schema = StructType.fromDDL(ddl)
    assert isinstance(schema, StructType)
    ordered = sorted(selected)
    # as Arrow, as a capture's rows come from the source: no Python worker processes
    df = frame_of_columns(spark, schema, [[r[i] for r in ordered]
                                          for i in range(len(schema.fields))])
    df = (df.repartitionByRange(parts, *key) if parts > 1 else df.coalesce(1)) \
        .sortWithinPartitions(*key)
    tagged = df.withColumn("_o", F.monotonically_increasing_id()).localCheckpoint()
    counts = {int(r[0]): int(r[1]) for r in tagged.groupBy(
        F.shiftright("_o", PARTITION_SHIFT)).count().collect()}
    pin = ChunkPin(em.window.window_id, batch, attempt.id, em.position.lsn, em.position.seq,
                   em.commit_ts_ms, tuple(em.dropped_keys))
    return write_chunk_files(spark, sink.layout.changelog(table), source=sink.layout.source,
                             table=table, chunk=tagged, key=key, order_column="_o",
                             offsets=read_order_offsets(counts), selected=len(selected),
                             pin=pin)


def emit(spark: Any, sink: DeltaSink, batch: int, emissions: list[tuple[ChunkEmission, list[
        tuple[Any, ...]]]], *, events: list[ChangeEvent] | None = None,
         coverage: dict[str, Any] | None = None, truncates: list[Position] | None = None,
         metadata: dict[str, Any] | None = None, merge_mirror: bool = True,
         table: TableId | None = None, **chunk_options: Any) -> list[tuple[str, int, int]]:
    """A batch of ``emissions`` (each with its selected rows), written the way the tailer
    writes it: each chunk's files by its capture for the batch's attempt, then the batch.
    Each emission's (window, rows emitted, rows deleted)."""
    attempt = WriteAttempt()
    tbl = table or (emissions[0][0].window.table if emissions else TABLE)
    tb = TableBatch(tbl, events or [], emissions=[em for em, _ in emissions],
                    coverage=coverage or {}, truncates=truncates or [])
    for em, selected in emissions:
        tb.chunks[em.window.window_id] = chunk(spark, sink, em, selected, batch, attempt,
                                               **chunk_options)
    _, results = sink.write_table_batch(tb, batch, metadata or {}, attempt=attempt,
                                        merge_mirror=merge_mirror)
    return [(r.window_id, r.rows_emitted, r.rows_deleted) for r in results]


def named(ids: list[int], prefix: str = "r") -> list[tuple[Any, ...]]:
    return [(i, f"{prefix}{i}") for i in ids]


# ---- 1. chunks written once -----------------------------------------------------------


def test_a_chunk_is_written_once_and_its_files_are_committed_as_written(
    spark: Any, tmp_path: Path
) -> None:
    """The capture's files change nothing until the batch's commit adds them: no version,
    no row; that commit adds exactly those files (no rewrite) beside the batch's events."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    path = sink.layout.changelog(TABLE)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 9, 100)]), 1, {})
    version = history(spark, path)[0]["version"]
    attempt = WriteAttempt()
    em = _emission(TABLE, "w1", 500, {(2,)})
    files = chunk(spark, sink, em, named([4, 1, 3, 2]), 2, attempt, parts=2)
    assert history(spark, path)[0]["version"] == version
    assert len(rows(spark, path)) == 1
    assert files.rows == 3 and files.selected == 4
    tb = TableBatch(TABLE, [ev(Op.CREATE, 7, 400)], emissions=[em], chunks={"w1": files})
    _, results = sink.write_table_batch(tb, 2, {}, attempt=attempt)
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(3, 0)]
    added = {json.loads(a)["add"]["path"] for a in files.actions}
    log = [json.loads(line) for line in
           Path(path, "_delta_log", f"{version + 1:020d}.json").read_text().splitlines()]
    committed = {a["add"]["path"] for a in log if "add" in a}
    assert added < committed and len(committed) == len(added) + 1  # + the events' file
    batch2 = sorted((r for r in rows(spark, path) if r["_dblog_batch"] == 2),
                    key=lambda r: (r["_dblog_lsn"], r["_dblog_seq"]))
    assert [(r["op"], r["_dblog_lsn"], r["_dblog_seq"], (r["after"] or {})["id"])
            for r in batch2] == [("c", 400, 0, 7), ("r", 500, 1, 1), ("r", 500, 3, 3),
                                 ("r", 500, 4, 4)]
    assert {r[ATTEMPT_COLUMN] for r in batch2} == {attempt.id}
    assert {r["_dblog_window_id"] for r in batch2 if r["op"] == "r"} == {"w1"}


def test_a_chunk_and_its_batch_are_written_without_python_worker_processes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark turns a DataFrame of Python rows into its own rows in Python worker processes
    started with ``$PYSPARK_PYTHON`` or ``python3`` from PATH, not dblog's interpreter: where
    that ``python3`` was another version, every chunk's write failed (the pin's values and
    the dropped keys were such frames). Here no worker can start, and a chunk with a dropped
    key, the batch that commits it with a coverage delete, and the merge all go through."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(
        TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in range(1, 12)]), 1, {})
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(tmp_path / "no-such-python"))
    selected = named([i for i in range(1, 11) if i != 3])
    assert emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, {(7,)}), selected)],
                coverage={"w1": KeyRange((0,), (10,))}) == [("w1", 8, 1)]
    mirror = {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))}
    assert sorted(mirror) == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]  # 3 gone, 7 dropped, 11 outside
    assert mirror[7] == "n7" and mirror[1] == "r1"


@pytest.mark.parametrize("name", ["_dblog_lsn", "_DBLOG_SEQ", "_dblog_window_id"])
def test_a_column_named_like_the_lakes_own_is_refused_with_what_to_do(
    spark: Any, tmp_path: Path, name: str
) -> None:
    """The mirror keeps its position in ``_dblog_lsn`` / ``_dblog_seq`` beside the table's
    columns, and the changelog a chunk row's window in ``_dblog_window_id`` (Spark compares
    names without case): a source column of such a name is refused by name, with what to
    do, before any table is made, and a DDL adding one changes nothing in the lake."""
    sink = make_sink(spark, tmp_path)
    clashing = TableSchema(TABLE, (*SCHEMA.columns, Column(name, "INT")), ("id",))
    with pytest.raises(DblogError, match=f"{name}.*reserve.*rename it in the source"):
        sink.ensure_schema(clashing)
    assert not Path(sink.layout.changelog(TABLE)).exists()
    assert not Path(sink.layout.mirror(TABLE)).exists()
    sink.ensure_schema(SCHEMA)
    with pytest.raises(DblogError, match=f"{name}.*reserve"):
        sink.ensure_schema(clashing)
    assert [c.name for c in make_sink(spark, tmp_path).known_columns(TABLE)] == ["id", "name"]


def test_files_written_for_an_earlier_attempt_are_written_again_with_this_ones_tags(
    spark: Any, tmp_path: Path
) -> None:
    """A tailer died after its pin was written for: its successor's commit reads those
    files and writes the same rows with its own batch and attempt (the positions come from
    the log, so they are the same)."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    em = _emission(TABLE, "w1", 500, {(2,)})
    earlier = chunk(spark, sink, em, named([1, 2, 3]), 4, WriteAttempt())
    attempt = WriteAttempt()
    tb = TableBatch(TABLE, emissions=[em], chunks={"w1": earlier})
    _, results = sink.write_table_batch(tb, 5, {}, attempt=attempt)
    assert [r.rows_emitted for r in results] == [2]
    log = sorted(rows(spark, sink.layout.changelog(TABLE)), key=lambda r: r["_dblog_seq"])
    assert [(r["_dblog_seq"], r["after"]["id"], r["_dblog_batch"], r[ATTEMPT_COLUMN])
            for r in log] == [(1, 1, 5, attempt.id), (3, 3, 5, attempt.id)]
    committed = {json.loads(a)["add"]["path"] for a in earlier.actions}
    assert not committed & set(spark.read.format("delta").load(
        sink.layout.changelog(TABLE)).inputFiles())


def test_a_batch_carries_its_markers_and_a_replay_of_a_landed_attempt_writes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    first = WriteAttempt()
    batch = TableBatch(TABLE, [ev(Op.CREATE, 1, 100), ev(Op.CREATE, 2, 101)])
    sink.write_table_batch(batch, 7, {"dblog.batch": 7}, attempt=first)
    replay = WriteAttempt(earlier=(first.id,))
    sink.write_table_batch(batch, 7, {"dblog.batch": 7}, attempt=replay)
    log = rows(spark, sink.layout.changelog(TABLE))
    assert len(log) == 2 and {r[ATTEMPT_COLUMN] for r in log} == {first.id}
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 2]
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        writes = [h for h in history(spark, path) if h["operation"] in ("WRITE", "MERGE")]
        assert len(writes) == 1
        assert json.loads(writes[0]["userMetadata"])["dblog.batch"] == 7
    assert sink.spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None


def test_a_replay_fences_off_the_attempt_it_replaces(spark: Any, tmp_path: Path) -> None:
    """A tailer frozen while writing batch 7 (attempt ``stale``) wakes after a newer tailer
    replayed the batch: its append is refused, as a lost leadership, and the changelog holds
    the batch once."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 6, {"dblog.batch": 6})
    stale = WriteAttempt()
    batch = TableBatch(TABLE, [ev(Op.CREATE, 2, 200), ev(Op.UPDATE, 1, 201)])
    replay = WriteAttempt(earlier=(stale.id,))
    sink.write_table_batch(batch, 7, {"dblog.batch": 7}, attempt=replay)
    with pytest.raises(LeadershipLost, match="fenced off"):
        sink.write_table_batch(batch, 7, {"dblog.batch": 7}, attempt=stale)
    log = rows(spark, sink.layout.changelog(TABLE))
    assert sorted((r["_dblog_lsn"], r[ATTEMPT_COLUMN] == replay.id) for r in log) == [
        (100, False), (200, True), (201, True)]
    # A third attempt (the replaying tailer froze too) finds the second one's commit.
    third = WriteAttempt(earlier=(stale.id, replay.id))
    sink.write_table_batch(batch, 7, {"dblog.batch": 7}, attempt=third)
    assert len(rows(spark, sink.layout.changelog(TABLE))) == 3
    # New batches (new attempts) pass every fence.
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.DELETE, 2, 300)]), 8, {"dblog.batch": 8})
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1]


def test_a_replay_of_a_batch_recorded_without_attempts_finds_its_commit(
    spark: Any, tmp_path: Path
) -> None:
    """An intent recorded by the version before write attempts: its batch may have landed
    with NULL attempts; the commit metadata tells."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    batch = TableBatch(TABLE, [ev(Op.CREATE, 1, 100)])
    meta = {"dblog.batch": 3, "dblog.from_lsn": 90, "dblog.to_lsn": 100}
    sink.write_table_batch(batch, 3, meta)
    sink.write_table_batch(batch, 3, meta, attempt=WriteAttempt(legacy_replay=True))
    assert len(rows(spark, sink.layout.changelog(TABLE))) == 1
    other = {"dblog.batch": 4, "dblog.from_lsn": 100, "dblog.to_lsn": 110}
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 2, 110)]), 4, other,
                           attempt=WriteAttempt(legacy_replay=True))
    assert len(rows(spark, sink.layout.changelog(TABLE))) == 2


def test_a_changelog_without_the_attempt_column_gets_it(spark: Any, tmp_path: Path) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    path = sink.layout.changelog(TABLE)
    old = spark.read.format("delta").load(path).drop(ATTEMPT_COLUMN)
    old.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    sink = make_sink(spark, tmp_path)  # a new process
    first = WriteAttempt()
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 1, {"dblog.batch": 1},
                           attempt=first)
    replay = WriteAttempt(earlier=(first.id,))
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 1, {"dblog.batch": 1},
                           attempt=replay)
    assert [r[ATTEMPT_COLUMN] for r in rows(spark, path)] == [first.id]


@pytest.mark.parametrize("with_truncate", [False, True], ids=["log events", "with a truncate"])
def test_a_batch_is_one_changelog_file_in_position_order(
    spark: Any, tmp_path: Path, with_truncate: bool
) -> None:
    """Log events reach Spark in several partitions; the commit still adds one file whose
    rows are in position order (events alone are joined without a shuffle, a batch with a
    truncate is sorted)."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    events = [ev(Op.CREATE if i % 3 else Op.UPDATE, i % 97, 1000 + i // 2, i % 2)
              for i in range(3000)]
    batch = TableBatch(TABLE, events, truncates=[Position(1700)] if with_truncate else [])
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = sink.spark.conf.get(key)
    sink.spark.conf.set(key, "100")  # 30 Arrow batches, spread over the partitions
    try:
        assert sink.changelog._events_df(batch, sink.known_columns(TABLE), 1, WriteAttempt().id)\
            .rdd.getNumPartitions() > 1
        sink.write_table_batch(batch, 1, {"dblog.batch": 1}, merge_mirror=False)
    finally:
        sink.spark.conf.set(key, previous)
    changelog = sink.layout.changelog(TABLE)
    files = [r["path"] for r in spark.read.format("delta").load(changelog)
             .select(F.input_file_name().alias("path")).distinct().collect()]
    assert len(files) == 1
    table = pq.read_table(files[0].removeprefix("file:"), columns=["_dblog_lsn", "_dblog_seq"])
    positions = list(zip(table.column("_dblog_lsn").to_pylist(),
                         table.column("_dblog_seq").to_pylist(), strict=True))
    assert len(positions) == 3000 + with_truncate
    assert positions == sorted(positions)


# ---- 2. a crash between the three ALTERs of a new column ---------------------------------


def _field_names(spark: Any, path: str, struct: str | None = None) -> set[str]:
    schema = spark.read.format("delta").load(path).schema
    if struct is not None:
        schema = schema[struct].dataType
    return {f.name for f in schema.fields}


def test_adding_a_column_resumes_after_a_crash_between_the_alters(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    changelog = sink.layout.changelog(TABLE)
    # The first of the three ALTERs ran, then the process died.
    spark.sql(f"ALTER TABLE delta.{quote_ident(changelog)} ADD COLUMNS (before.extra STRING)")
    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("extra", "STRING")), ("id",))
    restarted = make_sink(spark, tmp_path)
    restarted.ensure_schema(wider)
    assert "extra" in _field_names(spark, changelog, "before")
    assert "extra" in _field_names(spark, changelog, "after")
    assert "extra" in _field_names(spark, sink.layout.mirror(TABLE))
    restarted.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100, extra="x")]), 1, {})
    assert [r["extra"] for r in rows(spark, sink.layout.mirror(TABLE))] == ["x"]


def _together(start: threading.Barrier, failures: list[BaseException], action: Any,
              schema: TableSchema) -> None:
    start.wait()
    try:
        action(schema)
    except BaseException as exc:
        failures.append(exc)


def test_two_writers_creating_the_lake_tables_at_once_both_go_on_with_every_column(
    spark: Any, tmp_path: Path
) -> None:
    """A capture creates a table's lake tables beside its first select while the tailer,
    at a high watermark, may create them from the log's schema, which can hold a column
    the capture's does not: neither fails, and the tailer's column is in the lake."""
    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("extra", "STRING")), ("id",))
    for round_ in range(3):
        layout = LakeLayout(tmp_path / f"lake{round_}", "src")
        capture, tailer = DeltaSink(spark, layout), DeltaSink(spark, layout)
        start = threading.Barrier(2)
        failures: list[BaseException] = []
        threads = [threading.Thread(target=_together, args=(start, failures, action, schema))
                   for action, schema in ((capture.ensure_tables, SCHEMA),
                                          (tailer.ensure_schema, wider))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert "extra" in _field_names(spark, layout.mirror(TABLE))
        assert "extra" in _field_names(spark, layout.changelog(TABLE), "after")
        tailer.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100, extra="x")]), 1, {})
        assert [r["extra"] for r in rows(spark, layout.mirror(TABLE))] == ["x"]


@pytest.mark.parametrize("unborn", ["changelog", "mirror"])
def test_a_creation_killed_before_its_first_commit_does_not_block_the_next_one(
    spark: Any, tmp_path: Path, unborn: str
) -> None:
    """A process killed while Delta created a lake table, after it made the table's log
    directory and before its first commit (found by the chaos test), left a directory in
    which Delta refuses to create the table (DELTA_TABLE_NOT_FOUND): every later capture
    and tailer failed there. The next creation removes that log, which holds nothing, and
    creates the table."""
    from dblog.lake.sink import changelog_schema, table_properties

    layout = LakeLayout(tmp_path / "lake", "src")
    sink = DeltaSink(spark, layout)
    if unborn == "mirror":
        sink.tables._create_table(layout.changelog(TABLE), changelog_schema(SCHEMA.columns),
                                  {**table_properties(SCHEMA.names), "dblog.key": '["id"]'})
    log_dir = Path(getattr(layout, unborn)(TABLE)) / "_delta_log"
    (log_dir / "_staged_commits").mkdir(parents=True)
    (log_dir / ".00000000000000000000.json.0d4c.tmp").write_text("{")
    sink.ensure_tables(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 1, {})
    assert [r["id"] for r in rows(spark, layout.mirror(TABLE))] == [1]
    assert [r["after"]["id"] for r in rows(spark, layout.changelog(TABLE))] == [1]


def test_a_delta_log_with_a_commit_is_never_removed(spark: Any, tmp_path: Path) -> None:
    layout = LakeLayout(tmp_path / "lake", "src")
    sink = DeltaSink(spark, layout)
    sink.ensure_tables(SCHEMA)
    assert not sink.tables._remove_unborn_log(layout.changelog(TABLE))
    assert rows(spark, layout.changelog(TABLE)) == []
    assert not sink.tables._remove_unborn_log(str(tmp_path / "nothing-here"))


def test_a_tailer_that_meets_a_captures_half_created_tables_adds_its_columns_to_both(
    spark: Any, tmp_path: Path
) -> None:
    """The race above, in the order that lost a column: the capture has created the
    changelog from its schema and not yet the mirror; the tailer's creation finds that
    changelog and creates the mirror from its wider schema. The changelog gets the
    tailer's column too (it once read back as complete from the mirror, and the log's
    values of that column had no place in the changelog)."""
    from dblog.lake.sink import changelog_schema, table_properties

    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("extra", "STRING")), ("id",))
    layout = LakeLayout(tmp_path / "lake", "src")
    capture, tailer = DeltaSink(spark, layout), DeltaSink(spark, layout)
    capture.tables._create_table(layout.changelog(TABLE), changelog_schema(SCHEMA.columns),
                                 {**table_properties(SCHEMA.names), "dblog.key": '["id"]'})
    tailer.ensure_schema(wider)
    capture.ensure_tables(SCHEMA)
    for side in ("before", "after"):
        assert "extra" in _field_names(spark, layout.changelog(TABLE), side)
    assert "extra" in _field_names(spark, layout.mirror(TABLE))
    assert tailer.key_columns(TABLE) == ("id",)
    tailer.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100, extra="x")]), 1, {})
    logged = rows(spark, layout.changelog(TABLE))
    assert [r["after"]["extra"] for r in logged] == ["x"]
    assert [r["extra"] for r in rows(spark, layout.mirror(TABLE))] == ["x"]


def test_a_tailer_restarted_after_creating_the_mirror_beside_a_narrower_changelog_completes_it(
    spark: Any, tmp_path: Path
) -> None:
    """The state the race above leaves when the tailer stops between creating the mirror
    and adding its column to the capture's changelog: a restarted tailer reads every
    column back from the mirror, yet adds the missing one to the changelog before it
    writes (it once stopped at every write there: the rows did not have the changelog's
    schema), and widens the changelog's narrower column too."""
    from dblog.lake.sink import changelog_schema, mirror_schema, table_properties

    narrow = TableSchema(TABLE, (*SCHEMA.columns, Column("amount", "INT")), ("id",))
    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("amount", "BIGINT"),
                                Column("extra", "STRING")), ("id",))
    layout = LakeLayout(tmp_path / "lake", "src")
    props = {**table_properties(narrow.names), "dblog.key": '["id"]'}
    creator = DeltaSink(spark, layout)
    creator.tables._create_table(layout.changelog(TABLE), changelog_schema(narrow.columns),
                                 props)
    creator.tables._create_table(layout.mirror(TABLE), mirror_schema(wider.columns), props)
    restarted = DeltaSink(spark, layout)
    restarted.ensure_schema(wider)
    for side in ("before", "after"):
        assert "extra" in _field_names(spark, layout.changelog(TABLE), side)
    big = 2**40
    restarted.write_table_batch(
        TableBatch(TABLE, [ev(Op.CREATE, 1, 100, extra="x", amount=big)]), 1, {})
    logged = rows(spark, layout.changelog(TABLE))
    assert [(r["after"]["extra"], r["after"]["amount"]) for r in logged] == [("x", big)]
    assert [(r["extra"], r["amount"]) for r in rows(spark, layout.mirror(TABLE))] == [("x", big)]


def _ask_key(sink: DeltaSink, delay: float, keys: list[tuple[str, ...]],
             failures: list[BaseException]) -> None:
    time.sleep(delay)
    try:
        keys.append(sink.key_columns(TABLE))
    except BaseException as exc:
        failures.append(exc)


def test_a_fresh_sink_learns_a_tables_columns_and_key_without_a_spark_job(
    spark: Any, tmp_path: Path
) -> None:
    make_sink(spark, tmp_path).ensure_tables(SCHEMA)
    fresh = make_sink(spark, tmp_path)  # a tailer meeting the tables a capture created
    group = f"known-columns-{time.monotonic_ns()}"
    spark.sparkContext.setJobGroup(group, "a fresh sink reads a table's columns and key")
    try:
        assert fresh.known_columns(TABLE) == list(SCHEMA.columns)
        assert fresh.key_columns(TABLE) == SCHEMA.key
        # Properties come from the snapshot's metadata; DESCRIBE DETAIL would count the
        # table's files and bytes first (Spark jobs over the Delta log: seconds, which the
        # first chunk's pin waited for).
        assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == []
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


def test_reading_a_tables_properties_leaves_the_threads_active_session_as_it_was(
    spark: Any, tmp_path: Path
) -> None:
    make_sink(spark, tmp_path).ensure_tables(SCHEMA)
    fresh = make_sink(spark, tmp_path)
    sessions = spark.sparkContext._jvm.org.apache.spark.sql.SparkSession
    # The mirror merger's thread runs with the mirror's session, whose SQL settings carry
    # its MERGE's idempotent-write markers; learning a table's columns must not switch it.
    mirror_session = fresh._mirror_spark._jsparkSession
    sessions.setActiveSession(mirror_session)
    try:
        assert fresh.known_columns(TABLE) == list(SCHEMA.columns)
        assert sessions.getActiveSession().get().equals(mirror_session)
    finally:
        sessions.setActiveSession(spark._jsparkSession)


def test_a_tables_file_count_comes_from_its_checksum_without_a_spark_job(
    spark: Any, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    from dblog.lake.deltalog import DeltaTxn

    path = str(tmp_path / "t")
    for n in range(3):  # a file per append
        spark.range(n * 10, n * 10 + 10).coalesce(1).write.format("delta").mode("append") \
            .save(path)
    group = f"file-count-{time.monotonic_ns()}"
    spark.sparkContext.setJobGroup(group, "a table's file count")
    try:
        counted = DeltaTxn(spark, path).file_count
        # numOfFiles would reconstruct the table's state first (Spark jobs: seconds on a
        # table read for the first time, which a capture's first chunk waited for).
        assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == []
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    detail = DeltaTable.forPath(spark, path).detail().select("numFiles").first()
    assert detail is not None and counted == detail[0] == 3


def test_an_empty_tables_span_check_plans_nothing_and_any_new_file_conflicts_with_it(
    spark: Any, tmp_path: Path
) -> None:
    """A mirror before its first append: the span check answers "no file, no row" from the
    checksum, without a Spark job, and still makes a commit fail when another writer
    added rows meanwhile (anywhere: the whole empty table counts as read)."""
    from delta.tables import DeltaTable

    from dblog.lake.deltalog import DeltaTxn

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    txn = DeltaTxn(spark, mirror)
    group = f"span-check-{time.monotonic_ns()}"
    spark.sparkContext.setJobGroup(group, "a span check on an empty table")
    try:
        assert txn.records_where(F.col("id").between(1, 10)) == (0, 0)
        assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == []
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    late = spark.createDataFrame([(500, "late", 1, 1)],
                                 "id INT, name STRING, _dblog_lsn BIGINT, _dblog_seq BIGINT")
    (DeltaTable.forPath(spark, mirror).alias("t").merge(late.alias("s"), "t.id = s.id")
     .whenNotMatchedInsertAll().execute())
    schema = StructType.fromJson(json.loads(txn.schema_json))
    ours = spark.createDataFrame([(1, "r1", 2, 1)], schema)
    with pytest.raises(Exception, match="CONCURRENT_APPEND"):
        txn.commit(txn.write_files(ours), {})


def test_threads_asking_a_fresh_sink_for_a_tables_key_at_once_all_get_it(
    spark: Any, tmp_path: Path
) -> None:
    """A restarted tailer's mirror merger asks for a table's key while its batch thread reads
    the same table's columns for the first time: whichever reads the lake, each gets the
    key (it once came back missing while another thread had cached only the columns)."""
    layout = LakeLayout(tmp_path / "lake", "src")
    DeltaSink(spark, layout).ensure_schema(SCHEMA)
    for _ in range(3):
        fresh = DeltaSink(spark, layout)  # nothing cached, as after a restart
        keys: list[tuple[str, ...]] = []
        failures: list[BaseException] = []
        threads = [threading.Thread(target=_ask_key, args=(fresh, 0.01 * i, keys, failures))
                   for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert keys == [("id",)] * 12


# ---- 3. values decoded with an older, narrower type ---------------------------------------


def test_date_widened_to_datetime_takes_old_date_values_in_the_same_batch(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    narrow = TableSchema(TABLE, (*SCHEMA.columns, Column("d", "DATE")), ("id",))
    sink.ensure_schema(narrow)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100, d=date(2024, 1, 1))]), 1, {})
    wide = TableSchema(TABLE, (*SCHEMA.columns, Column("d", "TIMESTAMP_NTZ")), ("id",))
    sink.ensure_schema(wide)
    batch = TableBatch(TABLE, [
        ev(Op.UPDATE, 1, 200, d=date(2024, 1, 2)),  # decoded before the ALTER
        ev(Op.CREATE, 2, 201, d=datetime(2024, 1, 3, 4, 5, 6)),
    ])
    sink.write_table_batch(batch, 2, {})
    mirror = {r["id"]: r["d"] for r in rows(spark, sink.layout.mirror(TABLE))}
    assert mirror == {1: datetime(2024, 1, 2), 2: datetime(2024, 1, 3, 4, 5, 6)}
    changelog = {(r["_dblog_lsn"], r["after"]["d"])
                 for r in rows(spark, sink.layout.changelog(TABLE)) if r["_dblog_batch"] == 2}
    assert changelog == {(200, datetime(2024, 1, 2)), (201, datetime(2024, 1, 3, 4, 5, 6))}


def test_int_widened_to_bigint_and_float_to_double(spark: Any, tmp_path: Path) -> None:
    sink = make_sink(spark, tmp_path)
    cols = (Column("id", "INT"), Column("n", "INT"), Column("f", "FLOAT"))
    sink.ensure_schema(TableSchema(TABLE, cols, ("id",)))
    first = ChangeEvent(TABLE, Op.CREATE, (1,), Position(100),
                        after={"id": 1, "n": 5, "f": 1.5})
    sink.write_table_batch(TableBatch(TABLE, [first]), 1, {})
    sink.ensure_schema(TableSchema(
        TABLE, (Column("id", "INT"), Column("n", "BIGINT"), Column("f", "DOUBLE")), ("id",)))
    second = ChangeEvent(TABLE, Op.CREATE, (2,), Position(200),
                         after={"id": 2, "n": 2**40, "f": 2})
    sink.write_table_batch(TableBatch(TABLE, [second]), 2, {})
    mirror = {r["id"]: (r["n"], r["f"]) for r in rows(spark, sink.layout.mirror(TABLE))}
    assert mirror == {1: (5, 1.5), 2: (2**40, 2.0)}


# ---- 4. readable by non-Spark readers -----------------------------------------------------


def test_a_fresh_changelog_and_mirror_are_readable_by_delta_rs(
    spark: Any, tmp_path: Path
) -> None:
    """Also for a table whose names need escaping in its path (delta-rs reads ``%XX`` in a
    path as an escape, so the lake's paths never contain ``%``)."""
    deltalake = pytest.importorskip("deltalake")
    sink = make_sink(spark, tmp_path)
    odd = TableId('Odd "db" ünï %20', "My Table ~7E/..")
    sink.ensure_schema(TableSchema(odd, SCHEMA.columns, SCHEMA.key))

    def odd_event(event: ChangeEvent) -> ChangeEvent:
        return ChangeEvent(odd, event.op, event.key, event.position, event.before,
                           event.after)

    batch = TableBatch(odd, [odd_event(e) for e in (
        ev(Op.CREATE, 1, 100), ev(Op.CREATE, 2, 101),
        ev(Op.UPDATE, 2, 102, name="two"), ev(Op.DELETE, 1, 103),
    )])
    sink.write_table_batch(batch, 1, {"dblog.batch": 1})
    mirror = deltalake.DeltaTable(sink.layout.mirror(odd)).to_pyarrow_table().to_pylist()
    assert mirror == [{"id": 2, "name": "two", "_dblog_lsn": 102, "_dblog_seq": 0}]
    changelog = sorted(
        deltalake.DeltaTable(sink.layout.changelog(odd)).to_pyarrow_table().to_pylist(),
        key=lambda r: (r["_dblog_lsn"], r["_dblog_seq"]),
    )
    assert [(r["op"], r["_dblog_lsn"]) for r in changelog] == [
        ("c", 100), ("c", 101), ("u", 102), ("d", 103)]
    assert changelog[2]["after"] == {"id": 2, "name": "two"}
    assert changelog[3]["before"] == {"id": 1, "name": "n1"} and changelog[3]["after"] is None
    for path in (sink.layout.changelog(odd), sink.layout.mirror(odd)):
        assert "delta.enableTypeWidening" not in sink.tables.properties(path)


def test_type_widening_is_enabled_only_when_a_column_widens(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    narrow = TableSchema(TABLE, (*SCHEMA.columns, Column("n", "INT")), ("id",))
    sink.ensure_schema(narrow)
    sink.ensure_schema(TableSchema(TABLE, (*SCHEMA.columns, Column("n", "BIGINT")), ("id",)))
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        assert sink.tables.properties(path).get("delta.enableTypeWidening") == "true"
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100, n=2**40)]), 1, {})
    assert [r["n"] for r in rows(spark, sink.layout.mirror(TABLE))] == [2**40]
    log = rows(spark, sink.layout.changelog(TABLE))
    assert [r["after"]["n"] for r in log] == [2**40]


# ---- 5. capture deletes: mirror keys a complete chunk read did not return -----------------


def _read_backs(sink: DeltaSink, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The changelog versions the sink reads emission counts back from, as it reads them."""
    reads: list[int] = []
    read_back = sink.attempts.committed_rows

    def counted(table: TableId, version: int) -> Any:
        reads.append(version)
        return read_back(table, version)

    monkeypatch.setattr(sink.attempts, "committed_rows", counted)
    return reads


def test_emission_counts_come_from_the_files_statistics_not_the_changelog(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An emission's ``r`` rows are counted by its files' statistics and its ``d`` rows by
    the deletes' files: nothing is read back, whatever the batch holds beside it."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (20, 21)]),
                           1, {})
    reads = _read_backs(sink, monkeypatch)
    monkeypatch.setattr(sink.attempts, "_find_commit", lambda *a: pytest.fail("history read"))
    assert emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, {(2,)}), named([1, 2, 3, 4]))]) \
        == [("w1", 3, 0)]
    assert emit(spark, sink, 3, [(_emission(TABLE, "w2", 601, set()), named([5, 6])),
                                 (_emission(TABLE, "w3", 602, set()), named([7]))],
                events=[ev(Op.CREATE, 9, 600)]) == [("w2", 2, 0), ("w3", 1, 0)]
    assert emit(spark, sink, 4, [(_emission(TABLE, "w4", 700, set()), [])]) == [("w4", 0, 0)]
    assert emit(spark, sink, 5, [(_emission(TABLE, "w5", 800, set()), named([20]))],
                coverage={"w5": KeyRange((19,), (22,))}) == [("w5", 1, 1)]
    assert reads == []


def test_the_mirror_holds_rows_in_a_coverage_or_not(spark: Any, tmp_path: Path) -> None:
    """Where the mirror holds no row in a chunk's coverage (a capture into new keys) the
    chunk can delete none: the tailer then gives it no coverage."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    assert not sink.mirror_holds(TABLE, KeyRange(None, None))  # no lake table yet
    sink.ensure_schema(SCHEMA)
    assert not sink.mirror_holds(TABLE, KeyRange(None, None))
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    assert sink.mirror_holds(TABLE, KeyRange((0,), (5,)))
    assert sink.mirror_holds(TABLE, KeyRange((1,), None))
    assert not sink.mirror_holds(TABLE, KeyRange((2,), (20,)))
    assert not sink.mirror_holds(TABLE, KeyRange(None, (0,)))


@pytest.mark.parametrize("order", ["check, write, merge", "check, merge, write",
                                   "merge, check, write"])
def test_the_mirror_check_answers_as_well_whenever_it_runs_before_the_write(
    spark: Any, tmp_path: Path, order: str
) -> None:
    """The tailer asks whether the mirror holds a row in a chunk's coverage in a thread of
    its own, so a merge of earlier batches may land before or after it and before or after
    the batch's write. Whichever order, the chunk deletes exactly the mirror key the source
    lost without a log change saying so (4), and nothing the log deleted or added: here a
    merge turns the answer for one chunk from yes to no (1-3 deleted by the log) and for
    another from no to yes (12 inserted by the log)."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3, 4)]),
                           1, {})
    sink.write_table_batch(
        TableBatch(TABLE, [ev(Op.DELETE, i, 200 + i) for i in (1, 2, 3)]
                   + [ev(Op.CREATE, 12, 210)]), 2, {}, merge_mirror=False)
    emissions = [(_emission(TABLE, "w1", 500, set()), [], KeyRange((0,), (3,))),
                 (_emission(TABLE, "w2", 501, set()), [], KeyRange((3,), (5,))),
                 (_emission(TABLE, "w3", 502, set()), named([12]), KeyRange((10,), (20,)))]
    answers: dict[str, bool] = {}
    results: list[tuple[str, int, int]] = []
    for step in order.split(", "):
        if step == "check":
            answers = {em.window.window_id: sink.mirror_holds(TABLE, covered)
                       for em, _, covered in emissions}
        elif step == "merge":
            sink.merge_mirror(TABLE, 2, {})
        else:
            results = emit(spark, sink, 3, [(em, selected) for em, selected, _ in emissions],
                           coverage={em.window.window_id: covered
                                     for em, _, covered in emissions
                                     if answers[em.window.window_id]},
                           merge_mirror=False)
    sink.merge_mirror(TABLE, 3, {})
    merged_first = order.startswith("merge")
    assert answers == {"w1": not merged_first, "w2": True, "w3": merged_first}
    assert results == [("w1", 0, 0), ("w2", 0, 1), ("w3", 1, 0)]
    assert {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))} == {12: "r12"}


def test_a_covered_chunk_deletes_the_mirror_keys_it_did_not_read(
    spark: Any, tmp_path: Path
) -> None:
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(
        TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in range(1, 12)]), 1, {})
    selected = named([i for i in range(1, 11) if i != 3])
    assert emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, {(7,)}), selected)],
                coverage={"w1": KeyRange((0,), (10,))}) == [("w1", 8, 1)]
    mirror = {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))}
    assert sorted(mirror) == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]  # 3 gone, 7 dropped, 11 outside
    assert mirror[7] == "n7" and mirror[11] == "n11" and mirror[1] == "r1"
    log = sorted((r for r in rows(spark, sink.layout.changelog(TABLE)) if r["_dblog_batch"] == 2),
                 key=lambda r: r["_dblog_seq"])
    # the nine selected rows take 1-9 (7, dropped, leaves 6 unused); the delete comes after
    assert [(r["op"], r["_dblog_seq"]) for r in log] == [
        ("r", 1), ("r", 2), ("r", 3), ("r", 4), ("r", 5), ("r", 7), ("r", 8), ("r", 9),
        ("d", 10)]
    gone = log[-1]
    assert gone["before"].asDict() == {"id": 3, "name": "n3"} and gone["after"] is None
    assert gone["_dblog_lsn"] == 500 and gone["_dblog_window_id"] == "w1"


def test_an_emission_replayed_after_its_changelog_commit_merges_what_the_changelog_holds(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the changelog commit and the MERGE: the replay writes nothing, and
    the mirror and the counts come from the commit written before, found in the history
    behind a later commit (a column added in between)."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {"dblog.batch": 1})
    em = _emission(TABLE, "w1", 500, set())
    crashed = WriteAttempt()
    files = chunk(spark, sink, em, named([1, 3]), 2, crashed)

    def batch() -> TableBatch:
        return TableBatch(TABLE, emissions=[em], chunks={"w1": files},
                          coverage={"w1": KeyRange((0,), (5,))})

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed between the changelog and the mirror")

    monkeypatch.setattr(sink.merger, "_merge_mirror", crash)
    with pytest.raises(RuntimeError):
        sink.write_table_batch(batch(), 2, {"dblog.batch": 2}, attempt=crashed)
    monkeypatch.undo()
    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("extra", "STRING")), ("id",))
    sink.ensure_schema(wider)
    assert history(spark, sink.layout.changelog(TABLE))[0]["operation"] != "WRITE"

    _, results = make_sink(spark, tmp_path).write_table_batch(
        batch(), 2, {"dblog.batch": 2}, attempt=WriteAttempt(earlier=(crashed.id,)))
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(2, 1)]
    mirror = {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))}
    assert mirror == {1: "r1", 3: "r3"}
    log = [r for r in rows(spark, sink.layout.changelog(TABLE)) if r["_dblog_batch"] == 2]
    assert sorted((r["op"], r["_dblog_seq"]) for r in log) == [("d", 3), ("r", 1), ("r", 2)]


def test_without_coverage_a_chunk_deletes_nothing(spark: Any, tmp_path: Path) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    assert emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, set()), named([1]))]) \
        == [("w1", 1, 0)]
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 2]


COMPOSITE = TableId("shop", "lines")
COMPOSITE_SCHEMA = TableSchema(
    COMPOSITE, (Column("o", "INT"), Column("l", "STRING"), Column("qty", "INT")), ("o", "l"))


def test_composite_key_coverage_is_lexicographic(spark: Any, tmp_path: Path) -> None:
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(COMPOSITE_SCHEMA)
    keys = [(1, "b"), (1, "c"), (2, "a"), (2, "m"), (2, "z"), (3, "a")]
    sink.write_table_batch(TableBatch(COMPOSITE, [
        ChangeEvent(COMPOSITE, Op.CREATE, k, Position(100 + i), after={"o": k[0], "l": k[1],
                                                                        "qty": i})
        for i, k in enumerate(keys)
    ]), 1, {})
    # Coverage ((1,'b'), (2,'m')]: (1,'b') is the exclusive lower bound, (2,'m') inclusive.
    assert emit(spark, sink, 2, [(_emission(COMPOSITE, "w1", 500, set()), [(2, "a", 9)])],
                coverage={"w1": KeyRange((1, "b"), (2, "m"))}, ddl="o INT, l STRING, qty INT",
                key=("o", "l")) == [("w1", 1, 2)]
    mirror = sorted((r["o"], r["l"]) for r in rows(spark, sink.layout.mirror(COMPOSITE)))
    assert mirror == [(1, "b"), (2, "a"), (2, "z"), (3, "a")]
    log = sorted((r for r in rows(spark, sink.layout.changelog(COMPOSITE))
                  if r["_dblog_batch"] == 2), key=lambda r: r["_dblog_seq"])
    assert [(r["op"], r["_dblog_seq"]) for r in log] == [("r", 1), ("d", 2), ("d", 3)]
    assert [(r["before"] or r["after"])["l"] for r in log] == ["a", "c", "m"]


# ---- 6. TRUNCATE / DROP ---------------------------------------------------------------------


def test_a_truncate_empties_the_mirror_at_its_position(spark: Any, tmp_path: Path) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    batch = TableBatch(
        TABLE,
        events=[ev(Op.UPDATE, 1, 200, name="before"), ev(Op.CREATE, 4, 201),
                ev(Op.CREATE, 5, 300), ev(Op.UPDATE, 2, 301, name="again")],
        truncates=[Position(250, 0)],
    )
    sink.write_table_batch(batch, 2, {})
    mirror = {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))}
    assert mirror == {5: "n5", 2: "again"}
    log = sorted((r for r in rows(spark, sink.layout.changelog(TABLE)) if r["_dblog_batch"] == 2),
                 key=lambda r: (r["_dblog_lsn"], r["_dblog_seq"]))
    assert [(r["op"], r["_dblog_lsn"]) for r in log] == [
        ("u", 200), ("c", 201), ("t", 250), ("c", 300), ("u", 301)]
    assert log[2]["before"] is None and log[2]["after"] is None


def test_a_batch_of_only_a_truncate(spark: Any, tmp_path: Path) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    sink.write_table_batch(TableBatch(TABLE, truncates=[Position(300, 0)]), 2, {})
    assert rows(spark, sink.layout.mirror(TABLE)) == []
    assert [r["op"] for r in rows(spark, sink.layout.changelog(TABLE))
            if r["_dblog_batch"] == 2] == ["t"]


def test_keys_the_batch_changed_before_the_high_watermark_are_not_deleted_again(
    spark: Any, tmp_path: Path
) -> None:
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    # Key 2 is deleted by the log in this batch before the window opened: already a `d`.
    assert emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, set()), named([1]))],
                events=[ev(Op.DELETE, 2, 200)],
                coverage={"w1": KeyRange(None, (3,))}) == [("w1", 1, 1)]
    log = sorted((r for r in rows(spark, sink.layout.changelog(TABLE)) if r["_dblog_batch"] == 2),
                 key=lambda r: (r["_dblog_lsn"], r["_dblog_seq"]))
    assert [(r["op"], (r["before"] or r["after"])["id"]) for r in log] == [
        ("d", 2), ("r", 1), ("d", 3)]
    assert [r["id"] for r in rows(spark, sink.layout.mirror(TABLE))] == [1]


def test_chunk_rows_before_a_truncate_reach_the_changelog_but_not_the_mirror(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    assert emit(spark, sink, 1, [(_emission(TABLE, "w1", 500, set()), named([1, 2]))],
                events=[ev(Op.CREATE, 3, 700)], truncates=[Position(600, 0)]) \
        == [("w1", 2, 0)]
    assert [r["id"] for r in rows(spark, sink.layout.mirror(TABLE))] == [3]
    log = sorted(rows(spark, sink.layout.changelog(TABLE)),
                 key=lambda r: (r["_dblog_lsn"], r["_dblog_seq"]))
    assert [r["op"] for r in log] == ["r", "r", "t", "c"]


def test_a_new_column_with_an_unsafe_name_turns_column_mapping_on(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    assert "delta.columnMapping.mode" not in sink.tables.properties(sink.layout.mirror(TABLE))
    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("unit price", "DECIMAL(10,2)"),
                                Column("seen", "TIMESTAMP_NTZ")), ("id",))
    sink.ensure_schema(wider)
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        assert sink.tables.properties(path)["delta.columnMapping.mode"] == "name"
    event = ChangeEvent(TABLE, Op.CREATE, (1,), Position(100), after={
        "id": 1, "name": "a", "unit price": 3, "seen": datetime(2024, 5, 6, 7, 8, 9)})
    sink.write_table_batch(TableBatch(TABLE, [event]), 1, {})
    (row,) = rows(spark, sink.layout.mirror(TABLE))
    assert str(row["unit price"]) == "3.00" and row["seen"] == datetime(2024, 5, 6, 7, 8, 9)


# ---- 7. every canonical type, exactly ------------------------------------------------------


ALL_TYPES = TableSchema(TABLE, (
    Column("id", "INT"), Column("b", "BOOLEAN"), Column("i8", "TINYINT"),
    Column("i16", "SMALLINT"), Column("i64", "BIGINT"), Column("u64", "DECIMAL(20,0)"),
    Column("dec", "DECIMAL(38,10)"), Column("f", "FLOAT"), Column("d", "DOUBLE"),
    Column("s", "STRING"), Column("bin", "BINARY"), Column("day", "DATE"),
    Column("ts", "TIMESTAMP"), Column("ntz", "TIMESTAMP_NTZ"),
    Column("a_ntz", "ARRAY<TIMESTAMP_NTZ>"), Column("a_dec", "ARRAY<DECIMAL(6,2)>"),
    Column("a_s", "ARRAY<STRING>"),
), ("id",))


def test_every_canonical_type_round_trips_exactly_through_changelog_and_mirror(
    spark: Any, tmp_path: Path
) -> None:
    """Extremes, NULLs, unicode and zero bytes in each canonical type, through the batch
    writer (log images) into the changelog and the mirror, read back unchanged."""
    from datetime import UTC
    from decimal import Decimal

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(ALL_TYPES)
    values: list[dict[str, Any]] = [
        {"id": 1, "b": True, "i8": -128, "i16": 32767, "i64": -(2**63), "u64": Decimal(2**64 - 1),
         "dec": Decimal("-1234567890123456789012345678.0123456789"), "f": 1.5,
         "d": -1.7976931348623157e308, "s": "naïve ☃ 🚀 'q' \"dq\" \\", "bin": b"\x00\xff\x00",
         "day": date(1000, 1, 1), "ts": datetime(1970, 1, 1, 0, 0, 1, 123456, tzinfo=UTC),
         "ntz": datetime(9999, 12, 31, 23, 59, 59, 999999),
         "a_ntz": [datetime(1000, 1, 1), None], "a_dec": [Decimal("-9999.99"), None],
         "a_s": ["", None, "☃"]},
        {"id": 2, "b": False, "i8": 127, "i16": -32768, "i64": 2**63 - 1, "u64": Decimal(0),
         "dec": Decimal("0E-10"), "f": -0.0, "d": 5e-324, "s": "", "bin": b"",
         "day": date(9999, 12, 31), "ts": datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC),
         "ntz": datetime(1000, 1, 1), "a_ntz": [], "a_dec": [], "a_s": []},
        {"id": 3, **{c.name: None for c in ALL_TYPES.columns[1:]}},
    ]
    events = [ChangeEvent(TABLE, Op.CREATE, (v["id"],), Position(100 + v["id"]), after=v)
              for v in values]
    updated = {**values[0], "s": "updated"}
    events.append(ChangeEvent(TABLE, Op.UPDATE, (1,), Position(200), before=values[0],
                              after=updated))
    sink.write_table_batch(TableBatch(TABLE, events), 1, {})

    def as_python(row: Any) -> dict[str, Any]:
        out = row.asDict()
        if out["ts"] is not None:  # the session time zone is UTC: naive UTC wall time
            out["ts"] = out["ts"].replace(tzinfo=UTC)
        out["bin"] = None if out["bin"] is None else bytes(out["bin"])
        return {k: out[k] for k in (c.name for c in ALL_TYPES.columns)}

    mirror = sorted((as_python(r) for r in rows(spark, sink.layout.mirror(TABLE))),
                    key=lambda r: r["id"])
    assert mirror == [updated, *values[1:]]
    log = sorted(rows(spark, sink.layout.changelog(TABLE)), key=lambda r: r["_dblog_lsn"])
    assert [r["op"] for r in log] == ["c", "c", "c", "u"]
    assert [as_python(r["after"]) for r in log] == [*values, updated]
    assert log[3]["before"] is not None and as_python(log[3]["before"]) == values[0]
    assert all(r["before"] is None for r in log[:3])
    assert log[0]["source"]["table"] == "items" and log[0]["_dblog_batch"] == 1


# ---- maintenance --------------------------------------------------------------------------


def test_maintenance_lists_a_small_table_in_a_few_tasks(spark: Any, tmp_path: Path) -> None:
    """VACUUM lists files in ``parallelPartitionDiscovery.parallelism`` tasks; Spark's
    default (10,000) made each vacuum of a small table minutes of task overhead, stalling
    the tailer that runs it between batches."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    for n in (1, 2):
        sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, n, n)]), n, {"dblog.batch": n})
    group = f"maintain-{tmp_path.name}"
    spark.sparkContext.setJobGroup(group, "maintenance task count")
    try:
        sink.maintain(TABLE, vacuum=True)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    stages = [tracker.getStageInfo(s) for job in jobs if job for s in job.stageIds]
    tasks = sum(stage.numTasks for stage in stages if stage)
    assert jobs and tasks < 1000, f"{len(jobs)} jobs ran {tasks} tasks"


# ---- 9. the mirror follows the changelog, several batches per MERGE -----------------------


def _log_actions(path: str) -> set[str]:
    """The kinds of actions (``add``, ``remove``, ``cdc``, ...) in a Delta table's commits."""
    kinds: set[str] = set()
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            kinds.update(json.loads(line))
    return kinds


def test_only_the_changelog_keeps_a_change_feed(spark: Any, tmp_path: Path) -> None:
    """The changelog is the change feed. A mirror MERGE that also wrote Delta's change data
    files (a pre- and a post-image of every updated row) would write them for nothing: the
    mirror is made without it, whatever the session's default."""
    from delta.tables import DeltaTable

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    for batch, events in enumerate(([ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)],
                                    [ev(Op.UPDATE, 1, 200, name="new"), ev(Op.DELETE, 2, 201)]),
                                   start=1):
        sink.write_table_batch(TableBatch(TABLE, events), batch, {})

    def change_feed(path: str) -> str | None:
        detail = DeltaTable.forPath(spark, path).detail().first()
        assert detail is not None
        return dict(detail["properties"]).get("delta.enableChangeDataFeed")

    layout = sink.layout
    assert change_feed(layout.changelog(TABLE)) == "true"
    assert change_feed(layout.mirror(TABLE)) == "false"
    assert {r["id"]: r["name"] for r in rows(spark, layout.mirror(TABLE))} == {1: "new", 3: "n3"}
    assert "cdc" not in _log_actions(layout.mirror(TABLE))


def test_a_checkpoint_every_hundred_commits(spark: Any, tmp_path: Path) -> None:
    """Delta writes a checkpoint in the commit that reaches the interval; at its default
    (10) that was a third of a small append's time. Both tables carry the interval; the
    changelog shows Delta keeps to it (the mirror's commits are MERGEs of ~4 s each, and
    twelve of them made this the suite's longest sink test)."""
    from dblog.lake.deltalog import DeltaTxn

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        assert DeltaTxn(spark, path).configuration()["delta.checkpointInterval"] == "100"
    for batch in range(1, 13):
        sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, batch, 100 + batch)]), batch,
                               {}, merge_mirror=False)
    sink.merge_mirror(TABLE, 12, {})
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        assert not list(Path(path, "_delta_log").glob("*.checkpoint*.parquet")), path
    assert len(list(Path(sink.layout.changelog(TABLE), "_delta_log").glob("*.json"))) > 10
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == list(range(1, 13))


def _merges(spark: Any, path: str) -> list[Any]:
    return [h for h in history(spark, path) if h["operation"] == "MERGE"]


def test_the_mirror_merges_several_batches_at_once_and_only_once(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {}, merge_mirror=False)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.UPDATE, 1, 200, name="new"),
                                              ev(Op.DELETE, 2, 201)]), 2, {}, merge_mirror=False)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 2, 300, name="back")]), 3, {},
                           merge_mirror=False)
    assert rows(spark, mirror) == []
    assert sink.merge_mirror(TABLE, 3, {}, through_lsn=300) == 6
    assert {r["id"]: (r["name"], r["_dblog_lsn"]) for r in rows(spark, mirror)} == {
        1: ("new", 200), 2: ("back", 300), 3: ("n3", 103)}
    merges = _merges(spark, mirror)
    assert len(merges) == 1 and json.loads(merges[0]["userMetadata"])[MIRROR_LSN] == 300
    # A sink started afresh reads where the mirror stands: nothing is merged twice.
    again = make_sink(spark, tmp_path)
    assert again.mirror_lsn(TABLE) == 300
    assert again.merge_mirror(TABLE, 3, {}) == 0
    assert len(_merges(spark, mirror)) == 1


def test_a_capture_delete_skips_keys_the_unmerged_changelog_already_deleted(
    spark: Any, tmp_path: Path
) -> None:
    """The mirror still holds key 2, but a batch it has not merged yet deleted it: the
    chunk's complete read must not delete it a second time."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.DELETE, 2, 200)]), 2, {}, merge_mirror=False)
    assert emit(spark, sink, 3, [(_emission(TABLE, "w1", 500, set()), named([1, 3]))],
                coverage={"w1": KeyRange((0,), (5,))}, merge_mirror=False) == [("w1", 2, 0)]
    sink.merge_mirror(TABLE, 3, {})
    assert {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))} == {
        1: "r1", 3: "r3"}


def test_a_capture_after_an_unmerged_truncate_deletes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """Rows the mirror still holds from before a truncate it has not merged yet are gone
    already: a complete chunk read writes no delete for them."""
    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    sink.write_table_batch(TableBatch(TABLE, truncates=[Position(200, 0)]), 2, {},
                           merge_mirror=False)
    assert emit(spark, sink, 3, [(_emission(TABLE, "w1", 500, set()), named([1]))],
                coverage={"w1": KeyRange((0,), (5,))}, merge_mirror=False) == [("w1", 1, 0)]
    sink.merge_mirror(TABLE, 3, {})
    assert {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))} == {1: "r1"}


def test_an_emission_without_rows_counts_none(spark: Any, tmp_path: Path) -> None:
    """A last chunk that reads nothing: no file, no commit for it, zero rows, and a replay
    (the tailer crashed before its commit in ZooKeeper) says the same."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 1, {"dblog.batch": 1})
    version = history(spark, sink.layout.changelog(TABLE))[0]["version"]
    em = _emission(TABLE, "w1", 500, set())
    meta = {"dblog.batch": 2, "dblog.from_lsn": 100, "dblog.to_lsn": 500}
    assert emit(spark, sink, 2, [(em, [])], metadata=meta) == [("w1", 0, 0)]
    assert history(spark, sink.layout.changelog(TABLE))[0]["version"] == version
    files = chunk(spark, sink, em, [], 2, WriteAttempt())
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[em], chunks={"w1": files}), 2, meta,
        attempt=WriteAttempt(earlier=(WriteAttempt().id,)))
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(0, 0)]


def test_unmerged_truncates_are_read_once_then_kept_by_the_sink(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the mirror lacks a truncate is read from the changelog once; then the sink
    keeps it: the truncates it writes add to it, each merge takes off what it covered."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    sink.write_table_batch(TableBatch(TABLE, truncates=[Position(200, 0)]), 2, {},
                           merge_mirror=False)
    assert sink.progress.truncated_unmerged(TABLE)  # read from the changelog

    def known(s: DeltaSink) -> bool:
        with monkeypatch.context() as m:
            m.setattr(s.progress, "unmerged", lambda *a, **k: pytest.fail("changelog read again"))
            return s.progress.truncated_unmerged(TABLE)

    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 3, 300)]), 3, {}, merge_mirror=False)
    sink.write_table_batch(TableBatch(TABLE, truncates=[Position(400, 0)]), 4, {},
                           merge_mirror=False)
    assert known(sink)
    assert sink.merge_mirror(TABLE, 3, {}, through_lsn=300) == 2
    assert known(sink)  # the truncate at 400 is still to merge
    sink.merge_mirror(TABLE, 4, {})
    assert not known(sink)
    assert rows(spark, sink.layout.mirror(TABLE)) == []
    sink.write_table_batch(TableBatch(TABLE, truncates=[Position(500, 0)]), 5, {},
                           merge_mirror=False)
    assert known(sink)
    again = make_sink(spark, tmp_path)  # a restart reads it from the changelog
    assert again.progress.truncated_unmerged(TABLE)
    again.merge_mirror(TABLE, 5, {})
    assert not known(again)


def test_a_replay_finds_a_landed_batch_of_chunk_files_alone(
    spark: Any, tmp_path: Path
) -> None:
    """A batch whose only rows are a chunk's files, committed by an attempt whose tailer
    then died: the replay's fence finds those rows (they carry the attempt), so it writes
    nothing and counts them from the commit."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    em = _emission(TABLE, "w1", 500, set())
    meta = {"dblog.batch": 1, "dblog.from_lsn": 1, "dblog.to_lsn": 500}
    first = WriteAttempt()
    files = chunk(spark, sink, em, named([1, 2]), 1, first)
    tb = TableBatch(TABLE, emissions=[em], chunks={"w1": files})
    sink.write_table_batch(tb, 1, meta, attempt=first, merge_mirror=False)
    _, results = make_sink(spark, tmp_path).write_table_batch(
        tb, 1, meta, attempt=WriteAttempt(earlier=(first.id,)))
    assert [r.rows_emitted for r in results] == [2]
    assert sorted(r["after"]["id"] for r in rows(spark, sink.layout.changelog(TABLE))) == [1, 2]
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 2]


def test_a_fenced_attempt_cannot_commit_a_chunks_files(spark: Any, tmp_path: Path) -> None:
    """A tailer frozen with a chunk's files in hand, whose batch another tailer took over:
    its commit adds no rows through the writer, so the fence is checked before it, and it
    stops with LeadershipLost instead of adding rows its successor wrote too."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    em = _emission(TABLE, "w1", 500, set())
    frozen = WriteAttempt()
    files = chunk(spark, sink, em, named([1, 2]), 1, frozen)
    successor = WriteAttempt(earlier=(frozen.id,))
    sink.write_table_batch(TableBatch(TABLE, emissions=[em], chunks={"w1": files}), 1, {},
                           attempt=successor)
    with pytest.raises(LeadershipLost, match="fenced off"):
        make_sink(spark, tmp_path).write_table_batch(
            TableBatch(TABLE, emissions=[em], chunks={"w1": files}), 1, {}, attempt=frozen)
    assert sorted(r["after"]["id"] for r in rows(spark, sink.layout.changelog(TABLE))) == [1, 2]


def test_a_chunk_read_by_several_selects_is_numbered_in_key_order(
    spark: Any, tmp_path: Path
) -> None:
    """A chunk read by four selects, each over its key range and in key order, is numbered
    1, 2, ... after the high watermark in key order across them (a dropped key keeps its
    number unused), and the capture's deletes come after every selected row."""
    import random

    from dblog.core.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (3, 3001)]),
                           1, {})
    ids = [i for i in range(1, 3001) if i != 3]
    random.Random(7).shuffle(ids)
    assert emit(spark, sink, 2, [(_emission(TABLE, "w1", 9000, {(10,)}), named(ids))],
                coverage={"w1": KeyRange((0,), (3000,))}, parts=4) == [("w1", 2998, 1)]
    log = spark.read.format("delta").load(sink.layout.changelog(TABLE)).where("_dblog_batch = 2")
    numbered = sorted((r["_dblog_seq"], r["op"], (r["after"] or r["before"])["id"])
                      for r in log.collect())
    by_key = sorted(ids)
    expected = [(seq, "r", key) for seq, key in enumerate(by_key, start=1) if key != 10]
    assert numbered == [*expected, (3000, "d", 3)]


# ---- 7. new chunks reach the mirror without a MERGE -----------------------------------------


def _operations(spark: Any, path: str) -> list[str]:
    return [h["operation"] for h in reversed(history(spark, path))]


def test_new_chunks_are_appended_to_the_mirror_and_the_log_changes_merged_after(
    spark: Any, tmp_path: Path
) -> None:
    """The mirror holds nothing in two chunks' key spans: their rows are appended (one
    WRITE, no MERGE of them) but for those of keys the log changes of the same batches
    change, which are merged with those changes by position: an older insert of a chunk's
    key loses, a newer update wins, a newer delete removes it, a key the window dropped
    comes from the log alone. The MERGE rewrites no appended file."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 2, 100, name="old2"),
                                              ev(Op.CREATE, 50, 101)]), 1, {},
                           merge_mirror=False)
    emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, {(3,)}), named([1, 2, 3, 4])),
                          (_emission(TABLE, "w2", 600, set()), named([10, 11]))],
         events=[ev(Op.UPDATE, 3, 450, name="log3"), ev(Op.UPDATE, 4, 550, name="new4"),
                 ev(Op.DELETE, 11, 650)], merge_mirror=False)
    assert sink.merge_mirror(TABLE, 2, {}, through_lsn=650) == 10
    assert _operations(spark, mirror)[-2:] == ["WRITE", "MERGE"]
    assert _metrics(spark, mirror, "WRITE")["numOutputRows"] == "2"  # 1 and 10
    assert _metrics(spark, mirror, "MERGE")["numTargetFilesRemoved"] == "0"
    assert {r["id"]: (r["name"], r["_dblog_lsn"]) for r in rows(spark, mirror)} == {
        1: ("r1", 500), 2: ("r2", 500), 3: ("log3", 450), 4: ("new4", 550), 10: ("r10", 600),
        50: ("n50", 101)}
    assert again_merged(spark, tmp_path) == 650


def again_merged(spark: Any, tmp_path: Path) -> int:
    """Where a sink started afresh finds the mirror's mark."""
    return make_sink(spark, tmp_path).mirror_lsn(TABLE)


def test_a_merge_of_new_chunks_alone_is_one_append_that_carries_the_mark(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    emit(spark, sink, 1, [(_emission(TABLE, "w1", 500, set()), named([1, 2, 3]))],
         merge_mirror=False)
    assert sink.merge_mirror(TABLE, 1, {}, through_lsn=500) == 3
    commits = [h for h in history(spark, sink.layout.mirror(TABLE)) if h["version"] > 0]
    assert [h["operation"] for h in commits] == ["WRITE"]
    assert json.loads(commits[0]["userMetadata"])[MIRROR_LSN] == 500
    assert again_merged(spark, tmp_path) == 500
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 2, 3]


def test_a_merges_changes_are_surveyed_whole_and_per_chunk(
    spark: Any, tmp_path: Path
) -> None:
    """The figures a merge plans with: every change counted and bounded (a delete by its
    ``before`` key), the last TRUNCATE's position, and each chunk's rows apart; no spans
    without chunk rows, nothing for no changes."""
    from dblog.lake.sink import _Survey, _survey
    from dblog.lake.types import WINDOW_COLUMN

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    emit(spark, sink, 1, [(_emission(TABLE, "w1", 500, {(4,)}), named([3, 4, 5])),
                          (_emission(TABLE, "w2", 600, set()), named([20, 21]))],
         events=[ev(Op.CREATE, 40, 450), ev(Op.DELETE, 1, 550), ev(Op.UPDATE, 21, 650)],
         truncates=[Position(520, 3)], merge_mirror=False)
    changes = sink.progress.unmerged(TABLE)
    found = _survey(changes, "id")
    assert (found.rows, found.low, found.high, found.top, tuple(found.truncated or ())) == (
        8, 1, 40, 650, (520, 3))
    assert sorted((s["window"], s["low"], s["high"], s["rows"]) for s in found.spans) == [
        ("w1", 3, 5, 2), ("w2", 20, 21, 2)]
    log_only = _survey(changes.where(F.col(WINDOW_COLUMN).isNull()), "id")
    assert (log_only.rows, log_only.low, log_only.high, log_only.spans) == (4, 1, 40, [])
    assert _survey(changes.where(F.col("_dblog_lsn") > F.lit(650)), "id") == _Survey(
        0, None, None, None, None, [])
    # Surveyed by chunk in one pass (a merge that expects chunks): the same figures.
    for frame in (changes, changes.where(F.col(WINDOW_COLUMN).isNull()),
                  changes.where(F.col(WINDOW_COLUMN).isNotNull()),
                  changes.where(F.col("_dblog_lsn") > F.lit(650))):
        assert _comparable(_survey(frame, "id", chunks_expected=True)) == _comparable(
            _survey(frame, "id"))


def _comparable(survey: Any) -> tuple[Any, ...]:
    """A survey's figures, its spans in window order and its rows as plain tuples."""
    return (survey.rows, survey.low, survey.high, survey.top,
            None if survey.truncated is None else tuple(survey.truncated),
            sorted((s["window"], s["low"], s["high"], s["rows"]) for s in survey.spans))


def test_a_survey_by_chunk_bounds_float_keys_as_spark_does(spark: Any) -> None:
    """The one-pass survey folds its groups' bounds in Python: a NaN key (PostgreSQL allows
    one) is above every number there as in Spark, whichever group holds it."""
    from dblog.lake.sink import _survey

    after = "STRUCT<k: DOUBLE, v: STRING>"
    frame = spark.createDataFrame(
        [("c", None, (float("nan"), "x"), 10, 0, None),
         ("u", None, (-0.0, "x"), 11, 0, None),
         ("d", (float("-inf"), "x"), None, 12, 0, None),
         ("r", None, (1.5, "x"), 5, 1, "w1"),
         ("r", None, (2.5, "x"), 5, 2, "w1"),
         ("r", None, (float("nan"), "x"), 6, 1, "w2"),
         ("r", None, (0.5, "x"), 6, 2, "w2")],
        f"op STRING, before {after}, after {after}, _dblog_lsn BIGINT, _dblog_seq BIGINT, "
        "_dblog_window_id STRING")
    for chunks_first in (frame, frame.orderBy(F.col("_dblog_window_id").desc_nulls_last())):
        one_pass = _survey(chunks_first, "k", chunks_expected=True)
        two_passes = _survey(chunks_first, "k")
        assert one_pass.low == two_passes.low == float("-inf")
        assert str(one_pass.high) == str(two_passes.high) == "nan"
        assert (one_pass.rows, one_pass.top) == (two_passes.rows, two_passes.top) == (7, 12)
        assert sorted((s["window"], s["rows"]) for s in one_pass.spans) == [
            ("w1", 2), ("w2", 2)]


def test_a_chunk_over_keys_the_mirror_holds_is_merged(spark: Any, tmp_path: Path) -> None:
    """A chunk whose span holds mirror files with half its rows or more (a repair capture
    over a mirror that has its keys) is merged whole: no append."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 2, 100, name="old2"),
                                              ev(Op.CREATE, 3, 101, name="old3")]), 1, {})
    emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, set()), named([1, 2, 3]))])
    assert _operations(spark, mirror)[-1] == "MERGE"
    assert "WRITE" not in _operations(spark, mirror)
    assert {r["id"]: r["name"] for r in rows(spark, mirror)} == {1: "r1", 2: "r2", 3: "r3"}


def _metrics(spark: Any, path: str, operation: str) -> dict[str, str]:
    """The operation metrics of the table's last commit of ``operation``."""
    return dict(next(h for h in history(spark, path)
                     if h["operation"] == operation)["operationMetrics"])


def test_a_chunks_rows_the_mirror_lacks_are_appended_and_the_rest_merged(
    spark: Any, tmp_path: Path
) -> None:
    """Writers' changes reached the mirror before a first capture's chunk, so some keys
    of its span are there: the chunk's other rows are appended (no MERGE of them), its
    rows of those keys, and of keys the batch's log changes change too, are merged with
    those changes, by position, so that the MERGE rewrites no appended file."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 2, 100, name="old2"),
                                              ev(Op.CREATE, 50, 101)]), 1, {})
    emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, {(4,)}), named([1, 2, 3, 4, 5, 6]))],
         events=[ev(Op.UPDATE, 4, 450, name="log4"), ev(Op.UPDATE, 5, 550, name="new5"),
                 ev(Op.DELETE, 6, 650)], merge_mirror=False)
    assert sink.merge_mirror(TABLE, 2, {}, through_lsn=650) == 8
    assert _operations(spark, mirror)[-2:] == ["WRITE", "MERGE"]
    assert _metrics(spark, mirror, "WRITE")["numOutputRows"] == "2"  # 1 and 3
    merged = _metrics(spark, mirror, "MERGE")
    assert merged["numSourceRows"] == "4"  # the latest change of 2, 4, 5 and 6
    assert merged["numTargetFilesRemoved"] == "1"  # that of key 2, not the appended one
    assert {r["id"]: (r["name"], r["_dblog_lsn"]) for r in rows(spark, mirror)} == {
        1: ("r1", 500), 2: ("r2", 500), 3: ("r3", 500), 4: ("log4", 450),
        5: ("new5", 550), 50: ("n50", 101)}
    assert again_merged(spark, tmp_path) == 650


def _late_writer_before_the_append(monkeypatch: pytest.MonkeyPatch, spark: Any, mirror: str,
                                   *, key: int, seq: int) -> None:
    """Make the next mirror append find, just before it writes, that another writer put
    row ``key`` ("late", at position (500, ``seq``)) in the mirror (undone by
    ``monkeypatch.undo()``)."""
    from delta.tables import DeltaTable

    from dblog.lake import sink as sink_module

    write_files = sink_module.DeltaTxn.write_files

    def late_writer_first(txn: Any, df: Any) -> list[str]:
        late = spark.createDataFrame([(key, "late", 500, seq)],
                                     "id INT, name STRING, _dblog_lsn BIGINT, _dblog_seq BIGINT")
        (DeltaTable.forPath(spark, mirror).alias("t").merge(late.alias("s"), "t.id = s.id")
         .whenNotMatchedInsertAll().execute())
        return write_files(txn, df)

    monkeypatch.setattr(sink_module.DeltaTxn, "write_files", late_writer_first)


def test_a_writer_in_a_new_chunks_span_meanwhile_makes_it_merged_instead(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the check that the mirror holds nothing in a chunk's span and the append,
    another writer (a tailer that lost its lock, merging late) puts a row there: the append
    fails on Delta's conflict check, every change is merged instead, and no key is twice in
    the mirror."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    emit(spark, sink, 1, [(_emission(TABLE, "w1", 500, set()), named([1, 2, 3]))],
         merge_mirror=False)
    _late_writer_before_the_append(monkeypatch, spark, mirror, key=2, seq=2)
    assert sink.merge_mirror(TABLE, 1, {}, through_lsn=500) == 3
    monkeypatch.undo()
    assert _operations(spark, mirror)[-2:] == ["MERGE", "MERGE"]  # the late one, then ours
    assert sorted((r["id"], r["name"]) for r in rows(spark, mirror)) == [
        (1, "r1"), (2, "late"), (3, "r3")]  # the late row's position equals the chunk's


def test_a_fenced_tailers_late_append_cannot_bring_back_keys_the_new_leader_deleted(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tailer that lost its lock is about to append a chunk's rows to the mirror (its
    span holds nothing); the tailer that took over merges the same chunk and the later
    deletes of all its keys (nothing to append, a MERGE that changes no file). Then the
    late append commits: without a fence it brought the deleted keys back for good."""
    from dblog.lake import deltalog

    app = "dblog:src:gen"
    old, new = make_sink(spark, tmp_path), make_sink(spark, tmp_path)
    old.ensure_schema(SCHEMA)
    mirror = old.layout.mirror(TABLE)
    old.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 1, {}, merge_mirror=False)
    old.merge_mirror(TABLE, 1, {}, app_id=app, through_lsn=100)  # the mirror holds a file
    emit(spark, old, 2, [(_emission(TABLE, "w1", 500, set()), named([10, 11, 12]))],
         merge_mirror=False)
    old.write_table_batch(TableBatch(TABLE, [ev(Op.DELETE, k, 600, i) for i, k in enumerate(
        (10, 11, 12))]), 3, {}, merge_mirror=False)
    late = threading.Thread(target=old.merge_mirror, args=(TABLE, 2, {}),
                            kwargs={"app_id": app, "through_lsn": 500}, daemon=True)
    held, release = threading.Event(), threading.Event()
    commit = deltalog.DeltaTxn.commit

    def held_commit(txn: Any, *args: Any, **kwargs: Any) -> int:
        if threading.current_thread() is late and txn.path == mirror:
            held.set()
            release.wait(120)
        return commit(txn, *args, **kwargs)

    monkeypatch.setattr(deltalog.DeltaTxn, "commit", held_commit)
    late.start()  # the fenced tailer, frozen just before its append commits
    assert held.wait(120)
    new.merge_mirror(TABLE, 3, {}, app_id=app, through_lsn=600)  # the new leader
    release.set()
    late.join(120)
    monkeypatch.undo()
    assert sorted(r["id"] for r in rows(spark, mirror)) == [1]


def test_a_chunk_whose_every_key_changes_again_is_merged_without_an_append(
    spark: Any, tmp_path: Path
) -> None:
    """Every key of a new chunk changes again in the same merge: nothing is appended (no
    empty commit either), and the latest change of each key wins in the MERGE."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    emit(spark, sink, 1, [(_emission(TABLE, "w1", 500, set()), named([1, 2]))],
         events=[ev(Op.UPDATE, 1, 600, name="new1"), ev(Op.DELETE, 2, 650)],
         merge_mirror=False)
    assert sink.merge_mirror(TABLE, 1, {}, through_lsn=650) == 4
    assert "WRITE" not in _operations(spark, mirror)
    assert {r["id"]: r["name"] for r in rows(spark, mirror)} == {1: "new1"}


def test_a_writer_of_a_key_a_chunk_appends_meanwhile_makes_it_merged_instead(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk whose span holds some mirror rows: another writer (a tailer that lost its
    lock, merging late) puts one of the keys the append took for missing in the mirror
    before it commits. The append fails on Delta's conflict check, every change is
    merged, no key is twice there."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    mirror = sink.layout.mirror(TABLE)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 2, 100, name="old2")]), 1, {})
    emit(spark, sink, 2, [(_emission(TABLE, "w1", 500, set()), named([1, 2, 3, 4, 5]))],
         merge_mirror=False)
    _late_writer_before_the_append(monkeypatch, spark, mirror, key=3, seq=3)
    assert sink.merge_mirror(TABLE, 2, {}, through_lsn=500) == 5
    monkeypatch.undo()
    assert _operations(spark, mirror)[-2:] == ["MERGE", "MERGE"]  # the late one, then ours
    assert sorted((r["id"], r["name"]) for r in rows(spark, mirror)) == [
        (1, "r1"), (2, "r2"), (3, "late"), (4, "r4"), (5, "r5")]


def test_the_mirror_is_read_for_a_span_by_its_files_statistics(
    spark: Any, tmp_path: Path
) -> None:
    """A span outside every mirror file's key statistics reads no file (Delta's data
    skipping needs the span's bounds folded to plain literals)."""
    from dblog.lake.deltalog import DeltaTxn

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 9, 200)]), 2, {})
    txn = DeltaTxn(spark, sink.layout.mirror(TABLE))
    key = F.col("id")
    assert txn.files_where((key >= F.lit(10).cast("int")) & (key <= F.lit(20).cast("int"))) == 0
    assert txn.files_where(key >= F.lit(2).cast("int")) == 2
    assert txn.files_where(key == F.lit(1)) == 1
    assert txn.files_where(F.lit(True)) == 2


def test_rows_are_looked_for_only_in_the_files_the_statistics_admit(
    spark: Any, tmp_path: Path
) -> None:
    """``rows_exist_where`` (the tailer's check whether the mirror holds a row in a chunk's
    coverage) reads the transaction's snapshot: a file whose key statistics admit a span
    may still hold no row in it, and a commit after the transaction began is not seen."""
    from dblog.lake.deltalog import DeltaTxn

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 4)]), 1, {})
    txn = DeltaTxn(spark, sink.layout.mirror(TABLE))
    key = F.col("id")

    def between(low: int, high: int) -> Any:
        return (key >= F.lit(low).cast("int")) & (key <= F.lit(high).cast("int"))

    assert txn.files_where(between(2, 3)) == 1  # inside the file's bounds [1, 4]
    assert not txn.rows_exist_where(between(2, 3))
    assert txn.rows_exist_where(between(3, 4))
    assert not txn.rows_exist_where(between(5, 9))
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 7, 200)]), 2, {})
    assert not txn.rows_exist_where(between(5, 9))  # committed after the snapshot
    assert DeltaTxn(spark, sink.layout.mirror(TABLE)).rows_exist_where(between(5, 9))
