"""Unpaced writers on the same machine (issue 7): the tailer keeps up and a capture ends.

Three writer processes commit single-row transactions as fast as MariaDB takes them while the
tailer runs and a capture of a few thousand rows walks the table. This checks termination,
not speed: every head position sampled while the writers ran must reach the lake within a
generous delay (a tailer that falls behind for good fails it), the capture must finish before
its deadline, and afterwards the mirror equals the source.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.common import TABLE, create_database, drop_database, fill, pipeline_config
from bench.workload import Commits, commit_writers
from dblog.app.runtime import open_runtime
from dblog.capture import CaptureRequest
from dblog.core.events import Position, TableId
from dblog.tail import BatchReport
from dblog.tail.background import BackgroundTailer
from devtools.services import Endpoints
from tests.integration.oracle import verify_table

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # Was a strict xfail while the tail fell behind unpaced writers (issue 7). Within the
    # bound in the last seven runs (2026-11-29: 5,962-6,838 tx/s, the delays at most 45 s of
    # the 90 s bound, the capture done in 54-70 s), 20 of the last 25. At slow hours of the
    # machine the delays had risen to 86-125 s, and once, at half speed, kept growing: a
    # failure here is a finding for issue 7, with its figures in the message. The runs'
    # figures since 2026-11-24: docs/testing.md ("make test-slow"), docs/performance.md and
    # this comment's history.
]

ROWS = 3000
WRITERS = 3
WRITE_SECONDS = 45.0
"""The writers run at least this long, and on until the capture ends."""
CATCH_UP_S = 90.0
"""Every head position seen while the writers ran reaches the lake within this delay."""
CAPTURE_DEADLINE_S = 300.0


def test_the_tail_keeps_up_and_a_capture_ends_under_unpaced_writers(
    services: Endpoints, spark: Any, tmp_path: Path
) -> None:
    db = f"unpaced_{uuid.uuid4().hex[:8]}"
    create_database(services, db)
    fill(services, db, ROWS)
    table = TableId(db, TABLE)
    config = pipeline_config(services, name=f"unpaced-{uuid.uuid4().hex[:6]}",
                             tables=[str(table)], lake=tmp_path / "lake", server_id=7990,
                             batch_seconds=1.0)
    committed: list[tuple[float, Position]] = []
    heads: list[tuple[float, Position]] = []
    commits = Commits()

    def on_batch(report: BatchReport) -> None:
        committed.append((time.monotonic(), report.position))

    try:
        with open_runtime(config, spark=spark) as rt:
            try:
                bg = BackgroundTailer(rt.tailer(on_batch=on_batch)).start()
                try:
                    rt.wait_started(bg.check)
                    with commit_writers(services, db, tps=float("inf"), writers=WRITERS,
                                        existing=ROWS, first_new=10 * ROWS, out=commits):
                        began = time.monotonic()
                        sampling = threading.Event()
                        sampler = threading.Thread(
                            target=_sample_heads, args=(rt.dialect, heads, sampling), daemon=True)
                        sampler.start()
                        capturer = rt.capturer()
                        capturer.health_check = bg.check
                        capture_id = capturer.plan(CaptureRequest((table,)))
                        deadline = threading.Event()
                        timer = threading.Timer(CAPTURE_DEADLINE_S, deadline.set)
                        timer.start()
                        try:
                            reports = capturer.run(capture_id, stop=deadline)
                        finally:
                            timer.cancel()
                        capture_s = time.monotonic() - began
                        while time.monotonic() - began < WRITE_SECONDS:
                            bg.check()
                            time.sleep(0.5)
                        sampling.set()
                        sampler.join(10)
                    caught_up = True
                    try:
                        rt.wait_caught_up(bg.check, timeout=CATCH_UP_S)
                    except Exception:  # reported with the figures below
                        caught_up = False
                finally:
                    bg.stop()
                delays = _catch_up_delays(heads, committed)
                report = verify_table(rt.dialect, rt.sink, table)
            finally:
                rt.state.delete("", recursive=True)
    finally:
        drop_database(services, db)

    seconds = max(WRITE_SECONDS, heads[-1][0] - heads[0][0]) if heads else WRITE_SECONDS
    rate = len(commits) / seconds
    assert rate > 200, f"the writers committed only {rate:.0f} tx/s: not a busy source"
    assert len(heads) >= 5, "too few head samples"
    late = [d for d in delays if d is None or d > CATCH_UP_S]
    figures = (f"writers at {rate:.0f} tx/s; capture {[r.status for r in reports]} after "
               f"{capture_s:.0f}s; catch-up delays of every 5th sampled head: {delays[::5]}")
    print(figures)
    assert [r.status for r in reports] == ["done"], figures
    assert not late and caught_up, (
        f"{len(late)} of {len(delays)} head positions did not reach the lake within "
        f"{CATCH_UP_S:.0f}s: {figures}")
    assert report.ok, report.summary()


def _sample_heads(dialect: Any, heads: list[tuple[float, Position]],
                  stop: threading.Event) -> None:
    while not stop.wait(2.0):
        heads.append((time.monotonic(), dialect.to_position(dialect.head_position())))


def _catch_up_delays(heads: list[tuple[float, Position]],
                     committed: list[tuple[float, Position]]) -> list[float | None]:
    """For each sampled head, seconds until a committed batch reached it (None: never)."""
    delays: list[float | None] = []
    for at, head in heads:
        reached = next((t for t, pos in committed if pos >= head), None)
        delays.append(None if reached is None else round(max(0.0, reached - at), 1))
    return delays
