"""The Delta sink driven directly (no database): staging isolation, crash-safe schema
evolution, type coercion, non-Spark readers, capture deletes and truncates."""

from __future__ import annotations

import json
import threading
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import DblogError, LeadershipLost
from pipeline.events import ChangeEvent, Op, Position, TableId
from pipeline.lake.layout import LakeLayout
from pipeline.lake.sink import ATTEMPT_COLUMN, MIRROR_LSN, DeltaSink, TableBatch, WriteAttempt
from pipeline.lake.types import quote_ident
from pipeline.sources.base import Column, TableSchema

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


# ---- 1. staging never shares the ordered writer's session settings ----------------------


def test_staging_inside_a_writer_txn_is_neither_skipped_nor_tagged(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)

    def chunk(ids: list[int]) -> Any:
        return spark.createDataFrame([(i, f"n{i}") for i in ids], "id INT, name STRING")

    sink.stage_chunk(chunk([1, 2]), "w1", TABLE)
    sink.stage_chunk(chunk([3]), "w2", TABLE)
    errors: list[BaseException] = []

    def capture_thread() -> None:
        try:
            sink.drop_staged(TABLE, ["w1"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with sink._txn(5, {"dblog.batch": 5}):
        worker = threading.Thread(target=capture_thread)
        worker.start()
        worker.join()
        sink.drop_staged(TABLE, ["w2"])  # the same thread too
    assert not errors
    staging = sink.layout.staging(TABLE)
    assert rows(spark, staging) == []
    for commit in history(spark, staging):
        assert "dblog.batch" not in (commit["userMetadata"] or "")


@pytest.mark.parametrize("name", ["_dblog_lsn", "_DBLOG_SEQ", "_dblog_window_id"])
def test_a_column_named_like_the_lakes_own_is_refused_with_what_to_do(
    spark: Any, tmp_path: Path, name: str
) -> None:
    """The mirror keeps its position in ``_dblog_lsn`` / ``_dblog_seq`` beside the table's
    columns and staging its window in ``_dblog_window_id`` (Spark compares names without
    case): a source column of such a name is refused by name, with what to do, before any
    table is made, and a DDL adding one changes nothing in the lake."""
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


def test_dropping_staged_windows_removes_their_files_and_rewrites_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """Staging is partitioned by window: a settled window's rows go with a commit that only
    removes its files (no scan, no rewrite), and an emission reads only its own files."""
    from delta.tables import DeltaTable

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    for wid, ids in (("w1", [1, 2]), ("w2", [3, 4]), ("w3", [5])):
        sink.stage_chunk(spark.createDataFrame([(i, f"n{i}") for i in ids], "id INT, name STRING"),
                         wid, TABLE)
    staging = sink.layout.staging(TABLE)
    detail = DeltaTable.forPath(spark, staging).detail().first()
    assert detail is not None and list(detail["partitionColumns"]) == ["_dblog_window_id"]
    sink.drop_staged(TABLE, ["w1", "w3"])
    delete = history(spark, staging)[0]
    assert delete["operation"] == "DELETE"
    metrics = delete["operationMetrics"]
    assert metrics.get("numAddedFiles", "0") == "0" and int(metrics["numRemovedFiles"]) >= 2
    assert sorted(r["id"] for r in rows(spark, staging)) == [3, 4]


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
        assert sink._events_df(batch, sink.known_columns(TABLE), 1, WriteAttempt().id)\
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
        assert "delta.enableTypeWidening" not in sink._table_props(path)


def test_type_widening_is_enabled_only_when_a_column_widens(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    narrow = TableSchema(TABLE, (*SCHEMA.columns, Column("n", "INT")), ("id",))
    sink.ensure_schema(narrow)
    sink.ensure_schema(TableSchema(TABLE, (*SCHEMA.columns, Column("n", "BIGINT")), ("id",)))
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        assert sink._table_props(path).get("delta.enableTypeWidening") == "true"
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100, n=2**40)]), 1, {})
    assert [r["n"] for r in rows(spark, sink.layout.mirror(TABLE))] == [2**40]
    log = rows(spark, sink.layout.changelog(TABLE))
    assert [r["after"]["n"] for r in log] == [2**40]


# ---- 5. capture deletes: mirror keys a complete chunk read did not return -----------------


def _emission(table: TableId, wid: str, lsn: int, dropped: set[Any]) -> Any:
    from pipeline.events import Window
    from pipeline.window import ChunkEmission

    window = Window(wid, table, low=f"{wid}-lw", high=f"{wid}-hw")
    return ChunkEmission(window, Position(lsn, 0), frozenset(dropped), None)


