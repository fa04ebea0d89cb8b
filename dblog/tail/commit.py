"""Writing a cut batch to the lake and committing it in ZooKeeper: the batch intent is
recorded first (a replay after a crash must rebuild the same batch), then each table's
changelog is written (idempotent per batch), then one ZooKeeper transaction moves the
position and records every chunk window the batch settled."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from dblog.core.batching import Cut, ReplayMismatch
from dblog.core.errors import StateConflict
from dblog.core.faults import crash_point
from dblog.lake.sink import DeltaSink, WriteAttempt
from dblog.sources.base import SourceDialect
from dblog.state import (
    BATCH_INTENT,
    BatchIntent,
    CommitResult,
    PositionState,
    RangeUpdate,
    StateStore,
    Versioned,
    WindowUpdate,
)
from dblog.tail.batch import Pending, placed
from dblog.tail.emissions import Emissions
from dblog.tail.options import BatchReport, TailSummary
from dblog.tail.windows import WindowBook

__all__ = ["Committer", "pending_replay"]

log = logging.getLogger("dblog.tail")  # one logger for the tailer, as operators know it


def pending_replay(state: StateStore, dialect: SourceDialect,
                   committed: Versioned[PositionState]) -> tuple[Cut, dict[str, str]] | None:
    """The recorded batch to rebuild exactly, if the last run crashed while writing it, with
    the window outcomes it must hold."""
    intent = state.get_batch_intent()
    if intent is None:
        return None
    if intent.value.batch != committed.value.batch + 1:
        # Left over from before a reset (commit_batch clears the intent it commits).
        log.warning("dropping a stale batch intent for batch %d (committed: %d)",
                    intent.value.batch, committed.value.batch)
        state.delete(BATCH_INTENT, intent.version)
        return None
    if dict(intent.value.start) != dict(committed.value.source_position):
        raise ReplayMismatch(
            f"batch {intent.value.batch} was recorded to start at {dict(intent.value.start)}"
            f", but the committed position is {dict(committed.value.source_position)}: "
            "the ZooKeeper state was changed by hand; run `dblog tail --from-head` and a "
            "capture"
        )
    return (Cut(dialect.to_position(intent.value.end), dict(intent.value.end)),
            dict(intent.value.windows))


class Committer:
    """Writes one run's cut batches and commits them, in order."""

    def __init__(self, *, state: StateStore, sink: DeltaSink, dialect: SourceDialect,
                 windows: WindowBook, emissions: Emissions, identifier: str,
                 on_batch: Callable[[BatchReport], None] | None) -> None:
        self.state = state
        self.sink = sink
        self.dialect = dialect
        self.windows = windows
        self.emissions = emissions
        self.identifier = identifier
        self.on_batch = on_batch

    def flush(
        self,
        pending: Pending,
        batch_no: int,
        committed: Versioned[PositionState],
        summary: TailSummary,
        later: Pending | None = None,
    ) -> Versioned[PositionState]:
        """Write and commit ``pending`` as batch ``batch_no`` once its pinned chunks have
        their files; ``later``: the batch being built after it (see
        :meth:`Emissions.settle_pinned`)."""
        assert pending.end is not None and pending.end_position is not None
        began = time.monotonic()
        self.emissions.settle_pinned(pending, later)
        self.state.check_leader()
        attempt = self._record_intent(pending, batch_no, committed)
        report = BatchReport(batch_no, pending.end_position, pending.events,
                             commit_ts_ms=pending.commit_ts_ms)
        emitted_rows, deleted_rows = self._write_tables(pending, batch_no, committed, attempt,
                                                        report)
        touched = self._count_rows(pending, emitted_rows, deleted_rows, report)
        ranges: list[RangeUpdate] = []
        for key in sorted(touched):
            # The range's place as of this batch's last chunk of it: the tailer may have
            # pinned later chunks of the range for the batch after this one already.
            cur = self.emissions.ranges[key]
            ranges.append(RangeUpdate(key[0], key[1],
                                      placed(cur.value, pending.advanced[key]), cur.version))
        crash_point("tail.after_delta")
        self.state.check_leader()
        new_state = PositionState(
            pending.end_position, dict(pending.end), batch_no,
            generation=committed.value.generation,
            commit_ts_ms=pending.commit_ts_ms or committed.value.commit_ts_ms,
        )
        result = self._commit(new_state, committed.version, ranges,
                              list(pending.window_updates.values()))
        for key in touched:
            self.emissions.ranges[key] = Versioned(self.emissions.ranges[key].value,
                                                   result.range_versions[key])
        self.windows.committed(pending.window_updates)
        self._report(pending, report, began, summary)
        return Versioned(new_state, result.position_version)

    def _write_tables(self, pending: Pending, batch_no: int,
                      committed: Versioned[PositionState], attempt: WriteAttempt,
                      report: BatchReport) -> tuple[dict[str, int], dict[str, int]]:
        """Write each table's part of the batch to its changelog; the rows each chunk
        window emitted and deleted."""
        assert pending.end_position is not None
        app_id = committed.value.txn_app_id(self.state.source)
        metadata = {
            "dblog.batch": batch_no,
            "dblog.from_lsn": committed.value.position.lsn,
            "dblog.to_lsn": pending.end_position.lsn,
            "dblog.windows_closed": sorted(
                w for w, u in pending.window_updates.items() if u.status != "registered"
            ),
            "dblog.tailer": self.identifier,  # who wrote it (a standby that took over)
        }
        emitted_rows: dict[str, int] = {}
        deleted_rows: dict[str, int] = {}
        crash_point("tail.before_delta")
        for table, tb in pending.tables.items():
            report.table_events[table] = len(tb.events) + len(tb.truncates)
            for schema in pending.schemas.get(table, []):
                self.sink.ensure_schema(schema)
            if not self.sink.known_columns(table):
                if not (tb.events or tb.emissions):
                    # Only TRUNCATEs / DROPs of a table the lake holds nothing of: nothing
                    # to empty (and a dropped table has no schema left to ask for).
                    log.info("%s: truncated or dropped before the lake held any of it; "
                             "nothing to empty", table)
                    continue
                self.sink.ensure_schema(self.dialect.table_schema(table))
            self.state.check_leader()
            _, results = self.sink.write_table_batch(tb, batch_no, metadata, attempt=attempt,
                                                     app_id=app_id, merge_mirror=False)
            crash_point("tail.after_table_write")
            for r in results:
                emitted_rows[r.window_id] = r.rows_emitted
                deleted_rows[r.window_id] = r.rows_deleted
        return emitted_rows, deleted_rows

    def _count_rows(self, pending: Pending, emitted_rows: Mapping[str, int],
                    deleted_rows: Mapping[str, int], report: BatchReport
                    ) -> set[tuple[str, str]]:
        """Add the rows each emitted window wrote to its range's counts and its window
        update; the ranges touched."""
        touched: set[tuple[str, str]] = set()
        ranges = self.emissions.ranges
        for wid, update in pending.window_updates.items():
            doc = self.windows.docs.get(wid)
            if update.status == "emitted" and doc is not None:
                key = (str(doc.extra["capture_id"]), str(doc.extra["range_id"]))
                rows = emitted_rows.get(wid, 0)
                selected = int((update.extra or {}).get("rows_selected", rows))
                cur = ranges[key]
                progress = replace(
                    cur.value,
                    rows_emitted=cur.value.rows_emitted + rows,
                    rows_dropped=cur.value.rows_dropped + selected - rows,
                    rows_deleted=cur.value.rows_deleted + deleted_rows.get(wid, 0),
                )
                ranges[key] = Versioned(progress, cur.version)
                touched.add(key)
                pending.window_updates[wid] = WindowUpdate(
                    wid, "emitted", extra={**(update.extra or {}), "rows_emitted": rows,
                                           "rows_deleted": deleted_rows.get(wid, 0)}
                )
                report.emitted_windows.append(wid)
                report.rows_emitted += rows
            elif update.status == "aborted":
                report.aborted_windows.append(wid)
        return touched

    def _report(self, pending: Pending, report: BatchReport, began: float,
                summary: TailSummary) -> None:
        """Log the committed batch, count it in ``summary`` and hand it to ``on_batch``."""
        report.seconds = time.monotonic() - began
        log.info("batch %d: %d events, %d emitted / %d aborted windows, %d chunk rows, "
                 "built in %.2fs, written in %.2fs", report.batch, pending.events,
                 len(report.emitted_windows), len(report.aborted_windows), report.rows_emitted,
                 began - pending.opened, report.seconds)
        summary.batches += 1
        summary.events += pending.events
        summary.rows_emitted += report.rows_emitted
        summary.position = pending.end_position
        if self.on_batch is not None:
            self.on_batch(report)

    def _record_intent(self, pending: Pending, batch_no: int,
                       committed: Versioned[PositionState]) -> WriteAttempt:
        """Write ahead what batch ``batch_no`` holds and who writes it; a replay must match
        the record, and writes as a new attempt after the recorded ones."""
        assert pending.end is not None
        outcomes = {w: u.status for w, u in pending.window_updates.items()
                    if u.status != "registered"}
        attempt = WriteAttempt(pending.attempt)
        found = self.state.get_batch_intent()
        if found is None:
            intent = BatchIntent(batch_no, dict(pending.start), dict(pending.end),
                                 windows=outcomes, attempts=(attempt.id,))
            self.state.create_batch_intent(intent, committed.version)
            return attempt
        recorded = found.value
        if recorded.batch != batch_no:
            raise StateConflict(f"a batch intent for batch {recorded.batch} appeared while "
                                f"batch {batch_no} was built: another tailer is writing")
        differences = []
        if dict(recorded.end) != dict(pending.end):
            differences.append(f"end {dict(pending.end)} instead of {dict(recorded.end)}")
        if dict(recorded.windows) != self._with_aborts_settled_since(outcomes, recorded):
            differences.append(f"windows {outcomes} instead of {dict(recorded.windows)}")
        if differences:
            raise ReplayMismatch(
                f"replayed batch {batch_no} differs from the batch written before the crash "
                f"({'; '.join(differences)}); nothing was written. Run `dblog tail "
                "--from-head` and a capture to start over"
            )
        self.state.add_batch_attempt(found, attempt.id)
        return WriteAttempt(attempt.id, earlier=recorded.attempts,
                            legacy_replay=not recorded.attempts)

    def _with_aborts_settled_since(self, outcomes: Mapping[str, str],
                                   recorded: BatchIntent) -> dict[str, str]:
        """``outcomes`` with the windows the recorded batch aborted that are no longer
        registered: their capture, resumed before this replay, settled them the same way
        (aborted, then forgotten: ``Capturer._recover``), so this replay never saw them.
        An aborted window adds nothing to a batch, so the replay writes the same data."""
        settled = dict(outcomes)
        for wid, status in recorded.windows.items():
            if status != "aborted" or wid in settled:
                continue
            found = self.state.get_window(wid)
            if found is None or found.value.status == "aborted":
                settled[wid] = "aborted"
        return settled

    def _commit(self, new_state: PositionState, expected: int, ranges: list[RangeUpdate],
                windows: list[WindowUpdate]) -> CommitResult:
        def still_ours() -> bool:
            current = self.state.get_position()
            return current is not None and current.version == expected

        return _retry_conflicts(
            lambda: self.state.commit_batch(new_state, expected, ranges=ranges, windows=windows),
            still_ours,
        )


def _retry_conflicts(attempt: Callable[[], CommitResult], still_ours: Callable[[], bool]
                     ) -> CommitResult:
    """Retry a commit that lost a race on a window document (a capture settling one of its
    windows); a moved position means another tailer: that is never retried."""
    for tries in range(10):
        try:
            return attempt()
        except StateConflict:
            if tries == 9 or not still_ours():
                raise
            time.sleep(0.05 * (tries + 1))
    raise AssertionError("unreachable")
