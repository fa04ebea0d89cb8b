"""Chunk emissions: a chunk whose high watermark the log reached is pinned for the batch
being built (its capture writes its changelog files for it), and added to the batch once
those files are there; else it is aborted, with every chunk of its range pinned after it.
Each range's progress is judged and advanced here."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial

from dblog.core.chunking import KeyRange
from dblog.core.errors import DblogError
from dblog.core.events import Key, TableId, key_from_json
from dblog.core.faults import crash_point
from dblog.core.window import ChunkEmission
from dblog.lake.sink import DeltaSink
from dblog.protocol.chunks import ChunkDescription, ChunkFiles, ChunkPin
from dblog.sources.base import SourceDialect
from dblog.state import Lookout, RangeProgress, StateStore, Versioned, WindowUpdate, handoff
from dblog.tail.batch import Pending, Pinned, StopRequested, placed
from dblog.tail.windows import WindowBook

__all__ = ["FILES_LOOK_S", "FILES_WAIT_S", "Emissions"]

FILES_LOOK_S = 1.0
"""A pinned chunk's handoff is read when its ZooKeeper watches fire, and at least this often
(its files' deadline; a watch lost with an expired session)."""
FILES_WAIT_S = 0.1
"""How long a batch that must be written waits for a watch before it checks for a stop."""


class Emissions:
    """One run's chunk emissions: pins, the capture ranges' progress (:attr:`ranges`), and
    the pinned chunks' files, awaited before their batch is written."""

    def __init__(self, *, state: StateStore, sink: DeltaSink, dialect: SourceDialect,
                 windows: WindowBook, files_timeout_s: float, closed: list[Pending],
                 coverage_checks: ThreadPoolExecutor, key_order: dict[TableId, bool],
                 stop: threading.Event) -> None:
        """``files_timeout_s``: :attr:`TailOptions.chunk_files_timeout_s`; ``closed``: the
        run's batches cut but not written (a pin names its batch after them);
        ``coverage_checks``: where the mirror checks run; ``key_order``: per table, whether
        Spark orders its keys like the source (kept across runs)."""
        self.state = state
        self.sink = sink
        self.dialect = dialect
        self.windows = windows
        self.files_timeout_s = files_timeout_s
        self.closed = closed
        self.coverage_checks = coverage_checks
        self.key_order = key_order
        self.stop = stop
        self.ranges: dict[tuple[str, str], Versioned[RangeProgress]] = {}
        """Per capture range, its progress as of the chunks pinned so far."""

    def _range(self, capture_id: str, range_id: str) -> Versioned[RangeProgress] | None:
        key = (capture_id, range_id)
        if key not in self.ranges:
            found = self.state.get_range(capture_id, range_id)
            if found is None:
                return None
            self.ranges[key] = found
        return self.ranges[key]

    def accept_emission(self, em: ChunkEmission, pending: Pending) -> None:
        """Pin the chunk for this batch if it continues its range exactly (its files are
        awaited before the batch is written: :meth:`settle_pinned`); else abort it."""
        wid = em.window.window_id
        doc = self.windows.docs.get(wid)
        chunk = handoff.read_description(self.state, em.window.table, wid)
        reason = None
        if doc is None or chunk is None:
            reason = "the chunk was never described by its capture"
        else:
            cid, rid = doc.extra.get("capture_id"), doc.extra.get("range_id")
            progress = self._range(str(cid), str(rid)) if cid and rid else None
            if progress is None:
                reason = "its capture range is gone"
            elif progress.value.done or progress.value.last_emitted_key != key_from_json(
                doc.extra.get("after_key")
            ):
                reason = "out of order: the chunk before it was not emitted"
            elif (self.windows.replay_outcomes or {}).get(wid) == "aborted":
                reason = "aborted when this batch was first written"
        if reason is not None:
            self.windows.abort(wid, reason, pending)
            return
        assert doc is not None and chunk is not None
        covered = self._coverage(em.window.table, chunk.delete_range)
        pin, mirror_check = self._pin(em, chunk, pending, covered)
        self.windows.settled.add(wid)
        # Advance the in-memory progress now so a later chunk of the same range in this
        # batch is judged against it (rolled back if this chunk's files never come);
        # ZooKeeper gets it in the batch's commit.
        range_key = (str(doc.extra["capture_id"]), str(doc.extra["range_id"]))
        current = self.ranges[range_key]
        last = chunk.last_key
        new = replace(
            current.value,
            last_emitted_key=last if last is not None else current.value.last_emitted_key,
            chunks_emitted=current.value.chunks_emitted + 1,
            done=chunk.final,
        )
        self.ranges[range_key] = Versioned(new, current.version)
        pending.pinned.append(Pinned(
            em, pin, range_key, current, new, covered,
            deadline=time.monotonic() + self.files_timeout_s,
            lookout=Lookout(partial(handoff.watch_files, self.state, pin.window_id),
                            FILES_LOOK_S),
            mirror_check=mirror_check))

    def _pin(self, em: ChunkEmission, chunk: ChunkDescription, pending: Pending,
             covered: KeyRange | None) -> tuple[ChunkPin, Future[bool] | None]:
        """Pin the window for this batch: its capture writes the chunk's files for it; the
        pin, and the check whether the mirror holds a row in the chunk's coverage (without
        one the chunk can delete none: :meth:`DeltaSink.mirror_holds`).

        The check is a Spark job, run in a thread of its own while the log is read on and
        the capture writes the chunk's files; the batch is written once it has its answer.
        Any time between the pin and the batch's write is as good as another: the mirror
        then changes only by merges of batches before this one, and a merge that lands
        after the check adds only rows of keys the chunk holds, was told of (dropped,
        changed before its high watermark) or saw deleted, so a check that found no row
        leaves no row for the chunk to delete.

        The lake first gets every column of the chunk, so that the capture can write its
        rows in the lake's schema. Files written for an earlier attempt (this tailer's
        predecessor died before its commit) do as well: the commit writes their rows again
        with this attempt's tags."""
        table = em.window.table
        if chunk.schema is not None:
            self.sink.ensure_schema(chunk.schema)
        elif not self.sink.known_columns(table):
            self.sink.ensure_schema(self.dialect.table_schema(table))
        pin = ChunkPin(em.window.window_id, self._batch_no() + len(self.closed),
                       pending.attempt,
                       em.position.lsn, em.position.seq, em.commit_ts_ms,
                       tuple(em.dropped_keys))
        self.state.check_leader()
        handoff.write_pin(self.state, pin)
        crash_point("tail.after_pin")
        if covered is None:
            return pin, None
        return pin, self.coverage_checks.submit(self.sink.mirror_holds, table, covered)

    def pinned_files_ready(self, pending: Pending) -> bool:
        """Whether every chunk the batch pinned has its files, or never will (then it is
        aborted when the batch is written), and its mirror check's answer: the batch can be
        written without waiting. Reads ZooKeeper only for a chunk whose handoff changed
        since the last read, or once every ``FILES_LOOK_S`` (it is asked per transaction)."""
        if not pending.pinned:
            return True
        if not all(pinned.checked for pinned in pending.pinned):
            return False
        for pinned in pending.pinned:
            if pinned.files is None:
                found = self._files_if_changed(pinned)
                if found is None:
                    return False
                if isinstance(found, ChunkFiles):
                    pinned.files = found
        return True

    def settle_pinned(self, pending: Pending, later: Pending | None = None) -> None:
        """Wait for the files of every chunk the batch pinned, in order, and add the chunks
        to the batch; a chunk whose files never come is aborted, and so is every later
        chunk of its range, here and in the batch being built after it (``later``): the
        range's place goes back to before it."""
        failed: set[tuple[str, str]] = set()
        for pinned in pending.pinned:
            found = self._settled_files(pinned, failed)
            if isinstance(found, str):
                if pinned.range_key not in failed:
                    failed.add(pinned.range_key)
                    self._rewind_range(pinned)
                if pinned.mirror_check is not None:
                    pinned.mirror_check.cancel()
                pending.window_updates[pinned.pin.window_id] = WindowUpdate(
                    pinned.pin.window_id, "aborted", detail=found)
                continue
            self._add_emission(pinned, found, pending)
        pending.pinned.clear()
        if later is not None and failed:
            for pinned in [p for p in later.pinned if p.range_key in failed]:
                later.pinned.remove(pinned)
                if pinned.mirror_check is not None:
                    pinned.mirror_check.cancel()
                later.window_updates[pinned.pin.window_id] = WindowUpdate(
                    pinned.pin.window_id, "aborted",
                    detail="out of order: the chunk before it was not emitted")

    def _settled_files(self, pinned: Pinned, failed: set[tuple[str, str]]) -> ChunkFiles | str:
        """The pinned chunk's files, waited for, or why it is aborted (an earlier chunk of
        its range in ``failed``). A chunk the recorded batch emitted must be had again."""
        if pinned.range_key in failed:
            return "out of order: the chunk before it was not emitted"
        wid = pinned.pin.window_id
        found = pinned.files or self._await_files(pinned)
        if isinstance(found, str) and (self.windows.replay_outcomes or {}).get(wid) == "emitted":
            raise DblogError(
                f"batch {pinned.pin.batch} was written with window {wid} emitted, "
                f"but its chunk cannot be had again ({found}); run `dblog tail "
                "--from-head` and a capture of the table to start over")
        return found

    def _add_emission(self, pinned: Pinned, found: ChunkFiles, pending: Pending) -> None:
        """Add the pinned chunk, its files ``found``, to the batch as emitted."""
        wid = pinned.pin.window_id
        table = pinned.emission.window.table
        batch = pending.table(table)
        batch.emissions.append(pinned.emission)
        batch.chunks[wid] = found
        covered = pinned.coverage()
        if covered is not None:
            batch.coverage[wid] = covered
        pending.advanced[pinned.range_key] = pinned.advanced
        pending.window_updates[wid] = WindowUpdate(
            wid, "emitted", extra={"rows_selected": found.selected,
                                   "position": pinned.emission.position.lsn})

    def _rewind_range(self, pinned: Pinned) -> None:
        """The range's place goes back to before the aborted chunk ``pinned``; its row
        counts and version stay (batches written since the pin added to them)."""
        current = self.ranges[pinned.range_key]
        self.ranges[pinned.range_key] = Versioned(
            placed(current.value, pinned.before.value), current.version)

    def _await_files(self, pinned: Pinned) -> ChunkFiles | str:
        """The capture's files for a pinned chunk (see :meth:`_files_now`), waited for."""
        while True:
            found = self._files_if_changed(pinned)
            if found is not None:
                return found
            if self.stop.is_set():
                raise StopRequested()
            pinned.lookout.wait(FILES_WAIT_S)

    def _files_if_changed(self, pinned: Pinned) -> ChunkFiles | str | None:
        """:meth:`_files_now` if the chunk's handoff changed since the last read (its
        ZooKeeper watches fired) or ``FILES_LOOK_S`` passed; None otherwise."""
        if not pinned.lookout.due():
            return None
        self.state.check_leader()
        return self._files_now(pinned)

    def _files_now(self, pinned: Pinned) -> ChunkFiles | str | None:
        """The capture's files for the pin (or an earlier pin's, once no capture holds the
        rows any more); why the window must be aborted; or None: not yet written."""
        pin = pinned.pin
        wid = pin.window_id
        files = handoff.read_files(self.state, wid)
        if files is not None and files.for_pin(pin):
            return files
        if not handoff.is_held(self.state, wid):
            # Published just before the holder went away?
            files = handoff.read_files(self.state, wid)
            if files is not None:
                return files
            return ("the capture holding the chunk's rows ended before writing them; "
                    "it selects the chunk again when resumed")
        window = self.state.get_window(wid)
        if window is None or window.value.status == "aborted":
            return "its capture aborted it"
        if time.monotonic() >= pinned.deadline:
            return (f"its capture did not write the chunk within "
                    f"{self.files_timeout_s:g}s")
        return None

    def _batch_no(self) -> int:
        """The number of the next batch to commit (the committed one's next); the batch
        being built comes after the closed ones (:attr:`closed`)."""
        found = self.state.get_position()
        assert found is not None
        return found.value.batch + 1

    def _coverage(self, table: TableId, delete_range: tuple[Key | None, Key | None] | None
                  ) -> KeyRange | None:
        """The key range whose mirror rows the chunk proves gone when it did not return them
        (None: a filtered chunk, or a key order Spark cannot reproduce for range tests)."""
        if delete_range is None:
            return None
        if table not in self.key_order:
            self.key_order[table] = self.dialect.spark_orders_keys_like_source(table)
        if not self.key_order[table]:
            return None
        return KeyRange(*delete_range)