def _read_backs(sink: DeltaSink, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The changelog versions the sink reads emission counts back from, as it reads them."""
    reads: list[int] = []
    read_back = sink._committed_rows

    def counted(table: TableId, version: int) -> Any:
        reads.append(version)
        return read_back(table, version)

    monkeypatch.setattr(sink, "_committed_rows", counted)
    return reads


def test_an_emission_alone_is_counted_by_its_commit_and_a_mixed_batch_by_its_rows(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of one emission without coverage is all ``r`` rows of one window: its count
    is the commit's ``numOutputRows``, with no read back. Anything else (log events beside,
    two emissions) is counted from the committed rows."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    reads = _read_backs(sink, monkeypatch)

    def stage(wid: str, ids: list[int]) -> None:
        sink.stage_chunk(spark.createDataFrame([(i, f"r{i}") for i in ids], "id INT, name STRING"),
                         wid, TABLE)

    stage("w1", [1, 2, 3, 4])
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, {(2,)})]), 1, {})
    assert [(r.window_id, r.rows_emitted, r.rows_deleted) for r in results] == [("w1", 3, 0)]
    assert reads == []
    stage("w2", [5, 6])
    stage("w3", [7])
    _, results = sink.write_table_batch(
        TableBatch(TABLE, [ev(Op.CREATE, 9, 600)],
                   emissions=[_emission(TABLE, "w2", 601, set()),
                              _emission(TABLE, "w3", 602, set())]), 2, {})
    assert [(r.window_id, r.rows_emitted) for r in results] == [("w2", 2), ("w3", 1)]
    assert len(reads) == 1
    stage("w4", [])
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w4", 700, set())]), 3, {})
    assert [(r.window_id, r.rows_emitted) for r in results] == [("w4", 0)]


def test_a_covered_emission_over_keys_the_mirror_lacks_is_reads_only_and_counted_by_its_commit(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture into a new key range: the mirror holds no row in the chunk's coverage, so
    the chunk can delete nothing; its emission is its ``r`` rows and its commit's row count
    is its count. Where the mirror does hold rows, the deletes are still emitted."""
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    reads = _read_backs(sink, monkeypatch)

    def emit(wid: str, ids: list[int], lsn: int, covered: KeyRange, batch: int) -> Any:
        sink.stage_chunk(spark.createDataFrame([(i, f"r{i}") for i in ids], "id INT, name STRING"),
                         wid, TABLE)
        _, results = sink.write_table_batch(
            TableBatch(TABLE, emissions=[_emission(TABLE, wid, lsn, set())],
                       coverage={wid: covered}), batch, {})
        return [(r.window_id, r.rows_emitted, r.rows_deleted) for r in results]

    assert emit("w1", [11, 12, 13], 500, KeyRange((10,), (20,)), 2) == [("w1", 3, 0)]
    assert reads == []
    assert emit("w2", [1], 600, KeyRange((0,), (5,)), 3) == [("w2", 1, 1)]
    assert len(reads) == 1
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 11, 12, 13]


def test_a_covered_chunk_deletes_the_mirror_keys_it_did_not_read(
    spark: Any, tmp_path: Path
) -> None:
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(
        TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in range(1, 12)]), 1, {})
    chunk = [i for i in range(1, 11) if i not in (3, 7)]
    sink.stage_chunk(
        spark.createDataFrame([(i, f"r{i}") for i in chunk], "id INT, name STRING"), "w1", TABLE)
    em = _emission(TABLE, "w1", 500, {(7,)})
    batch = TableBatch(TABLE, emissions=[em], coverage={"w1": KeyRange((0,), (10,))})
    _, results = sink.write_table_batch(batch, 2, {})
    assert [(r.window_id, r.rows_emitted, r.rows_deleted) for r in results] == [("w1", 8, 1)]
    mirror = {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))}
    assert sorted(mirror) == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]  # 3 gone, 7 dropped, 11 outside
    assert mirror[7] == "n7" and mirror[11] == "n11" and mirror[1] == "r1"
    log = sorted((r for r in rows(spark, sink.layout.changelog(TABLE)) if r["_dblog_batch"] == 2),
                 key=lambda r: r["_dblog_seq"])
    assert [(r["op"], r["_dblog_seq"]) for r in log] == [
        ("r", 1), ("r", 2), ("d", 3), ("r", 4), ("r", 5), ("r", 6), ("r", 7), ("r", 8), ("r", 9)]
    gone = log[2]
    assert gone["before"].asDict() == {"id": 3, "name": "n3"} and gone["after"] is None
    assert gone["_dblog_lsn"] == 500 and gone["_dblog_window_id"] == "w1"


