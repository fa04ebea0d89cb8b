"""The chunk capture loop: register window → low watermark → select → high watermark → write.

A capture covers tables split into key ranges ``(lower, upper]``; each range is walked in
primary-key order, chunk by chunk. A chunk's extent is planned first (its end key, and the
key ranges its select reads in parallel JDBC partitions); the select, between the low and
the high watermark, keeps the rows in Spark (a local checkpoint). At the high watermark the
tailer pins the window (:mod:`dblog.state.handoff`); the capture then writes the chunk's rows as
the changelog's own files, once, and the tailer's commit adds them. Up to ``max_in_flight``
chunks wait for that commit while the next ones are selected. Progress lives in ZooKeeper
and is advanced only by the tailer (with its log position), so a restart continues at the
last emitted chunk.

Every capture ends: before a range's first chunk, an open upper bound is fixed to the table's
greatest key, read once the tailer has a committed log position (rows inserted later reach
the lake through the log). The fixed bound is the range's ``upper`` in its
:class:`~dblog.state.RangeProgress`; a note at ``captures/<id>/bounds/<range>`` records
that it was fixed, and is the only record when no key lay above the range's lower bound
(the range then ends after one chunk). Chunks continue from their last key in the database's
order (the order the rows came back in), with TIMESTAMP keys read as epoch microseconds, so
no local time zone ever touches a key.
"""

from dblog.capture.capturer import Capturer
from dblog.capture.options import (
    LOOK_S,
    CaptureOptions,
    CaptureRequest,
    RangeReport,
    plan_request,
    range_id_for,
)
from dblog.capture.rows import (
    ORDER_COLUMN,
    HeldChunk,
    first_key,
    free_checkpoint,
    key_columns,
    key_from_values,
    read_summary,
    summary_frame,
)
from dblog.capture.writer import ChunkWriter
from dblog.protocol.paths import bounds_path

__all__ = [
    "LOOK_S",
    "ORDER_COLUMN",
    "CaptureOptions",
    "CaptureRequest",
    "Capturer",
    "ChunkWriter",
    "HeldChunk",
    "RangeReport",
    "bounds_path",
    "first_key",
    "free_checkpoint",
    "key_columns",
    "key_from_values",
    "plan_request",
    "range_id_for",
    "read_summary",
    "summary_frame",
]
