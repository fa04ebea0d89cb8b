"""The most important test, part of the contract suite (it runs for every source database):
writers run while a full capture and the tail run; then mirror == source, an independent
pandas replay of the changelog == source, no key goes back in position, every row that
existed throughout unchanged was captured exactly once, and the changelog's log events are
exactly the changes the writers committed, each once, in commit order per key, with the
values written (:func:`tests.integration.checks.check_history`).

Each run has a random seed (``--seeds N`` of them from ``--seed-base``, a fresh one each
session unless given) and one of four variants, every variant at least once per database.
Odd variants run an insert-heavy workload (half the statements append rows after the largest
key): the capture must still finish, since a range's upper bound is fixed when it starts.
Variants 2 and 3 close a batch soon after it holds a log change (``tail.pin_ahead_s`` 1 s
and 0), and variant 2 writes each chunk's files two seconds late: closed batches then wait
for chunks' files while the tailer reads on and pins the next chunks for the batch after
them."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import parse_config
from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import TableId
from dblog.tail.background import BackgroundTailer
from devtools.sample import TABLES
from tests.integration.checks import check_history, check_table, check_untouched_captured_once
from tests.integration.oracle import verify_table
from tests.integration.sources import KEYS, SourceKit

pytestmark = pytest.mark.integration

VARIANTS = 4
"""Kinds of run (see the module's docstring); ``tests/conftest.py`` runs each at least once."""


def run_with_deadline(capturer: Any, capture_id: str, seconds: float) -> list[Any]:
    """Run the capture; fail (instead of hanging) if it has not finished in time."""
    import threading

    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        reports: list[Any] = capturer.run(capture_id, stop=stop)
    finally:
        timer.cancel()
    assert not stop.is_set(), f"the capture did not finish within {seconds:.0f}s"
    return reports


def test_concurrent_writes_capture_and_tail(
    source_kit: SourceKit, spark: Any, tmp_path: Path, seed: int, variant: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = source_kit.create(f"e2e_{seed}", accounts=1500, orders=1000, seed=seed)
    source = f"e2e-{seed}-{uuid.uuid4().hex[:6]}"
    try:
        initial = {t: source_kit.rows(db, t) for t in TABLES}
        data = source_kit.config_data(
            source=source, db=db, lake=tmp_path / "lake",
            # Chunks grow as fast ones do in production (up to eightfold), still three
            # windows a table: 100 rows, 800, then the rest.
            chunk_size=100, batch_seconds=1.0, chunk_max_rows=10_000,
        )
        # The 800-row and the last chunk are read by three selects at once, each over the
        # key range planned for it, while the writers change rows in all of them.
        data["capture"].update(read_partitions=3, read_partition_rows=100)
        if variant >= 2:
            # A batch holding a log change closes soon (variant 3: at once), chunks' files
            # or not: the tailer then reads on into the next batch, and pins the chunks
            # after them, while the closed one waits for them.
            data["tail"]["pin_ahead_s"] = 1.0 if variant == 2 else 0
        if variant == 2:
            from dblog.capture import writer as capture_module

            write_files = capture_module.write_chunk_files

            def late_files(*args: Any, **kwargs: Any) -> Any:
                time.sleep(2.0)
                return write_files(*args, **kwargs)

            monkeypatch.setattr(capture_module, "write_chunk_files", late_files)
        config = parse_config(data)
        with open_runtime(config, spark=spark) as rt:
            bg = BackgroundTailer(rt.tailer()).start()
            try:
                rt.wait_started(bg.check)
                insert_heavy = variant % 2 == 1
                # The same transaction pace for both shapes: what the tail keeps up with on
                # two shared cores today (faster writers are the throughput benchmarks'
                # business). Every 10th existing key is left alone, so the untouched-rows
                # check keeps its power however slow the machine.
                workload = source_kit.workload(db, seed, pause_s=0.03, reserve_every=10,
                                               append_ratio=0.5 if insert_heavy else 0.0)
                try:
                    capturer = rt.capturer()
                    capturer.health_check = bg.check
                    capture_id = capturer.plan(
                        CaptureRequest(tuple(TableId(db, t) for t in TABLES)))
                    reports = run_with_deadline(capturer, capture_id, seconds=600)
                    time.sleep(1.0)  # keep writing after the capture too
                finally:
                    workload.stop()
                assert [r.status for r in reports] == ["done", "done"], reports
                assert all(r.chunks >= 3 for r in reports), reports  # windows to interleave
                assert workload.ops > 50, "the writers barely ran"
                # The changelog holds the log; the mirrors may not yet (they merge
                # beside it, maybe meanwhile): the current state is the source already.
                rt.wait_caught_up(bg.check, mirrors=False)
                for table in TABLES:
                    report = verify_table(rt.dialect, rt.sink, TableId(db, table),
                                          current=True)
                    assert report.ok, report.summary()
                rt.wait_caught_up(bg.check)
            finally:
                bg.stop()
            final: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
            frames: dict[str, Any] = {}
            for table in TABLES:
                report = verify_table(rt.dialect, rt.sink, TableId(db, table))
                assert report.ok, report.summary()
                final[table] = source_kit.rows(db, table)
                frames[table] = check_table(spark, source_kit.ep, db, table, KEYS[table],
                                            rt.layout.changelog(TableId(db, table)),
                                            expected_rows=final[table])
                untouched = check_untouched_captured_once(
                    frames[table], table, KEYS[table], set(initial[table]), workload.touched)
                assert untouched > 20, "too few untouched rows for the check to mean anything"
            # The writers started after the tailer's first position: the log holds every
            # change they committed.
            assert not workload.history.uncertain, "a writer's commit was cut off"
            checked = {table: check_history(frames[table], table, KEYS[table], initial[table],
                                            workload.history.of(table), final[table])
                       for table in TABLES}
            print(f"history checked: {checked}")
            assert all(c.changes > 50 for c in checked.values()), \
                f"too few changes for the history check to mean anything: {checked}"
            assert sum(c.rewritten_keys for c in checked.values()) > 5, \
                f"too few keys changed more than once (where a lost change hides): {checked}"
            rt.state.delete("", recursive=True)
    finally:
        source_kit.forget(source)
        source_kit.drop(db)
