"""One DBLog chunk, in its steps: plan, register, low watermark, select, hold, describe,
high watermark."""

from __future__ import annotations

import uuid
from functools import partial, reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dblog.capture.base import CaptureBase
from dblog.capture.rows import ORDER_COLUMN, HeldChunk, read_summary
from dblog.core.chunking import ChunkOutcome, chunk_outcome, plan_chunk_reads, planned_outcome
from dblog.core.events import Key, TableId, Window, key_to_json
from dblog.core.faults import crash_point
from dblog.sources.base import ChunkSpec, TableSchema
from dblog.state import handoff


class ChunkSteps(CaptureBase):
    """Takes one chunk of a range up to its high watermark."""

    def _chunk(
        self,
        capture_id: str,
        range_id: str,
        table: TableId,
        schema: TableSchema,
        after: Key | None,
        upper: Key | None,
        keys: tuple[Key, ...] | None,
        where: str | None,
        limit: int,
        *,
        ends_range: bool = False,
        not_final: bool = False,
    ) -> tuple[HeldChunk, int, Key | None, bool]:
        """One DBLog chunk up to its high watermark: plan, register, LW, select, describe,
        hold, HW (its files are written once the tailer pins it: :meth:`_write_held`).

        Returns the held chunk, its rows, the last key (where the next chunk starts: the
        planned end, the last key read, or ``after`` if none) and whether the chunk reached
        the end of ``(after, upper]``; ``not_final``: even then the range goes on (an
        open-ended range's last chunk reads past ``upper``), unless the chunk's plan reaches
        ``upper``: then it reads on past it itself, to the key space's end, and ends the
        range in the same window (the held chunk's ``ends_range``).
        """
        # 1. plan: the chunk's extent and its parallel reads (before the low watermark)
        filtered = keys is not None or (where is not None and bool(where.strip()))
        bounds = None if filtered else self._read_plan(table, after, upper, limit)
        reads_on = (not_final and bounds is not None
                    and (bounds[-1] is None or bounds[-1] == upper))
        if reads_on:
            assert bounds is not None
            bounds = [*bounds[:-1], None]
        read_to = None if reads_on else upper
        # 2. register the window, 3. its low watermark: from here the tailer records keys
        wid = uuid.uuid4().hex
        window = Window(wid, table, low=str(uuid.uuid4()), high=str(uuid.uuid4()))
        self.state.register_window(window, {
            "capture_id": capture_id, "range_id": range_id,
            "after_key": key_to_json(after),
        })
        self.dialect.write_watermark(window.low, low=True)  # then the select sees the log
        crash_point("capture.after_lw")
        # 4. select and hold the rows
        selected = self._select(table, schema, after, upper, keys, where, limit, bounds,
                                read_to)
        held, rows, read_last = self._hold(wid, schema, selected, bounds, upper, reads_on)
        # 5. describe the chunk for the tailer (where it ends, what it may delete)
        if bounds is None:
            outcome = _outcome(after, upper, rows, limit, read_last, keys, where, ends_range)
            last = read_last if read_last is not None else after
        else:
            end = bounds[-1]
            outcome = planned_outcome(after=after, upper=read_to, end=end,
                                      ends_range=ends_range or reads_on)
            # The chunk read (after, end], or (after, upper] when end is None (past upper
            # too when it reads on; it ends the range then): the next one starts there
            # whatever order the rows came in (a planned select has no LIMIT, and MariaDB
            # drops the ORDER BY of a subquery it merges).
            last = end if end is not None else (
                upper if upper is not None else read_last if read_last is not None else after)
        self._describe(wid, capture_id, range_id, schema, last, outcome,
                       final=outcome.final and (reads_on or not not_final))
        # 6. the high watermark, the rows held until the tailer pins the window
        handoff.hold(self.state, wid)
        try:
            crash_point("capture.after_select")
            self.dialect.write_watermark(window.high)
            crash_point("capture.after_hw")
        except BaseException:
            handoff.release(self.state, wid)
            raise
        return held, rows, last, outcome.final

    def _select(self, table: TableId, schema: TableSchema, after: Key | None,
                upper: Key | None, keys: tuple[Key, ...] | None, where: str | None,
                limit: int, bounds: list[Key | None] | None, read_to: Key | None
                ) -> DataFrame:
        """The chunk's select: one (a filtered chunk's, with its ``LIMIT``), or one per
        planned read, ``(lo, hi]`` each (``read_to`` for the open last one)."""
        if bounds is None:
            spec = ChunkSpec(table, limit, after_key=after, upper_key=upper, keys=keys,
                             where=where)
            one: DataFrame = self.dialect.read_chunk(self.spark, spec, schema)
            return one
        selected: DataFrame = reduce(DataFrame.union, [
            self.dialect.read_chunk(self.spark, ChunkSpec(
                table, None, after_key=lo, upper_key=read_to if hi is None else hi),
                schema)
            for lo, hi in zip(bounds, bounds[1:], strict=False)])
        return selected

    def _hold(self, wid: str, schema: TableSchema, selected: DataFrame,
              bounds: list[Key | None] | None, upper: Key | None, reads_on: bool
              ) -> tuple[HeldChunk, int, Key | None]:
        """The selected rows tagged with their read order and held in Spark; their count
        and the key read last (where it is needed)."""
        order = ORDER_COLUMN
        while order.lower() in {c.lower() for c in selected.columns}:
            order += "_"  # never a table column's name (Spark names are case-insensitive)
        # Held in Spark (a local checkpoint, on disk if memory runs short); the summary is the
        # first pass over the rows, so it reads them from the database and keeps them.
        tagged = selected.withColumn(order, F.monotonically_increasing_id()).localCheckpoint(
            eager=False)
        # A planned chunk's next one starts at its planned end, or at the range's upper
        # bound: the key read last is needed only without either.
        rows, read_last, counts = read_summary(
            tagged, schema, order,
            with_last=bounds is None or (bounds[-1] is None and upper is None))
        return HeldChunk(wid, schema, tagged, order, counts, ends_range=reads_on), rows, read_last

    def _describe(self, wid: str, capture_id: str, range_id: str, schema: TableSchema,
                  last: Key | None, outcome: ChunkOutcome, *, final: bool) -> None:
        """The chunk's description for the tailer (:mod:`dblog.state.handoff`): where the
        range goes on, whether it ends, the keys it may delete, its columns."""
        handoff.describe_chunk(self.state, wid, handoff.ChunkDescription(
            capture_id, range_id, last, final, outcome.delete_range, schema))

    def _read_plan(self, table: TableId, after: Key | None, upper: Key | None,
                   limit: int) -> list[Key | None]:
        """The key bounds ``[after, k1, ..., end]`` of a chunk of ``limit`` rows read by one
        select, or by several at once, ``(after, k1], (k1, k2], ...``; ``end`` None: fewer
        rows were left up to ``upper``, and the last select reads to it.

        Planned before the low watermark, from the primary-key index (each bound reads as
        many index entries as its part has rows). Rows inserted into a part meanwhile are
        read with it: the chunk is ``(after, end]``, whatever it holds at its select. The
        selects have no ``LIMIT``: the source streams their rows instead of materializing
        each select first (see ``build_chunk_sql``)."""
        parts = max(1, min(self.options.read_partitions,
                           limit // self.options.read_partition_rows))
        return plan_chunk_reads(after, upper, limit, parts,
                                partial(self.dialect.key_after, table))



def _outcome(after: Key | None, upper: Key | None, rows: int, limit: int, last: Key | None,
             keys: tuple[Key, ...] | None, where: str | None, ends_range: bool) -> ChunkOutcome:
    """:func:`dblog.core.chunking.chunk_outcome` of one chunk select (``last``: None if empty)."""
    filtered = keys is not None or (where is not None and bool(where.strip()))
    return chunk_outcome(after=after, upper=upper, rows=rows, limit=limit,
                         last=last if rows else None, filtered=filtered, ends_range=ends_range)

