"""Micro-batch write cost of the Delta sink (changelog append + mirror MERGE).

Prints seconds per batch for the tuned Spark settings against the baseline (Spark/Delta
defaults for the snapshot and shuffle parallelism), side by side in one process.

    .venv/bin/python -m bench.bench_sink [--batches 8] [--events 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from dblog.app.spark import build_spark_session
from dblog.core.events import ChangeEvent, Op, Position, TableId
from dblog.lake.layout import LakeLayout
from dblog.lake.sink import DeltaSink, TableBatch
from dblog.sources.base import Column, TableSchema

TABLE = TableId("bench", "accounts")
SCHEMA = TableSchema(TABLE, (Column("id", "INT"), Column("name", "STRING"),
                             Column("balance", "DECIMAL(12,2)")), ("id",))
BASELINE = {
    "spark.sql.shuffle.partitions": "200",
    "spark.databricks.delta.snapshotPartitions": "50",
}


def events(batch: int, count: int) -> list[ChangeEvent]:
    out = []
    for i in range(count):
        key = (batch * 7919 + i * 13) % 50000
        lsn = batch * 1_000_000 + i
        row = {"id": key, "name": f"n{key}", "balance": Decimal(i) / 100}
        op = Op.UPDATE if i % 3 else Op.CREATE
        out.append(ChangeEvent(TABLE, op, (key,), Position(lsn), before=row, after=row))
    return out


def run(sink: DeltaSink, batches: int, count: int) -> float:
    sink.ensure_schema(SCHEMA)
    timings = []
    for b in range(1, batches + 1):
        began = time.perf_counter()
        sink.write_table_batch(TableBatch(TABLE, events(b, count)), b, {"bench": True})
        timings.append(time.perf_counter() - began)
    return sum(timings[1:]) / max(len(timings) - 1, 1)  # the first batch warms the JVM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    spark = build_spark_session()
    tuned = {k: spark.conf.get(k) for k in BASELINE}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, conf in (("baseline", BASELINE), ("tuned", tuned)):
            for key, value in conf.items():
                spark.conf.set(key, value)
            sink = DeltaSink(spark, LakeLayout(Path(tmp) / name, "bench"))
            results[name] = run(sink, args.batches, args.events)
            print(f"{name:9s} {results[name]:.2f} s/batch ({conf})", flush=True)
    print(f"tuned / baseline = {results['tuned'] / results['baseline']:.2f}")


if __name__ == "__main__":
    main()
