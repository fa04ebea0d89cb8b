"""The log tailer: the one ordered writer of a source's changelog and mirror.

Loop: read committed transactions → window processor → micro-batch → Delta (idempotent per
batch) → one ZooKeeper transaction moving the position and recording every chunk emitted.

Crash safety:
* a batch intent (start/end positions) is written before any Delta write, so a restarted
  tailer rebuilds exactly the same batch, and Delta skips the parts already committed;
* where a window's low watermark was seen is stored with the batch that saw it
  (``lw_resume``); a restart re-reads the log from the earliest such point in *warm-up*
  (keys are recorded, nothing is written) so open windows keep every key they saw;
* a chunk is emitted only if it continues its range's progress exactly (its lower bound is
  the last emitted key); otherwise it is aborted and the capture re-selects it, so no chunk is
  ever emitted twice and progress never skips rows;
* at a chunk's high watermark the tailer pins the window (:mod:`dblog.state.handoff`) and reads
  on; the batch is written once the capture wrote the changelog files of every chunk it
  pinned, so the captures write several chunks at once while the tailer reads and pins. A
  capture that died holding the rows gets its window aborted, and with it every chunk of the
  same range pinned after it (a range's chunks are emitted in key order or not at all).

Modules, by job: :mod:`~dblog.tail.tailer` (the lock, a run's start),
:mod:`~dblog.tail.loop` (read, assemble, cut, write, commit),
:mod:`~dblog.tail.assemble` (transactions into the batch being built),
:mod:`~dblog.tail.windows` (window bookkeeping, expiry),
:mod:`~dblog.tail.emissions` (pins and chunk files), :mod:`~dblog.tail.commit` (the
batch written to the lake and committed in ZooKeeper; the intent and its replay),
:mod:`~dblog.tail.mirrors` (the mirror-merge schedule, compaction),
:mod:`~dblog.tail.batch` (the batch being built), :mod:`~dblog.tail.options`.
The public names are this package's.
"""

from __future__ import annotations

from dblog.state.handoff import chunk_path
from dblog.tail.assemble import NOTICES, notice_path
from dblog.tail.mirrors import MIRROR_DOC
from dblog.tail.options import BatchReport, TailOptions, TailSummary
from dblog.tail.tailer import Tailer, new_generation

__all__ = [
    "MIRROR_DOC",
    "NOTICES",
    "BatchReport",
    "TailOptions",
    "TailSummary",
    "Tailer",
    "chunk_path",
    "new_generation",
    "notice_path",
]
