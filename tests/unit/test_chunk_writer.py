"""Unit tests for the capture's chunk writer (dblog.capture.ChunkWriter): chunks' files
are written at once, a ``run`` task runs alone, failures surface in order."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dblog.capture import ChunkWriter


def _chunk(name: str) -> Any:
    return name  # the writer hands chunks to its write function untouched


def test_two_chunks_are_written_at_once() -> None:
    both_running = threading.Barrier(2, timeout=10)
    written: list[str] = []

    def write(chunk: Any) -> None:
        both_running.wait()  # breaks (raises) unless both writes run together
        written.append(chunk)

    with ChunkWriter(write) as writer:
        writer.submit(_chunk("a"))
        writer.submit(_chunk("b"))
    assert sorted(written) == ["a", "b"]


def test_a_run_task_runs_alone_before_the_chunks_given_after_it() -> None:
    events: list[str] = []

    def slow_setup() -> None:
        events.append("setup began")
        time.sleep(0.3)
        events.append("setup ended")

    with ChunkWriter(lambda chunk: events.append(f"wrote {chunk}")) as writer:
        writer.run(slow_setup)
        writer.submit(_chunk("a"))
        writer.submit(_chunk("b"))
    assert events[:2] == ["setup began", "setup ended"]
    assert sorted(events[2:]) == ["wrote a", "wrote b"]


def test_a_failed_setup_fails_the_chunks_after_it_and_raises_at_flush() -> None:
    def setup() -> None:
        raise RuntimeError("no lake")

    written: list[Any] = []
    writer = ChunkWriter(written.append)
    writer.run(setup)
    writer.submit(_chunk("a"))
    with pytest.raises(RuntimeError, match="no lake"):
        writer.flush()  # the setup's failure
    with pytest.raises(RuntimeError, match="no lake"):
        writer.flush()  # the chunk's: never written on a lake that was not set up
    writer.__exit__(None, None, None)
    assert written == []


def test_no_more_than_depth_tasks_wait_or_run() -> None:
    release = threading.Event()
    started: list[str] = []

    def write(chunk: Any) -> None:
        started.append(chunk)
        release.wait(10)

    writer = ChunkWriter(write, depth=2)
    writer.submit(_chunk("a"))
    writer.submit(_chunk("b"))
    third = threading.Thread(target=writer.submit, args=(_chunk("c"),))
    third.start()
    third.join(timeout=0.3)
    assert third.is_alive(), "a third chunk was queued while two were being written"
    release.set()
    third.join(timeout=10)
    writer.flush()
    writer.__exit__(None, None, None)
    assert sorted(started) == ["a", "b", "c"]
