"""Shared pipeline state in ZooKeeper: log position, windows, capture progress, tailer lock.

One :class:`StateStore` serves one source (e.g. ``mariadb-main``) under the
root ``/<chroot>/<source>``::

    position                            PositionState (log position + last batch)
    batch-intent                        BatchIntent (write-ahead of the batch being written)
    windows/<window_id>                 WindowState
    captures/<capture_id>               CaptureState
    captures/<capture_id>/ranges/<id>   RangeProgress
    tailer-lock/                        kazoo Lock recipe contenders

Every value is a JSON document ``{"schema": 1, ...}`` (UTF-8, sorted keys);
each read returns it with its znode version, and every write can be a
compare-and-set on that version (:class:`~dblog.core.errors.StateConflict` on a
lost race). :meth:`StateStore.commit_batch` moves the log position and records
chunk progress and window outcomes in one atomic ZooKeeper transaction.

The modules: :mod:`~dblog.state.documents` (the typed documents and their JSON),
:mod:`~dblog.state.signals` (watch-driven waiting), :mod:`~dblog.state.tree` (the generic
versioned layer and the tailer lock) and :mod:`~dblog.state.store` (:class:`StateStore`),
written against the storage protocol of :mod:`~dblog.state.backend`, which
:mod:`~dblog.state.zookeeper` (kazoo) and :mod:`~dblog.state.memory` (in-process, for
tests) implement.
"""

from dblog.protocol.paths import BATCH_INTENT, TAILER_LOCK
from dblog.state.backend import StateUnavailable
from dblog.state.documents import (
    ABSENT,
    SCHEMA_VERSION,
    BatchIntent,
    CaptureState,
    CaptureStatus,
    CommitResult,
    PositionState,
    RangeProgress,
    RangeUpdate,
    StateSchemaError,
    Versioned,
    WindowState,
    WindowStatus,
    WindowUpdate,
)
from dblog.state.signals import ChangeSignal, Lookout
from dblog.state.store import StateStore

__all__ = [
    "ABSENT",
    "BATCH_INTENT",
    "SCHEMA_VERSION",
    "TAILER_LOCK",
    "BatchIntent",
    "CaptureState",
    "CaptureStatus",
    "ChangeSignal",
    "CommitResult",
    "Lookout",
    "PositionState",
    "RangeProgress",
    "RangeUpdate",
    "StateSchemaError",
    "StateStore",
    "StateUnavailable",
    "Versioned",
    "WindowState",
    "WindowStatus",
    "WindowUpdate",
]