def test_an_emission_replayed_after_its_changelog_commit_merges_what_the_changelog_holds(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the changelog append and the MERGE: the replay's append is skipped,
    and the mirror and the counts come from the commit written before, found in the history
    behind a later commit (a column added in between)."""
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {"dblog.batch": 1})
    sink.stage_chunk(spark.createDataFrame([(1, "r1"), (3, "r3")], "id INT, name STRING"),
                     "w1", TABLE)

    def batch() -> TableBatch:
        return TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, set())],
                          coverage={"w1": KeyRange((0,), (5,))})

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed between the changelog and the mirror")

    monkeypatch.setattr(sink, "_merge_mirror", crash)
    crashed = WriteAttempt()
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
    assert sorted((r["op"], r["_dblog_seq"]) for r in log) == [("d", 2), ("r", 1), ("r", 3)]


def test_without_coverage_a_chunk_deletes_nothing(spark: Any, tmp_path: Path) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2)]), 1, {})
    sink.stage_chunk(spark.createDataFrame([(1, "r1")], "id INT, name STRING"), "w1", TABLE)
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, set())]), 2, {})
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(1, 0)]
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 2]


COMPOSITE = TableId("shop", "lines")
COMPOSITE_SCHEMA = TableSchema(
    COMPOSITE, (Column("o", "INT"), Column("l", "STRING"), Column("qty", "INT")), ("o", "l"))


def test_composite_key_coverage_is_lexicographic(spark: Any, tmp_path: Path) -> None:
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(COMPOSITE_SCHEMA)
    keys = [(1, "b"), (1, "c"), (2, "a"), (2, "m"), (2, "z"), (3, "a")]
    sink.write_table_batch(TableBatch(COMPOSITE, [
        ChangeEvent(COMPOSITE, Op.CREATE, k, Position(100 + i), after={"o": k[0], "l": k[1],
                                                                        "qty": i})
        for i, k in enumerate(keys)
    ]), 1, {})
    # Coverage ((1,'b'), (2,'m')]: (1,'b') is the exclusive lower bound, (2,'m') inclusive.
    staged = [(2, "a", 9)]
    sink.stage_chunk(spark.createDataFrame(staged, "o INT, l STRING, qty INT"), "w1", COMPOSITE)
    batch = TableBatch(COMPOSITE, emissions=[_emission(COMPOSITE, "w1", 500, set())],
                       coverage={"w1": KeyRange((1, "b"), (2, "m"))})
    _, results = sink.write_table_batch(batch, 2, {})
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(1, 2)]
    mirror = sorted((r["o"], r["l"]) for r in rows(spark, sink.layout.mirror(COMPOSITE)))
    assert mirror == [(1, "b"), (2, "a"), (2, "z"), (3, "a")]
    log = sorted((r for r in rows(spark, sink.layout.changelog(COMPOSITE))
                  if r["_dblog_batch"] == 2), key=lambda r: r["_dblog_seq"])
    assert [(r["op"], r["_dblog_seq"]) for r in log] == [("d", 1), ("r", 2), ("d", 3)]
    assert [(r["before"] or r["after"])["l"] for r in log] == ["c", "a", "m"]


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
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    # Key 2 is deleted by the log in this batch before the window opened: already a `d`.
    sink.stage_chunk(spark.createDataFrame([(1, "r1")], "id INT, name STRING"), "w1", TABLE)
    batch = TableBatch(TABLE, events=[ev(Op.DELETE, 2, 200)],
                       emissions=[_emission(TABLE, "w1", 500, set())],
                       coverage={"w1": KeyRange(None, (3,))})
    _, results = sink.write_table_batch(batch, 2, {})
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(1, 1)]
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
    sink.stage_chunk(spark.createDataFrame([(1, "r1"), (2, "r2")], "id INT, name STRING"),
                     "w1", TABLE)
    batch = TableBatch(TABLE, events=[ev(Op.CREATE, 3, 700)],
                       emissions=[_emission(TABLE, "w1", 500, set())],
                       truncates=[Position(600, 0)])
    _, results = sink.write_table_batch(batch, 1, {})
    assert [r.rows_emitted for r in results] == [2]
    assert [r["id"] for r in rows(spark, sink.layout.mirror(TABLE))] == [3]
    log = sorted(rows(spark, sink.layout.changelog(TABLE)),
                 key=lambda r: (r["_dblog_lsn"], r["_dblog_seq"]))
    assert [r["op"] for r in log] == ["r", "r", "t", "c"]


def test_a_new_column_with_an_unsafe_name_turns_column_mapping_on(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    assert "delta.columnMapping.mode" not in sink._table_props(sink.layout.mirror(TABLE))
    wider = TableSchema(TABLE, (*SCHEMA.columns, Column("unit price", "DECIMAL(10,2)"),
                                Column("seen", "TIMESTAMP_NTZ")), ("id",))
    sink.ensure_schema(wider)
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        assert sink._table_props(path)["delta.columnMapping.mode"] == "name"
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
    files (a pre- and a post-image of every updated row) would write them for nothing, and
    staging is read by dblog alone: both are made without it, whatever the session's
    default."""
    from delta.tables import DeltaTable

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.stage_chunk(spark.createDataFrame([(1, "n1")], "id INT, name STRING"), "w1", TABLE)
    for batch, events in enumerate(([ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)],
                                    [ev(Op.UPDATE, 1, 200, name="new"), ev(Op.DELETE, 2, 201)]),
                                   start=1):
        sink.write_table_batch(TableBatch(TABLE, events), batch, {})
    sink.drop_staged(TABLE, ["w1"])

    def change_feed(path: str) -> str | None:
        detail = DeltaTable.forPath(spark, path).detail().first()
        assert detail is not None
        return dict(detail["properties"]).get("delta.enableChangeDataFeed")

    layout = sink.layout
    assert change_feed(layout.changelog(TABLE)) == "true"
    assert change_feed(layout.mirror(TABLE)) == "false"
    assert change_feed(layout.staging(TABLE)) == "false"
    assert {r["id"]: r["name"] for r in rows(spark, layout.mirror(TABLE))} == {1: "new", 3: "n3"}
    assert "cdc" not in _log_actions(layout.mirror(TABLE))
    assert "cdc" not in _log_actions(layout.staging(TABLE))


