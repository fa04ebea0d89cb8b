"""Delta's own transaction API, reached through Spark's JVM: files written now, committed later.

A capture writes a chunk's changelog files with :meth:`DeltaTxn.write_files` and never
commits them: uncommitted files are invisible to every reader (and VACUUM removes them once
older than the table's retention). The tailer then commits them, with its own batch's files,
in one :meth:`DeltaTxn.commit`, so a chunk is written once and emitted by a commit that
carries no data (see ``docs/design.md``, "Chunks written once").

Actions travel between processes as Delta's own JSON (``{"add": {...}}``), the form they take
in the table's log; the statistics in them are Delta's own as well.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import types as T

from dblog.core.errors import DblogError
from dblog.lake.types import same_shape

__all__ = ["DeltaTxn", "action_rows", "files_dataframe", "kept_active_session",
           "retry_concurrent_commits"]


def _jvm(spark: SparkSession) -> Any:
    return spark.sparkContext._jvm


def _scala_seq(spark: SparkSession, items: Iterable[Any]) -> Any:
    jvm = _jvm(spark)
    java_list = jvm.java.util.ArrayList()
    for item in items:
        java_list.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_list).toSeq()


def _python_list(spark: SparkSession, seq: Any) -> list[Any]:
    it = _jvm(spark).scala.jdk.javaapi.CollectionConverters.asJava(seq).iterator()
    out = []
    while it.hasNext():
        out.append(it.next())
    return out


def _delta_log(spark: SparkSession, path: str) -> Any:
    jvm = _jvm(spark)
    # Delta reads the session's settings through the thread's active session: make it the
    # caller's (its confs, not another session's idempotent-write markers).
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)


@contextmanager
def kept_active_session(spark: SparkSession) -> Iterator[None]:
    """The calling thread's active JVM session as it was before, whatever the block (a
    :class:`DeltaTxn` makes its own session the active one) set."""
    classes = _jvm(spark).org.apache.spark.sql.SparkSession
    before = classes.getActiveSession()
    try:
        yield
    finally:
        if before.isDefined():
            classes.setActiveSession(before.get())
        else:
            classes.clearActiveSession()


def _actions(spark: SparkSession, actions_json: Sequence[str]) -> list[Any]:
    parse = _jvm(spark).org.apache.spark.sql.delta.actions.Action.fromJson
    return [parse(a) for a in actions_json]


def action_rows(actions_json: Iterable[str]) -> int:
    """Rows the ``add`` actions hold, from their statistics (``numRecords``)."""
    total = 0
    for text in actions_json:
        add = json.loads(text).get("add")
        if add is None:
            continue
        stats = json.loads(add.get("stats") or "{}")
        if "numRecords" not in stats:
            raise ValueError(f"an add action without a row count: {add.get('path')}")
        total += int(stats["numRecords"])
    return total


class DeltaTxn:
    """One optimistic transaction on the Delta table at ``path`` (it must exist).

    Reads see the snapshot the transaction started at; :meth:`commit` fails with Delta's
    ``Concurrent...``/``MetadataChanged`` errors when another commit conflicts with it.
    """

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self._txn = _delta_log(spark, path).startTransaction()

    @property
    def read_version(self) -> int:
        """The table version this transaction read."""
        return int(self._txn.readVersion())

    @property
    def table_id(self) -> str:
        """The table's identity (``metaData.id``): a table recreated at the path differs."""
        return str(self._txn.metadata().id())

    @property
    def schema_json(self) -> str:
        """The table's schema, as Spark's JSON."""
        return str(self._txn.metadata().schema().json())

    @property
    def file_count(self) -> int:
        """The table's data files: from the version's checksum file when its writer left one
        (Delta's ``numOfFiles`` reconstructs the table's state first, with Spark jobs: ~1 s
        on a table read for the first time, 5 s in a fresh JVM)."""
        snapshot = self._txn.snapshot()
        checksum = snapshot.checksumOpt()
        if checksum.isDefined():
            return int(checksum.get().numFiles())
        return int(snapshot.numOfFiles())

    def _known_empty(self) -> bool:
        """Whether the snapshot's checksum file says it holds no data file (False when
        there is no checksum: counting would reconstruct the state)."""
        checksum = self._txn.snapshot().checksumOpt()
        return bool(checksum.isDefined() and int(checksum.get().numFiles()) == 0)

    def configuration(self) -> dict[str, str]:
        """The table's properties (constraints included: ``delta.constraints.<name>``)."""
        conf = self._txn.metadata().configuration()
        as_java = _jvm(self.spark).scala.jdk.javaapi.CollectionConverters.asJava(conf)
        return {str(k): str(as_java.get(k)) for k in as_java.keySet().toArray()}

    def files_where(self, condition: Column) -> int:
        """How many of the table's files may hold rows where ``condition`` holds (by their
        partition values and statistics), read as part of this transaction: a concurrent
        commit that adds such files makes :meth:`commit` fail."""
        return int(self._filter_files(condition).size())

    def rows_exist_where(self, condition: Column) -> bool:
        """Whether a row of this transaction's snapshot satisfies ``condition``: only the
        files its statistics admit are read (one data-skipping pass, no second load of the
        table), and the read stops at the first row found."""
        files = self._filter_files(condition)
        if files.isEmpty():
            return False
        rows = _files_frame(self.spark, _delta_log(self.spark, self.path),
                            self._txn.snapshot(), files)
        return bool(rows.where(condition).limit(1).count())

    def records_where(self, condition: Column) -> tuple[int, int | None]:
        """As :meth:`files_where`, with the rows those files hold (their ``numRecords``
        statistics; None when a file has none): ``(files, rows)``.

        On a snapshot its checksum shows empty (a mirror before its first append) nothing
        is planned or scanned: the whole table counts as read, so any concurrent commit
        that adds data files makes :meth:`commit` fail, as one adding rows where
        ``condition`` holds would."""
        if self._known_empty():
            self._txn.readWholeTable()
            return 0, 0
        files = _python_list(self.spark, self._filter_files(condition, keep_num_records=True))
        total: int | None = 0
        for add in files:
            stats = json.loads(str(add.stats() or "{}"))
            if total is not None and isinstance(stats.get("numRecords"), int):
                total += int(stats["numRecords"])
            else:
                total = None
        return len(files), total

    def _filter_files(self, condition: Column, *, keep_num_records: bool = False) -> Any:
        """The table's files that may hold rows where ``condition`` holds, read as part of
        this transaction (Delta's ``filterFiles``; their statistics keep only
        ``numRecords``, and only if ``keep_num_records``)."""
        execution = self.spark.read.format("delta").load(self.path).where(condition) \
            ._jdf.queryExecution()
        # Filter(condition, <the table's scan>). Optimized: data skipping needs the bounds
        # as plain literals (a CAST of one is folded only there); analyzed when the
        # optimizer took the filter away (always true or false: reading every file is safe).
        plan = execution.optimizedPlan()
        if plan.nodeName() != "Filter":
            plan = execution.analyzed()
        predicate = plan.condition()
        # (filters, keepNumRecords): the one-argument overloads take files, not filters.
        return self._txn.filterFiles(_scala_seq(self.spark, [predicate]), keep_num_records)

    def write_files(self, df: DataFrame) -> list[str]:
        """Write ``df`` as data files of the table, committing nothing; their ``add``
        actions as JSON. ``df`` must have the table's schema. The table's CHECK and NOT
        NULL constraints are enforced on the rows, as for any write."""
        table = T.StructType.fromJson(json.loads(self.schema_json))
        if not same_shape(df.schema, table):
            raise DblogError(f"rows for {self.path} do not have its schema:\n{df.schema}\n"
                             f"instead of\n{table}")
        actions = _python_list(self.spark, self._txn.writeFiles(df._jdf))
        return [str(a.json()) for a in actions]

    def app_version(self, app_id: str) -> int:
        """The last version application ``app_id`` recorded in the table (Delta's
        ``txnVersion``; -1: none), read as part of this transaction: a commit that records
        one for the same application meanwhile makes :meth:`commit` fail."""
        return int(self._txn.txnVersion(app_id))

    def commit(self, actions_json: Sequence[str], user_metadata: Mapping[str, Any], *,
               app: tuple[str, int] | None = None) -> int:
        """Commit the actions as one append (``WRITE``) with ``user_metadata`` in its commit
        info; returns the new version. ``app``: record ``(app_id, version)`` with it (a
        ``txn`` action, as an idempotent write does)."""
        if app is not None:
            txn = {"txn": {"appId": app[0], "version": int(app[1]),
                           "lastUpdated": int(time.time() * 1000)}}
            actions_json = [*actions_json, json.dumps(txn)]
        jvm = _jvm(self.spark)
        none = jvm.scala.Option.empty()
        text = json.dumps(dict(user_metadata), sort_keys=True, default=str)
        op = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
            jvm.org.apache.spark.sql.SaveMode.Append, none, none, jvm.scala.Option.apply(text),
            none, none, none, none, none)
        seq = _scala_seq(self.spark, _actions(self.spark, actions_json))
        return int(self._txn.commit(seq, op))


