"""What every part of a capturer shares: its connections, options and read rate.

The capturer's jobs (walking a range, taking one chunk, writing a chunk's files for the
tailer's pin, settling its windows) are classes of their own modules over this one base;
:class:`~dblog.capture.capturer.Capturer` joins them. They share the connections and
the options, so they are one object's parts rather than objects passing them around."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession

from dblog.capture.options import CaptureOptions
from dblog.capture.throttle import RowRate
from dblog.core.errors import DblogError
from dblog.lake.sink import DeltaSink
from dblog.sources.base import SourceDialect
from dblog.state import RangeProgress, StateStore


class CaptureBase:
    """Runs captures for one source. Thread-safe per range; ranges may run in parallel."""

    def __init__(
        self,
        *,
        dialect: SourceDialect,
        state: StateStore,
        sink: DeltaSink,
        spark: SparkSession,
        options: CaptureOptions | None = None,
        read_rate: RowRate | None = None,
    ) -> None:
        """``read_rate``: a limit shared with other capturers of the process (default: one
        of its own when ``options.max_rows_per_s`` is set)."""
        self.dialect = dialect
        self.state = state
        self.sink = sink
        self.spark = spark
        self.options = options or CaptureOptions()
        self.read_rate = read_rate or (None if self.options.max_rows_per_s is None
                                       else RowRate(self.options.max_rows_per_s))
        """The read-rate limit this capturer's chunks wait for (None: none)."""
        self.health_check: Callable[[], None] | None = None
        """Called while waiting for emissions; raises if the tailer we rely on died."""


    def _status(self, capture_id: str) -> str:
        found = self.state.get_capture(capture_id)
        if found is None:
            raise DblogError(f"capture {capture_id} does not exist")
        return found.value.status


    def _progress(self, capture_id: str, range_id: str) -> RangeProgress:
        found = self.state.get_range(capture_id, range_id)
        if found is None:
            raise DblogError(f"range {range_id} of capture {capture_id} disappeared")
        return found.value

