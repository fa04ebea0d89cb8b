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
compare-and-set on that version (:class:`~pipeline.errors.StateConflict` on a
lost race). :meth:`StateStore.commit_batch` moves the log position and records
chunk progress and window outcomes in one atomic ZooKeeper transaction.

The modules: :mod:`~pipeline.state.documents` (the typed documents and their JSON),
:mod:`~pipeline.state.signals` (watch-driven waiting), :mod:`~pipeline.state.tree` (the generic
versioned layer and the tailer lock) and :mod:`~pipeline.state.store` (:class:`StateStore`),
written against the storage protocol of :mod:`~pipeline.state.backend`, which
:mod:`~pipeline.state.zookeeper` (kazoo) and :mod:`~pipeline.state.memory` (in-process, for
tests) implement.
"""

from pipeline.state.backend import StateUnavailable
from pipeline.state.documents import (
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
from pipeline.state.signals import ChangeSignal, Lookout
from pipeline.state.store import BATCH_INTENT, StateStore
from pipeline.state.tree import TAILER_LOCK

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