def test_a_checkpoint_every_hundred_commits(spark: Any, tmp_path: Path) -> None:
    """Delta writes a checkpoint in the commit that reaches the interval; at its default
    (10) that was a third of a small append's time."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    for batch in range(1, 13):
        sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, batch, 100 + batch)]), batch, {})
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        log = Path(path, "_delta_log")
        assert len(list(log.glob("*.json"))) > 10
        assert not list(log.glob("*.checkpoint*.parquet")), path
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
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.DELETE, 2, 200)]), 2, {}, merge_mirror=False)
    sink.stage_chunk(spark.createDataFrame([(1, "r1"), (3, "r3")], "id INT, name STRING"),
                     "w1", TABLE)
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, set())],
                   coverage={"w1": KeyRange((0,), (5,))}), 3, {}, merge_mirror=False)
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(2, 0)]
    sink.merge_mirror(TABLE, 3, {})
    assert {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))} == {
        1: "r1", 3: "r3"}


def test_a_capture_after_an_unmerged_truncate_deletes_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """Rows the mirror still holds from before a truncate it has not merged yet are gone
    already: a complete chunk read writes no delete for them."""
    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (1, 2, 3)]),
                           1, {})
    sink.write_table_batch(TableBatch(TABLE, truncates=[Position(200, 0)]), 2, {},
                           merge_mirror=False)
    sink.stage_chunk(spark.createDataFrame([(1, "r1")], "id INT, name STRING"), "w1", TABLE)
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, set())],
                   coverage={"w1": KeyRange((0,), (5,))}), 3, {}, merge_mirror=False)
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(1, 0)]
    sink.merge_mirror(TABLE, 3, {})
    assert {r["id"]: r["name"] for r in rows(spark, sink.layout.mirror(TABLE))} == {1: "r1"}


def test_an_emission_without_rows_counts_none(spark: Any, tmp_path: Path) -> None:
    """A last chunk that reads nothing: its append has no rows (Delta then makes no commit),
    and the emission reports zero rows instead of failing to find its commit."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 1, 100)]), 1, {"dblog.batch": 1})
    sink.stage_chunk(spark.createDataFrame([(1, "r1")], "id INT, name STRING"), "w0", TABLE)
    sink.stage_chunk(spark.createDataFrame([], "id INT, name STRING"), "w1", TABLE)
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, set())]), 2,
        {"dblog.batch": 2, "dblog.from_lsn": 100, "dblog.to_lsn": 500})
    assert [(r.window_id, r.rows_emitted, r.rows_deleted) for r in results] == [("w1", 0, 0)]
    # A replay of it (the tailer crashed before its commit in ZooKeeper) says the same.
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 500, set())]), 2,
        {"dblog.batch": 2, "dblog.from_lsn": 100, "dblog.to_lsn": 500},
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
    assert sink._truncated_unmerged(TABLE)  # read from the changelog

    def known(s: DeltaSink) -> bool:
        with monkeypatch.context() as m:
            m.setattr(s, "_unmerged", lambda *a, **k: pytest.fail("changelog read again"))
            return s._truncated_unmerged(TABLE)

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
    assert again._truncated_unmerged(TABLE)
    again.merge_mirror(TABLE, 5, {})
    assert not known(again)


