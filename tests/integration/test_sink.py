"""The Delta sink driven directly (no database): staging isolation, crash-safe schema
evolution, type coercion, non-Spark readers, capture deletes and truncates."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.events import ChangeEvent, Op, Position, TableId
from pipeline.lake.layout import LakeLayout
from pipeline.lake.sink import DeltaSink, TableBatch
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


def test_a_batch_still_carries_its_markers_and_is_skipped_on_replay(
    spark: Any, tmp_path: Path
) -> None:
    sink = make_sink(spark, tmp_path)
    sink.ensure_schema(SCHEMA)
    batch = TableBatch(TABLE, [ev(Op.CREATE, 1, 100), ev(Op.CREATE, 2, 101)])
    sink.write_table_batch(batch, 7, {"dblog.batch": 7})
    replay = TableBatch(TABLE, [ev(Op.CREATE, 1, 100), ev(Op.CREATE, 3, 102)])
    sink.write_table_batch(replay, 7, {"dblog.batch": 7})  # skipped by txnVersion
    assert len(rows(spark, sink.layout.changelog(TABLE))) == 2
    assert sorted(r["id"] for r in rows(spark, sink.layout.mirror(TABLE))) == [1, 2]
    for path in (sink.layout.changelog(TABLE), sink.layout.mirror(TABLE)):
        writes = [h for h in history(spark, path) if h["operation"] in ("WRITE", "MERGE")]
        assert len(writes) == 1
        assert json.loads(writes[0]["userMetadata"])["dblog.batch"] == 7
    assert sink.spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
