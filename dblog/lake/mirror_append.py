"""A mirror merge's shortcut: chunk rows of keys the mirror lacks are appended, not merged.

A capture into new keys (a first capture, or one while writers run) would otherwise make the
MERGE rewrite or join every chunk row; appending them in one commit writes them once
(:meth:`ChunkAppender.append_new_chunk_rows`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dblog.core.events import Op, TableId
from dblog.lake.current import change_key
from dblog.lake.deltalog import DeltaTxn, action_rows
from dblog.lake.layout import LakeLayout
from dblog.lake.predicates import between
from dblog.lake.tables import LakeTables
from dblog.lake.types import META_COLUMNS, MIRROR_LSN, WINDOW_COLUMN, quote_ident, spark_type

_BROADCAST_KEYS = 200_000
"""At most this many keys that keep chunk rows out of a mirror's append are broadcast to the
join that finds them (a busy source's changes between two merges are far fewer)."""


@dataclass(frozen=True)
class Appended:
    """What :meth:`ChunkAppender.append_new_chunk_rows` appended to a mirror: the chunks
    (windows) it took rows of, how many rows, and the changes left to merge."""

    windows: set[str]
    rows: int
    remaining: DataFrame


@dataclass(frozen=True)
class _Chosen:
    """The chunks an append takes (:meth:`ChunkAppender._choose`): window -> span of the
    first key column, their rows, and the spans (and rows) of those that hold mirror files."""

    taken: dict[str, tuple[Any, Any]]
    taken_count: int
    crowded: list[tuple[Any, Any]]
    crowded_rows: int


class ChunkAppender:
    """Appends a merge's new chunk rows to a table's mirror (the mirror merger's session)."""

    def __init__(self, mirror_spark: SparkSession, layout: LakeLayout,
                 tables: LakeTables) -> None:
        self._mirror_spark = mirror_spark
        self.layout = layout
        self._tables = tables

    def append_new_chunk_rows(self, table: TableId, changes: DataFrame, spans: list[Row],
                              metadata: Mapping[str, Any], mark: int, rows: int,
                              app: tuple[str, int]) -> Appended:
        """Append the ``r`` rows of this merge's chunks whose keys the mirror lacks, in one
        commit, instead of merging them; the rest of ``changes`` is left to merge. That
        commit carries the merge's mark when it holds all ``rows``. ``spans``: each chunk's
        window, the least and greatest value of its rows' first key column, and how many
        rows it has (:func:`dblog.lake.survey.survey`).

        A chunk whose key span holds no mirror file, or mirror files with fewer rows than
        half its own (a first capture while writers run: their changes reached the mirror
        first, scattered over the key space), has its rows appended but for those of keys
        the mirror holds or another of ``changes`` changes (merged with them, so that no
        change of this merge rewrites the appended files). Any other chunk (a capture over a
        mirror that holds most of its keys, such as a repair) is merged whole, as are chunks
        whose spans overlap another's of the same merge.

        ``changes`` may be read again after the append and then hold more rows (batches
        committed meanwhile): a row appended may then be merged as well, which changes
        nothing (its position is not newer than itself), and none is left out.

        The same as merging them: a MERGE would insert every appended row (no mirror row
        has its key), and the changes merged after them apply by position as they would
        have (older ones lose to a chunk row, newer ones win, a delete removes it). The
        mirror is read at the append's own snapshot and inside its transaction: a writer
        that adds a row in such a span meanwhile (a tailer that lost its lock, merging
        late) makes the commit fail, and then every change is merged. The append is also
        fenced like the MERGE (``app``: the line of batches and this merge's batch): it
        reads the line's recorded version, skips when another writer merged this far, and
        fails when one records a version meanwhile. A tailer that lost its lock could
        otherwise land a late append after the new leader merged deletes of the same keys
        (a MERGE of deletes of keys the mirror lacks changes no file in the span)."""
        nothing = Appended(set(), 0, changes)
        key = self._tables.key_columns(table)
        first = key[0]
        if not spans:
            return nothing
        columns = self._tables.known_columns(table)
        dtype = spark_type(next(c.spark_type for c in columns if c.name == first))
        path = self.layout.mirror(table)
        txn = DeltaTxn(self._mirror_spark, path)
        if txn.app_version(app[0]) >= app[1]:
            return nothing  # merged this far by another writer: the MERGE is skipped too
        chosen = self._choose(txn, spans, F.col(quote_ident(first)), dtype)
        if not chosen.taken:
            return nothing
        taken = chosen.taken
        in_chunks = F.col(WINDOW_COLUMN).isin(sorted(taken)) & (F.col("op") == Op.READ.value)
        taken_rows = changes.where(in_chunks)
        others = changes.where(~in_chunks)
        new_rows, remaining = self._unblocked(
            taken_rows, others, rows - chosen.taken_count,
            crowded_keys=(self._mirror_keys_at(txn, key, chosen.crowded, dtype),
                          chosen.crowded_rows)
            if chosen.crowded else None, key=key)
        appended = self._commit_append(txn, new_rows, metadata, mark, rows, app)
        if not appended:
            return nothing
        return Appended(set(taken), appended, remaining)

    @staticmethod
    def _choose(txn: DeltaTxn, spans: list[Row], target: SparkColumn, dtype: T.DataType
                ) -> _Chosen:
        """The chunks whose rows are appended: in window order, each whose span overlaps no
        chunk taken before it and holds no mirror file, or mirror files with fewer rows than
        half its own (:meth:`append_new_chunk_rows`)."""
        taken: dict[str, tuple[Any, Any]] = {}  # window -> span of the first key column
        crowded: list[tuple[Any, Any]] = []  # the spans of those that hold mirror files
        taken_count, crowded_rows = 0, 0
        for span in sorted(spans, key=lambda r: str(r["window"])):
            low, high = span["low"], span["high"]
            if any(not (high < lo or low > hi) for lo, hi in taken.values()):
                continue
            files, held = txn.records_where(between(target, low, high, dtype))
            if files and (held is None or 2 * held >= int(span["rows"])):
                continue
            taken[str(span["window"])] = (low, high)
            taken_count += int(span["rows"])
            if files:
                crowded.append((low, high))
                crowded_rows += held or 0
        return _Chosen(taken, taken_count, crowded, crowded_rows)

    @staticmethod
    def _commit_append(txn: DeltaTxn, new_rows: DataFrame, metadata: Mapping[str, Any],
                       mark: int, rows: int, app: tuple[str, int]) -> int:
        """Write ``new_rows`` as mirror rows and commit them in ``txn``; how many rows were
        appended (0: nothing was, no commit, or another writer's commit in a span won)."""
        schema = T.StructType.fromJson(json.loads(txn.schema_json))
        actions = txn.write_files(new_rows.select(*[
            (F.col(f.name) if f.name in META_COLUMNS
             else F.col("after").getField(f.name)).cast(f.dataType).alias(f.name)
            for f in schema.fields]))
        appended = action_rows(actions)
        if not appended:
            return 0  # every row is merged: no empty commit
        whole = appended == rows
        meta = {**metadata, MIRROR_LSN: mark} if whole else dict(metadata)
        try:
            # Fenced as the MERGE is: a commit of another writer of this line of batches
            # (the tailer that took over, merging deletes of these keys) since this
            # transaction read the line's version makes it fail; a whole merge records the
            # batch, as the MERGE's own markers would.
            txn.commit(actions, meta, app=app if whole else None)
        except Exception as exc:
            if "Concurrent" not in type(exc).__name__ + str(exc):
                raise
            return 0  # another writer in a span: everything is merged instead
        return appended

    @staticmethod
    def _unblocked(taken_rows: DataFrame, others: DataFrame, others_count: int, *,
                   crowded_keys: tuple[DataFrame, int] | None, key: Sequence[str]
                   ) -> tuple[DataFrame, DataFrame]:
        """The chunk rows ``taken_rows`` split into those to append and those to merge
        (with ``others``): a row is kept out of the append by a key the mirror holds
        (``crowded_keys``: the mirror's keys in crowded spans and how many there are) or
        another change holds (``others``, ``others_count`` of them when counted; a later
        change would rewrite the appended file).

        Nothing can keep a row out when both are empty (a capture while the source is
        idle): then no join is planned. The keys are broadcast to the join when there are
        at most :data:`_BROADCAST_KEYS` of them; Spark would otherwise shuffle and sort
        every chunk row to find none. ``others`` may hold more rows than counted (batches
        committed meanwhile): a row appended then is merged as well, which changes
        nothing (see :meth:`append_new_chunk_rows`)."""
        if not others_count and crowded_keys is None:
            return taken_rows, others
        blocking = others.select(*[change_key(k).alias(f"_held_{i}") for i, k in enumerate(key)])
        blocking_count = others_count
        if crowded_keys is not None:
            blocking = blocking.unionByName(crowded_keys[0])
            blocking_count += crowded_keys[1]
        if blocking_count <= _BROADCAST_KEYS:
            blocking = F.broadcast(blocking)
        same_key = reduce(lambda a, b: a & b, [
            F.col("after").getField(k) == F.col(f"_held_{i}") for i, k in enumerate(key)])
        return (taken_rows.join(blocking, same_key, "left_anti"),
                others.unionByName(taken_rows.join(blocking, same_key, "left_semi")))

    def _mirror_keys_at(self, txn: DeltaTxn, key: tuple[str, ...],
                        spans: Sequence[tuple[Any, Any]], dtype: T.DataType) -> DataFrame:
        """The keys of the mirror rows in ``spans`` (of the first key column) at ``txn``'s
        snapshot, as columns ``_held_0``, ``_held_1``, ...: the same rows however often
        the frame is computed, whatever is committed meanwhile."""
        target = F.col(quote_ident(key[0]))
        in_spans = reduce(lambda a, b: a | b, [between(target, low, high, dtype)
                                                for low, high in spans])
        return (self._mirror_spark.read.format("delta")
                .option("versionAsOf", txn.read_version).load(txn.path)
                .where(in_spans)
                .select(*[F.col(quote_ident(k)).alias(f"_held_{i}") for i, k in enumerate(key)]))