def test_emission_batches_after_the_first_read_the_changelog_history_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the sink found its first emission's commit it knows the changelog's version:
    later emissions read the history only to find their own commit, also after batches
    of log events and for an emission without rows (no commit)."""
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)

    def emit(wid: str, ids: list[int], lsn: int, batch: int) -> list[tuple[str, int]]:
        sink.stage_chunk(spark.createDataFrame([(i, f"r{i}") for i in ids], "id INT, name STRING"),
                         wid, TABLE)
        _, results = sink.write_table_batch(
            TableBatch(TABLE, emissions=[_emission(TABLE, wid, lsn, set())]), batch,
            {"dblog.batch": batch, "dblog.from_lsn": lsn - 1, "dblog.to_lsn": lsn})
        return [(r.window_id, r.rows_emitted) for r in results]

    assert emit("w1", [1, 2], 500, 1) == [("w1", 2)]
    latest: list[str] = []
    read_latest = sink._latest_version

    def counted(path: str) -> int:
        latest.append(path)
        return read_latest(path)

    monkeypatch.setattr(sink, "_latest_version", counted)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, 9, 600)]), 2,
                           {"dblog.batch": 2, "dblog.from_lsn": 500, "dblog.to_lsn": 600})
    assert emit("w2", [], 700, 3) == [("w2", 0)]
    assert emit("w3", [5], 800, 4) == [("w3", 1)]
    sink.maintain(TABLE)  # a compaction commits to the changelog too
    assert emit("w4", [6, 7], 900, 5) == [("w4", 2)]
    assert emit("w5", [], 1000, 6) == [("w5", 0)]
    assert latest == []
    assert sorted(r["after"]["id"] for r in rows(spark, sink.layout.changelog(TABLE))) == [
        1, 2, 5, 6, 7, 9]


def test_an_emission_numbers_its_rows_in_key_order_whatever_the_staged_order(
    spark: Any, tmp_path: Path
) -> None:
    """A chunk staged by several tasks in no order is numbered 1, 2, ... after the high
    watermark in key order, the capture's deletes among its rows, in one changelog file."""
    import random

    from pipeline.chunking import KeyRange

    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    sink.write_table_batch(TableBatch(TABLE, [ev(Op.CREATE, i, 100 + i) for i in (3, 3001)]),
                           1, {})
    ids = [i for i in range(1, 3001) if i != 3]
    random.Random(7).shuffle(ids)
    staged = spark.createDataFrame([(i, f"r{i}") for i in ids], "id INT, name STRING")
    sink.stage_chunk(staged.repartition(4), "w1", TABLE)
    _, results = sink.write_table_batch(
        TableBatch(TABLE, emissions=[_emission(TABLE, "w1", 9000, {(10,)})],
                   coverage={"w1": KeyRange((0,), (3000,))}), 2, {})
    assert [(r.rows_emitted, r.rows_deleted) for r in results] == [(2998, 1)]
    log = spark.read.format("delta").load(sink.layout.changelog(TABLE)).where("_dblog_batch = 2")
    assert len(log.inputFiles()) == 1
    numbered = sorted((r["_dblog_seq"], r["op"], (r["after"] or r["before"])["id"])
                      for r in log.collect())
    expected_keys = sorted({*ids, 3} - {10})
    assert [(seq, key) for seq, _, key in numbered] == list(enumerate(expected_keys, start=1))
    assert [op for _, op, key in numbered if key == 3] == ["d"]