def files_dataframe(spark: SparkSession, path: str, actions_json: Sequence[str]) -> DataFrame:
    """The rows of data files written for the table at ``path`` (committed or not), read with
    the table's current schema: files written under an earlier schema of the same table read
    as its older files do (added columns null, widened types widened)."""
    log = _delta_log(spark, path)
    snapshot = log.update(False, _jvm(spark).scala.Option.empty(),
                          _jvm(spark).scala.Option.empty())
    return _files_frame(spark, log, snapshot, _scala_seq(spark, _actions(spark, actions_json)))


def _files_frame(spark: SparkSession, log: Any, snapshot: Any, adds: Any) -> DataFrame:
    """The rows of the data files ``adds`` (a Scala Seq of AddFile), read with ``snapshot``'s
    schema and column mapping."""
    jdf = log.createDataFrame(snapshot, adds, False, _jvm(spark).scala.Option.empty())
    return DataFrame(jdf, spark)


def retry_concurrent_commits(action: Callable[[], None], *, pause_s: float,
                             attempts: int = 5) -> None:
    """Run an idempotent Delta write again when its commit lost to another writer's
    (Delta's ``Concurrent...`` conflicts), pausing ``pause_s`` times the attempt number."""
    for attempt in range(attempts):
        try:
            action()
            return
        except Exception as exc:
            if "Concurrent" not in type(exc).__name__ + str(exc) or attempt == attempts - 1:
                raise
            time.sleep(pause_s * (attempt + 1))
