"""Decodes the source log in a process of its own.

Decoding row events is pure-Python work. In the tailer's process it shares one interpreter
lock with everything else there (the batch's Arrow columns, the window bookkeeping, the
calls into Spark), so a busy log is decoded at about half the speed of the bare decode loop
however idle the second core is. A :class:`ProcessLogReader` runs the source's reader in a
child process, which decodes on a core of its own and sends the transactions back in read
order; the tailer's process only rebuilds them.

Transactions cross the pipe as plain tuples (:func:`encode_transactions`): pickling the
frozen dataclasses themselves cost more than decoding them did. The child reads ahead at
most one read (its send blocks until the parent takes the previous one), so memory stays
bounded; the parent's :class:`pipeline.prefetch.PrefetchingReader` bounds the rest.

Semantics are those of the inner reader: transactions in log order, exactly once;
``resume`` after the last one handed out (or after what the reader skipped while idle);
its error is raised by the read that would have returned what follows it. A child that
dies without a word is a :class:`~pipeline.errors.SourceError` naming its exit code.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from pipeline.errors import SourceError
from pipeline.events import ChangeEvent, Op, Position
from pipeline.sources.base import LogItem, LogReader, Transaction, confirm_log

_OPS = {op.value: op for op in Op}
_CLOSE_WAIT_S = 10.0


def encode_transactions(transactions: Sequence[Transaction]) -> list[tuple[Any, ...]]:
    """Transactions as tuples of builtins (and the rare watermark or DDL item as itself)."""
    return [
        (tuple(_encode_item(item) for item in tx.items), dict(tx.resume), tx.position.lsn,
         tx.position.seq, tx.commit_ts_ms, dict(tx.schemas))
        for tx in transactions
    ]


def _encode_item(item: LogItem) -> Any:
    if type(item) is ChangeEvent:
        return (item.table, item.op.value, item.key, item.position.lsn, item.position.seq,
                item.before, item.after, item.commit_ts_ms, item.window_id)
    return item


def decode_transactions(encoded: Sequence[tuple[Any, ...]]) -> list[Transaction]:
    """The inverse of :func:`encode_transactions`."""
    return [
        Transaction(tuple(_decode_item(item) for item in items), resume, Position(lsn, seq),
                    ts, schemas)
        for items, resume, lsn, seq, ts, schemas in encoded
    ]


def _decode_item(item: Any) -> LogItem:
    if type(item) is not tuple:
        return item  # type: ignore[no-any-return]
    table, op, key, lsn, seq, before, after, ts, window = item
    return ChangeEvent(table, _OPS[op], key, Position(lsn, seq), before, after, ts, window)


def runs_in_own_process(reader: LogReader) -> bool:
    """Whether ``reader`` (fresh, nothing read yet) can be moved into a child process: its
    class says so (it connects lazily and holds nothing but settings and positions)."""
    return bool(getattr(reader, "runs_in_own_process", False))


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a SourceError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return SourceError(f"the log decoder failed: {type(exc).__name__}: {exc}")


def _serve(reader: LogReader, requests: Connection, results: Connection,
           read_transactions: int, poll_s: float, parent: int) -> None:
    """The child's loop: read, send, repeat, until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this stops
    try:
        while os.getppid() == parent:
            while requests.poll():
                kind, *args = requests.recv()
                if kind == "stop":
                    return
                if kind == "confirm":
                    confirm_log(reader, args[0])
            try:
                txs = reader.read(max_transactions=read_transactions, max_wait_s=poll_s)
                message: tuple[Any, ...] = ("txs", encode_transactions(txs),
                                            getattr(reader, "resume", None))
            except BaseException as exc:  # handed to the parent, which raises it
                results.send(("error", _sendable(exc)))
                return
            results.send(message)
    except (EOFError, OSError):  # the parent closed its ends or died
        return
    finally:
        reader.close()


class ProcessLogReader:
    """A :class:`LogReader` whose ``inner`` reader runs in a child process (see module).

    ``inner`` must not have been read yet (see :func:`runs_in_own_process`); it is
    pickled into the child, which reads ``read_transactions`` at a time, waiting up to
    ``poll_s`` for each read."""

    def __init__(self, inner: LogReader, *, read_transactions: int = 2000,
                 poll_s: float = 0.5) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process running a JVM
        child_requests, self._requests = ctx.Pipe(duplex=False)
        self._results, child_results = ctx.Pipe(duplex=False)
        self._poll_s = poll_s
        self._resume: Mapping[str, Any] | None = getattr(inner, "resume", None)
        self._left: list[Transaction] = []
        self._left_resume: Mapping[str, Any] | None = None
        self._failed: BaseException | None = None
        self._process = ctx.Process(
            target=_serve, name="dblog-log-decoder", daemon=True,
            args=(inner, child_requests, child_results, max(1, read_transactions), poll_s,
                  os.getpid()),
        )
        self._process.start()
        child_requests.close()
        child_results.close()

    @property
    def resume(self) -> dict[str, Any] | None:
        """The position after the last transaction handed out (or skipped while idle)."""
        return None if self._resume is None else dict(self._resume)

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        """Up to ``max_transactions`` transactions of the child's next read; ``[]`` when
        it sent nothing within about ``max_wait_s`` (its own reads wait ``poll_s``)."""
        if self._failed is not None:
            raise self._failed
        if not self._left:
            if not self._receive(max(max_wait_s, self._poll_s) + 1.0):
                return []
        room = max(1, max_transactions)
        taken, self._left = self._left[:room], self._left[room:]
        if self._left:
            self._resume = taken[-1].resume
        elif self._left_resume is not None:
            self._resume = self._left_resume  # the read's end (past skipped transactions)
        elif taken:
            self._resume = taken[-1].resume
        return taken

    def _receive(self, wait_s: float) -> bool:
        """Take the child's next message into ``_left``; False when none came in time."""
        try:
            if not self._results.poll(wait_s):
                return False
            message = self._results.recv()
        except (EOFError, OSError):
            self._process.join(timeout=5.0)
            self._failed = SourceError(
                f"the log decoder process exited unexpectedly (exit code "
                f"{self._process.exitcode}); the tail stops here and resumes from its last "
                "committed position when started again")
            raise self._failed from None
        if message[0] == "error":
            self._failed = message[1]
            raise message[1]
        _, encoded, resume = message
        self._left = decode_transactions(encoded)
        self._left_resume = resume
        return True

    def confirm(self, native: Mapping[str, Any]) -> None:
        """Forwarded to the inner reader in the child (see ``sources.base.confirm_log``)."""
        try:
            self._requests.send(("confirm", dict(native)))
        except OSError:
            pass  # the child is gone: the next read says so

    def close(self) -> None:
        """Stop the child (it finishes its current read) and wait for it."""
        try:
            self._requests.send(("stop",))
        except OSError:
            pass
        self._results.close()  # a child blocked sending gets EPIPE and ends
        self._process.join(timeout=_CLOSE_WAIT_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=_CLOSE_WAIT_S)
        self._requests.close()


__all__ = [
    "ProcessLogReader",
    "decode_transactions",
    "encode_transactions",
    "runs_in_own_process",
]
