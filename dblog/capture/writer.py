"""Writing held chunks' files: in threads beside the next selects (:class:`ChunkWriter`),
each once the tailer has pinned its window (:class:`PinnedFiles`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from dblog.capture.base import CaptureBase
from dblog.capture.options import LOOK_S
from dblog.capture.rows import HeldChunk, free_checkpoint
from dblog.core.errors import DblogError
from dblog.core.faults import crash_point
from dblog.lake.chunks import read_order_offsets, write_chunk_files
from dblog.state import Lookout, handoff


class ChunkWriter:
    """Writes held chunks' files in threads of their own, so that the next chunks are
    selected meanwhile: the database serves a select while Spark encodes earlier chunks'
    files, and the files of chunks the tailer pinned together are written at once (one
    Spark task each). Up to ``depth`` tasks wait or run (so ``depth + 1`` chunks are held
    with the one being selected); a task's failure raises at the next submit or flush, in
    the order the tasks were given."""

    def __init__(self, write: Callable[[HeldChunk], None], depth: int = 2,
                 workers: int = 2) -> None:
        self._write = write
        self._depth = depth
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="dblog-chunk-writer")
        self._queued: list[Future[None]] = []
        self._barrier: Future[None] | None = None

    def submit(self, chunk: HeldChunk) -> None:
        """Write ``chunk``'s files (beside other chunks', after every :meth:`run` task)."""
        barrier = self._barrier

        def write() -> None:
            if barrier is not None:
                barrier.result()
            self._write(chunk)

        self._enqueue(write)

    def run(self, task: Callable[[], None]) -> None:
        """Run ``task`` alone: after every task before it, before every task after it."""
        self.flush()
        self._barrier = self._enqueue(task)

    def _enqueue(self, task: Callable[[], None]) -> Future[None]:
        while len(self._queued) >= self._depth:
            self._queued.pop(0).result()
        future = self._pool.submit(task)
        self._queued.append(future)
        return future

    def flush(self) -> None:
        """Wait for every task (the first failure raises here)."""
        while self._queued:
            self._queued.pop(0).result()

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.flush()
        finally:
            self._pool.shutdown(wait=True)



class PinnedFiles(CaptureBase):
    """A held chunk's files, written for the tailer's pin of its window."""

    def _write_held(self, held: HeldChunk, *, stop: threading.Event | None) -> None:
        """Wait for the tailer's pin of a held chunk's window, write the chunk's changelog
        files for it and publish them; again for a newer pin (another tailer took over
        meanwhile). Returns once the files are published for the latest pin, or the window
        is settled, or the capture stopped; then the rows are no longer held (a tailer
        that still waits aborts the window)."""
        wid = held.window_id
        try:
            deadline = time.monotonic() + self.options.emission_timeout_s
            written: tuple[int, str] | None = None
            lookout = Lookout(partial(handoff.watch_pin, self.state, wid), LOOK_S)
            while True:
                if not lookout.due():
                    if stop is not None and stop.is_set():
                        return
                    if self.health_check is not None:
                        self.health_check()
                    lookout.wait(self.options.poll_seconds)
                    continue
                found = self.state.get_window(wid)
                if found is None or found.value.status != "registered":
                    return
                pin = handoff.read_pin(self.state, wid)
                if pin is not None and written != (pin.batch, pin.attempt):
                    files = write_chunk_files(
                        self.spark, self.sink.layout.changelog(held.schema.table),
                        source=self.sink.layout.source, table=held.schema.table,
                        chunk=held.rows, key=held.schema.key, order_column=held.order,
                        offsets=read_order_offsets(held.counts),
                        selected=sum(held.counts.values()), pin=pin)
                    crash_point("capture.before_files")
                    handoff.write_files(self.state, files)
                    written = (pin.batch, pin.attempt)
                    lookout.again()
                    continue  # pinned again meanwhile? (written for the newest pin only)
                if written is not None or (stop is not None and stop.is_set()):
                    return
                if self.health_check is not None:
                    self.health_check()
                if time.monotonic() >= deadline:
                    raise DblogError(
                        f"window {wid} was not pinned within "
                        f"{self.options.emission_timeout_s:.0f}s: is a tailer running for "
                        "this source? (`dblog tail`)")
                lookout.wait(self.options.poll_seconds)
        finally:
            handoff.release(self.state, wid)
            free_checkpoint(held.rows)

