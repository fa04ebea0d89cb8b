"""Reads the source log in a thread of its own, ahead of the tailer.

Decoding the log is Python work; writing a micro-batch is mostly JVM work (Spark, Delta).
Run one after the other, a tailer spends the write time not decoding. The prefetcher
decodes the next transactions while the previous batch is written, so the tail runs at
the speed of the slower of the two instead of their sum.

It is a drop-in :class:`dblog.sources.base.LogReader`: transactions come out in log
order, exactly once; ``resume`` is the position after the last transaction handed out (or
after the transactions the reader skipped while idle); an error of the inner reader is
raised by the next :meth:`PrefetchingReader.read` that has nothing else to return.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dblog.sources.base import LogReader, Transaction, confirm_log


@dataclass(frozen=True, slots=True)
class _Item:
    """One inner read: its transactions and the inner reader's resume after it."""

    transactions: list[Transaction]
    resume: Mapping[str, Any] | None
    error: BaseException | None = None

    @property
    def weight(self) -> int:
        return _weight(self.transactions)


def _weight(transactions: list[Transaction]) -> int:
    """What read-ahead transactions count against ``max_ahead``: their log items."""
    return sum(max(1, len(tx.items)) for tx in transactions)


class PrefetchingReader:
    """A :class:`LogReader` that reads ``inner`` in a background thread, holding at most
    about ``max_ahead`` log items (row events, watermarks, DDL) not yet handed out."""

    def __init__(self, inner: LogReader, *, max_ahead: int = 50_000,
                 read_transactions: int = 2000, poll_s: float = 0.5) -> None:
        self._inner = inner
        self._max_ahead = max(1, max_ahead)
        self._read_transactions = max(1, read_transactions)
        self._poll_s = poll_s
        self._queue: collections.deque[_Item] = collections.deque()
        self._ahead = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._resume: Mapping[str, Any] | None = getattr(inner, "resume", None)
        self._behind = False
        self._timed_out = False
        self._thread = threading.Thread(target=self._run, name="log-prefetch", daemon=True)
        self._thread.start()

    @property
    def resume(self) -> dict[str, Any] | None:
        """The position after the last transaction handed out, or after what the inner
        reader skipped since (untracked tables) when nothing is waiting."""
        return None if self._resume is None else dict(self._resume)

    @property
    def behind(self) -> bool:
        """Whether the inner reader's last read came back full: more of the log was
        waiting, so the reader is behind the head rather than following it."""
        with self._cond:
            return self._behind

    @property
    def timed_out(self) -> bool:
        """Whether the last :meth:`read` returned nothing because its ``max_wait_s`` passed
        while the inner reader was still reading (not after an inner read that found
        nothing: ``[]`` then says nothing about the log)."""
        with self._cond:
            return self._timed_out

    @property
    def drained(self) -> bool:
        """Whether every transaction read so far was handed out."""
        with self._cond:
            return not self._queue

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while self._ahead >= self._max_ahead and not self._stop.is_set():
                    self._cond.wait(0.5)
            if self._stop.is_set():
                return
            try:
                txs = self._inner.read(max_transactions=self._read_transactions,
                                       max_wait_s=self._poll_s)
                item = _Item(txs, getattr(self._inner, "resume", None))
            except BaseException as exc:  # handed to the consumer, which raises it
                item = _Item([], None, exc)
            with self._cond:
                self._queue.append(item)
                self._behind = len(item.transactions) >= self._read_transactions
                self._ahead += item.weight
                self._cond.notify_all()
            if item.error is not None:
                return

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        """Up to ``max_transactions`` transactions read ahead. With none waiting, waits for
        the inner reader's next read (it returns within about its own ``poll_s``), at most
        ``max_wait_s``: ``[]`` after an inner read means what it means for the inner
        reader, nothing new within its wait (``resume`` then covers what it skipped);
        ``[]`` after ``max_wait_s`` (:attr:`timed_out`) only that the read goes on."""
        out: list[Transaction] = []
        deadline = time.monotonic() + max(0.0, max_wait_s)
        with self._cond:
            self._timed_out = False
            while len(out) < max_transactions:
                if not self._queue:
                    if out or not self._thread.is_alive():
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._timed_out = True
                        break
                    self._cond.wait(min(left, 1.0))
                    continue
                item = self._queue[0]
                if item.error is not None:
                    if out:
                        break
                    raise item.error
                room = max_transactions - len(out)
                if len(item.transactions) <= room:
                    self._queue.popleft()
                    out += item.transactions
                    self._ahead -= item.weight
                    if item.resume is not None:
                        self._resume = item.resume
                    elif item.transactions:
                        self._resume = item.transactions[-1].resume
                    if not item.transactions:
                        break  # the inner reader was idle: let the caller see it
                else:
                    taken, rest = item.transactions[:room], item.transactions[room:]
                    self._queue[0] = _Item(rest, item.resume)
                    out += taken
                    self._ahead -= _weight(taken)
                    self._resume = taken[-1].resume
            self._cond.notify_all()
        return out

    def confirm(self, native: Mapping[str, Any]) -> None:
        """Forwarded to the inner reader (see ``sources.base.confirm_log``)."""
        confirm_log(self._inner, native)

    def close(self) -> None:
        """Stop the thread (it finishes its current inner read) and close the reader."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=max(10.0, 4 * self._poll_s))
        self._inner.close()


__all__ = ["PrefetchingReader"]
