"""Helpers of the source-feature tests: a pipeline on some tables of a scratch schema, run
as a user runs it (`dblog capture`, the change, `dblog tail --until-caught-up`), and an
independent comparison of the lake with the source (the database's own driver, the mirror
read as Delta files; never the pipeline's readers)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from dblog.app.config import load_config
from dblog.app.runtime import Runtime, open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from dblog.tail.background import BackgroundTailer
from tests.integration.checks import changelog_frame, normalize_rows, replay_changelog
from tests.integration.sources import SourceKit

META = ("_dblog_lsn", "_dblog_seq")


@contextmanager
def feature_pipeline(kit: SourceKit, tmp_path: Path, spark: SparkSession, db: str,
                     tables: list[str], **options: Any) -> Iterator[Runtime]:
    """A runtime on ``tables`` (names in ``db``) with small chunks and short batches; what
    the source left in the database and the schema ``db`` are dropped on exit."""
    with kit.cleaned(db, "feat") as source:
        data = kit.config_data(source=source, db=db, lake=tmp_path / "lake",
                               tables=[f"{db}.{t}" for t in tables], chunk_size=50,
                               batch_seconds=0.3, poll_seconds=0.2)
        for section, values in options.items():
            data.setdefault(section, {}).update(values)
        path = tmp_path / "dblog.yaml"
        import yaml

        path.write_text(yaml.safe_dump(data, allow_unicode=True))
        with open_runtime(load_config(path), spark=spark) as rt:
            try:
                yield rt
            finally:
                rt.state.delete("", recursive=True)


def capture(rt: Runtime, *tables: TableId) -> None:
    """`dblog capture` of ``tables``: a capture with an in-process tailer, to the end."""
    with BackgroundTailer(rt.tailer()) as bg:
        capturer = rt.capturer()
        capturer.health_check = bg.check
        reports = capturer.run(capturer.plan(CaptureRequest(tuple(tables))),
                               stop=threading.Event())
    assert [r.status for r in reports] == ["done"] * len(reports), reports


def tail_until_caught_up(rt: Runtime) -> None:
    """`dblog tail --until-caught-up`."""
    rt.tailer().run(until_caught_up=True)


def mirror_rows(spark: SparkSession, rt: Runtime, table: TableId, key: tuple[str, ...]
                ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The mirror's rows by key (the Delta table's files, no pipeline reader)."""
    rows = spark.read.format("delta").load(rt.layout.mirror(table)).collect()
    out = {}
    for row in rows:
        values = {k: v for k, v in row.asDict(recursive=True).items() if k not in META}
        out[tuple(values[k] for k in key)] = values
    return out


def lake_differences(kit: SourceKit, spark: SparkSession, rt: Runtime, db: str, table: str,
                     key: tuple[str, ...], *, left_out: frozenset[str] = frozenset()
                     ) -> list[str]:
    """How the mirror and an independent replay of the changelog differ from the source's
    rows (the source's columns but ``left_out``; empty when they agree)."""
    tid = TableId(db, table)
    source = {k: {c: v for c, v in row.items() if c not in left_out}
              for k, row in normalize_rows(kit.rows(db, table, key)).items()}
    columns = next(iter(source.values())).keys() if source else ()
    problems = []
    lakes = {"mirror": mirror_rows(spark, rt, tid, key),
             "replay": replay_changelog(changelog_frame(spark, rt.layout.changelog(tid)), key)}
    for name, rows in lakes.items():
        found = {k: {c: v.get(c) for c in columns} for k, v in normalize_rows(rows).items()}
        missing = sorted(source.keys() - found.keys(), key=str)
        extra = sorted(found.keys() - source.keys(), key=str)
        wrong = sorted((k for k in source.keys() & found.keys() if source[k] != found[k]),
                       key=str)
        if missing or extra or wrong:
            problems.append(
                f"{table} {name}: {len(source)} source rows, {len(found)} lake rows; missing "
                f"{missing[:5]}, extra {extra[:5]}, different "
                f"{[(k, source[k], found[k]) for k in wrong[:3]]}")
    return problems
