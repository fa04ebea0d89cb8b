"""Walking one key range, chunk by chunk, to its end: its upper bound fixed first, chunks
pipelined (selected while earlier ones wait for their commit)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import cast

from dblog.capture.chunk import ChunkSteps
from dblog.capture.options import RangeReport
from dblog.capture.rows import first_key
from dblog.capture.windows import WindowSettling
from dblog.capture.writer import ChunkWriter, PinnedFiles
from dblog.core.chunking import next_chunk_rows
from dblog.core.errors import DblogError, StateConflict
from dblog.core.events import Key, key_from_json, key_to_json
from dblog.protocol.paths import bounds_path
from dblog.sources.base import TableSchema
from dblog.state import RangeProgress


class RangeWalk(ChunkSteps, PinnedFiles, WindowSettling):
    """Captures one key range to its end."""

    def run_range(
        self,
        capture_id: str,
        range_id: str,
        *,
        stop: threading.Event | None = None,
        on_progress: Callable[[RangeReport], None] | None = None,
    ) -> RangeReport:
        """Capture one key range to the end (or until paused, cancelled or stopped)."""
        began = time.monotonic()
        stop = stop or threading.Event()
        found = self.state.get_range(capture_id, range_id)
        if found is None:
            raise DblogError(f"capture {capture_id} has no range {range_id}")
        table = found.value.table
        report = RangeReport(capture_id, range_id, table)
        capture = self.state.get_capture(capture_id)
        assert capture is not None
        keys = capture.value.spec.get("keys")
        where = capture.value.spec.get("where")
        key_list = tuple(cast(Key, key_from_json(k)) for k in keys) if keys is not None else None
        self._recover(capture_id, range_id, stop)
        while True:
            progress = self._progress(capture_id, range_id)
            if progress.done:
                report.status = "done"
                break
            status = self._status(capture_id)
            if status != "running":
                report.status = status
                break
            if stop.is_set():
                report.status = "stopped"
                break
            ends_range = open_end = False
            if key_list is None:
                fixed = self._fix_upper(capture_id, range_id, stop)
                if fixed is None:
                    continue  # stopped while waiting for the tailer
                progress, ends_range, open_end = fixed
            outcome = self._walk(
                capture_id, range_id, progress, key_list, where, stop, report, on_progress,
                ends_range=ends_range, open_end=open_end,
            )
            if outcome == "aborted":
                report.retries += 1
        final = self._progress(capture_id, range_id)
        report.rows_emitted = final.rows_emitted
        report.rows_dropped = final.rows_dropped
        report.rows_deleted = final.rows_deleted
        report.seconds = time.monotonic() - began
        if on_progress is not None:
            on_progress(report)
        return report


    def _fix_upper(
        self, capture_id: str, range_id: str, stop: threading.Event
    ) -> tuple[RangeProgress, bool, bool] | None:
        """Fix an open upper bound to the table's greatest key (once, before the first chunk).

        Returns the progress, whether the range ends with its next chunk (no key lay above
        its lower bound) and whether it was open-ended (then it ends with one chunk past the
        fixed bound, see :meth:`_walk`); ``None`` if stopped while waiting for the tailer.
        The key is read only once the tailer has a committed position: a row inserted later
        lands in the log after it, so the tail brings it.
        """
        while True:
            found = self.state.get_range(capture_id, range_id)
            if found is None:
                raise DblogError(f"range {range_id} of capture {capture_id} disappeared")
            progress = found.value
            if progress.done:
                return progress, False, False
            note = self.state.get(bounds_path(capture_id, range_id))
            if note is not None:
                empty = bool(note.value.get("empty"))
                return progress, empty, not empty
            if progress.upper is not None:
                return progress, False, False
            if not self._wait_for_position(stop):
                return None
            position = self.state.get_position()
            assert position is not None
            schema = self.dialect.table_schema(progress.table)
            top = first_key(
                self.dialect.read_max_key(self.spark, schema, progress.lower), schema
            )
            try:
                if top is not None:
                    self.state.put_range(
                        capture_id, range_id, replace(progress, upper=top), found.version
                    )
                self.state.put(bounds_path(capture_id, range_id), {
                    "upper": key_to_json(top), "empty": top is None,
                    "after_position": position.value.position.to_json(),
                }, None)
            except StateConflict:
                pass  # changed meanwhile (another runner?)
            # Look again: the stored bound (ours, or a concurrent runner's) is the one to use.


    def _wait_for_position(self, stop: threading.Event) -> bool:
        """Wait until the tailer committed a log position; False if stopped meanwhile."""
        deadline = time.monotonic() + self.options.position_timeout_s
        while self.state.get_position() is None:
            if self.health_check is not None:
                self.health_check()
            if stop.is_set():
                return False
            if time.monotonic() >= deadline:
                raise DblogError(
                    f"no tailer committed a log position within "
                    f"{self.options.position_timeout_s:.0f}s: a capture fixes its ranges' "
                    "upper bounds only once the log is tailed; is a tailer running for this "
                    "source? (`dblog tail`)"
                )
            time.sleep(self.options.poll_seconds)
        return True


    def _walk(
        self,
        capture_id: str,
        range_id: str,
        progress: RangeProgress,
        keys: tuple[Key, ...] | None,
        where: str | None,
        stop: threading.Event,
        report: RangeReport,
        on_progress: Callable[[RangeReport], None] | None,
        *,
        ends_range: bool = False,
        open_end: bool = False,
    ) -> str:
        """Select chunks from the last emitted key, pipelined; returns how the walk ended.

        An ``open_end`` range (its upper bound was fixed from "open") ends with a read past
        that bound without an upper limit: it always ends the range, rows inserted up there
        since are current at its high watermark anyway, and when it comes back short it
        proves which mirror keys past the table's old end no longer exist. A planned chunk
        that reaches the bound reads on past it in its own window; a filtered range's chunks
        (not planned) and a range resumed at the bound read past it in one chunk more.
        """
        table = progress.table
        schema = self.dialect.table_schema(table)
        with ChunkWriter(partial(self._write_held, stop=stop)) as writer:
            # The lake's tables made (once) beside the first select, not by the tailer at
            # the first high watermark, where the chunk's files would wait for it.
            writer.run(partial(self.sink.ensure_tables, schema))
            return self._walk_with(writer, capture_id, range_id, progress, schema, keys, where,
                                   stop, report, on_progress, ends_range=ends_range,
                                   open_end=open_end)


    def _walk_with(
        self,
        writer: ChunkWriter,
        capture_id: str,
        range_id: str,
        progress: RangeProgress,
        schema: TableSchema,
        keys: tuple[Key, ...] | None,
        where: str | None,
        stop: threading.Event,
        report: RangeReport,
        on_progress: Callable[[RangeReport], None] | None,
        *,
        ends_range: bool,
        open_end: bool,
    ) -> str:
        """:meth:`_walk`, each selected chunk handed to ``writer`` (it writes the chunk's
        files once the tailer pins it, while the next chunk is selected)."""
        table = progress.table
        first = self.options.chunk_sizes.get(table, self.options.chunk_size)
        limit = first
        after = progress.last_emitted_key
        past_bound = open_end and after is not None and after == progress.upper
        inflight: list[str] = []
        outcome = "done"
        while True:
            if stop.is_set() or self._status(capture_id) != "running":
                outcome = "interrupted"
                break
            outcome = self._make_room(inflight, report, stop, on_progress)
            if outcome in ("aborted", "interrupted"):
                break
            if self.read_rate is not None:
                if not self.read_rate.wait(stop):
                    outcome = "interrupted"
                    break
                limit = min(limit, self.read_rate.chunk_rows(self.options.chunk_target_seconds))
            bounded = open_end and not past_bound
            began = time.monotonic()
            held, rows, last, reached_end = self._chunk(
                capture_id, range_id, table, schema, after,
                None if past_bound else progress.upper, keys, where, limit,
                ends_range=ends_range or past_bound, not_final=bounded,
            )
            wid = held.window_id
            writer.submit(held)
            if self.read_rate is not None:
                self.read_rate.charge(rows)
            report.rows_selected += rows
            limit = next_chunk_rows(
                limit, rows, time.monotonic() - began, first=first,
                most=max(first, self.options.chunk_max_rows),
                target_seconds=self.options.chunk_target_seconds,
            )
            inflight.append(wid)
            report.chunks += 1
            if (reached_end and not bounded) or held.ends_range:
                break
            if reached_end:
                past_bound = True
            after = last
        # On an exception the windows stay open; the next run's _recover settles them.
        # On a stop the windows still in flight stay open; the next run's _recover settles
        # them (the tailer may well emit them meanwhile).
        writer.flush()
        outcome = self._wait_all(inflight, report, stop, outcome)
        self._cleanup(capture_id, range_id)
        return outcome

    def _make_room(self, inflight: list[str], report: RangeReport, stop: threading.Event,
                   on_progress: Callable[[RangeReport], None] | None) -> str:
        """Wait for the oldest windows in flight until fewer than ``max_in_flight`` are:
        ``"done"``, or ``"aborted"``/``"interrupted"`` (the walk ends)."""
        while len(inflight) >= self.options.max_in_flight:
            waited = self._wait(inflight[0], report, stop)
            if waited == "interrupted":
                return "interrupted"
            inflight.pop(0)
            if waited == "aborted":
                return "aborted"
            if on_progress is not None:
                on_progress(report)
        return "done"

    def _wait_all(self, inflight: list[str], report: RangeReport, stop: threading.Event,
                  outcome: str) -> str:
        """Wait for every window still in flight; the walk's outcome after them."""
        for wid in inflight:
            waited = self._wait(wid, report, stop)
            if waited == "interrupted":
                return "interrupted"
            if waited == "aborted":
                outcome = "aborted"
        return outcome

