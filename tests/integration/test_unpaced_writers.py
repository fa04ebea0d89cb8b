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
from pipeline.background import BackgroundTailer
from pipeline.capture import CaptureRequest
from pipeline.events import Position, TableId
from pipeline.runtime import open_runtime
from pipeline.services import Endpoints
from pipeline.tailer import BatchReport
from pipeline.verify import verify_table

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # Not met yet (issue 7): three unpaced writers commit 4,300-11,400 tx/s on this
    # project's 2-core machine (it depends on the day) while the tail decodes and writes
    # ~7,500 row events/s with both cores to itself, and far less on what the writers and
    # MariaDB leave of them, so the lag grows for as long as they write (2026-11-24, 11,377
    # tx/s: catch-up delays 34 s -> 215 s over four minutes, then never within the test).
    # The capture ends (234 s, the same run). 2026-11-25, chunks written once: 6,691 tx/s,
    # the delays level off at ~110 s (lag no longer growing, still over CATCH_UP_S) and the
    # capture ends in 136 s. 2026-11-26, the reader reading its own events, at half the
    # machine's usual speed: 4,121 tx/s, the delays rose to ~158 s and fell back to ~109 s
    # (the tail now gains on the writers, too slowly for the bound), the capture ended in
    # 200 s. Later that day, the mirror merged every 60 s while the tailer is behind: 4,046
    # tx/s, the delays rose from 70 s to ~137 s and fell to ~86 s, the capture ended in
    # 177 s; a second run (4,047 tx/s): 76 s -> ~129 s, then level at ~115-124 s, the
    # capture ended in 164 s. That night, with the codegen cache of 1,000 classes: 3,861
    # tx/s, the delays rose from 83 s to ~150 s and fell to ~133 s, the capture ended in
    # 199 s. Later still, with C2's thresholds raised (be03bd3): 4,300 tx/s, the delays
    # 58-92 s (78 s at the start, 92 s at the worst, 58 s at the end), just over the bound,
    # the capture ended in 131 s. 2026-11-27, the mirror waiting while chunk windows are
    # open (1e33657), three runs in a row: 5,829 tx/s, delays 47-77 s, the capture ended in
    # 107 s (an XPASS); 5,433 tx/s, 55-117 s, 149 s; 4,613 tx/s, 63-125 s, 157 s: the
    # delays peak in the first third of the samples and fall after, around the bound.
    # Later that day, the tailer pinning ahead (485feb6), four runs in a row: 5,651 tx/s,
    # delays 40-79 s, capture 106 s; 5,522 tx/s, 38-61 s, 94 s; 5,976 tx/s, 40-72 s, 97 s
    # (three XPASSes); then 5,080 tx/s, 42-102 s (6 of 56 heads over the bound), 127 s.
    # The next stop, with the pins ahead bounded by TailOptions.pin_ahead_s, two runs:
    # 5,809 tx/s, delays 34-57 s, capture 82 s; 5,545 tx/s, 40-74 s, 99 s (two XPASSes).
    # The stop after, the MariaDB reader handing out a transaction once nothing more has
    # arrived (143d252, replaced the same stop by a 0.05 s heartbeat, which matters only on
    # a quiet log), two runs: 6,646 tx/s, delays 34-51 s, capture 74 s; 6,497 tx/s,
    # 36-51 s, 75 s (two XPASSes; 7 of the last 8 runs within the bound). The stop after
    # (merge-on-read, 1f46df0), one run: 5,971 tx/s, delays 35-62 s, capture 85 s (XPASS).
    # 2026-11-28 on 41e630a, a slow hour (make test 42 min): 3,428 tx/s, delays 53-109 s,
    # capture 153 s (XFAIL). Later, the coverage check off the log-reading thread
    # (a92c84a), a slower hour still (make test 61 min): 3,751 tx/s, delays 41-86 s,
    # capture 110 s (XPASS; 9 of the last 12 runs within the bound).
    # Strict: the day it passes every time, this mark must go.
    pytest.mark.xfail(strict=True, reason="issue 7: the tail is slower than unpaced writers"),
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
