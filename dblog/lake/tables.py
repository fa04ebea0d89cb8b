"""A source's tables in the lake: creation, schema evolution (added and widened columns),
table properties.

:class:`LakeTables` owns what the writer knows of them (each table's columns and key, the
last schema it made the lake hold) and the lock that keeps creations and schema changes one
at a time. Its ALTERs of the mirror hold the sink's mirror lock, which keeps them away from a
running MERGE.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from dblog.core.errors import DblogError
from dblog.core.events import TableId
from dblog.lake.deltalog import DeltaTxn, kept_active_session
from dblog.lake.layout import LakeLayout
from dblog.lake.schemas import (
    CHANGELOG_STATS,
    NO_CHANGE_FEED,
    RESERVED_COLUMNS,
    TYPE_WIDENING,
    changelog_schema,
    features_for,
    mirror_schema,
    table_properties,
    widens,
)
from dblog.lake.types import META_COLUMNS, column_of, quote_ident, spark_type
from dblog.sources.base import Column, TableSchema

log = logging.getLogger(__name__)


class SchemaEvolutionError(DblogError):
    """A column changed type in a way Delta cannot widen."""



def is_delta_table(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table."""
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


class LakeTables:
    """The changelog and mirror of each of a source's tables, as the writer made them."""

    def __init__(self, spark: SparkSession, layout: LakeLayout,
                 mirror_lock: threading.RLock) -> None:
        self.spark = spark
        self.layout = layout
        self._mirror_lock = mirror_lock
        self._schema_lock = threading.RLock()
        """Table creation and schema changes, one at a time (a capture thread may create the
        tables beside the tailer's thread)."""
        self._columns: dict[TableId, list[Column]] = {}
        self._ensured: dict[TableId, TableSchema] = {}
        """The last schema :meth:`ensure_schema` made the lake hold, per table."""
        self._keys: dict[TableId, tuple[str, ...]] = {}

    def exists(self, path: str) -> bool:
        """Whether ``path`` holds a Delta table (read with the writer's session)."""
        return is_delta_table(self.spark, path)

    def known_columns(self, table: TableId) -> list[Column]:
        """The columns the lake holds for ``table`` (a superset of every schema seen)."""
        if table not in self._columns and self.exists(self.layout.mirror(table)):
            schema = self.spark.read.format("delta").load(self.layout.mirror(table)).schema
            key = json.loads(self.properties(self.layout.mirror(table)).get("dblog.key", "[]"))
            # The key first: other threads (the mirror merger, a capture) take cached
            # columns to mean the key is cached too. Only a missing entry is filled: a
            # thread whose read began before another's ALTER must not put back the
            # columns from before it.
            self._keys.setdefault(table, tuple(key))
            self._columns.setdefault(
                table, [column_of(f) for f in schema.fields if f.name not in META_COLUMNS])
        return self._columns.get(table, [])

    def ensure_tables(self, schema: TableSchema) -> None:
        """Create the table's Delta tables if the lake has none yet, and nothing else: what
        a capture may do before the tailer writes (an empty table holds no change; schema
        changes stay with the tailer, the tables' one writer). A concurrent creation (the
        tailer's, another process's) is met by trying again (:meth:`_create_beside_others`)."""
        with self._schema_lock:
            if self.known_columns(schema.table):
                return
            self._refuse_reserved(schema)
            self._create_beside_others(schema)

    def ensure_schema(self, schema: TableSchema) -> None:
        """Create the table's Delta tables, or add the columns they do not have yet.

        Refuses a schema with a column of a :data:`RESERVED_COLUMNS` name, before any change
        to the lake."""
        with self._schema_lock:
            self._ensure_schema(schema)

    def _ensure_schema(self, schema: TableSchema) -> None:
        table = schema.table
        if self._ensured.get(table) == schema:  # the lake only gains columns and widens
            return
        self._refuse_reserved(schema)
        current = self.known_columns(table)
        if not current:
            self._create_beside_others(schema)
        if table not in self._ensured:
            # Once per table and process, each lake table on its own: another creator's
            # table may lack a column, or have it narrower, and either one (a capture's
            # changelog beside this schema's mirror reads back as complete, the columns
            # being read from the mirror), also after a crash between the creation and
            # the ALTERs that complete it.
            if self._complete_targets(table, schema.columns):
                self._columns.pop(table, None)  # read back (a creation dropped them already)
            current = self.known_columns(table)
        by_name = {c.name: c for c in current}
        added: list[Column] = []
        for col in schema.columns:
            have = by_name.get(col.name)
            if have is None:
                added.append(col)
            elif spark_type(have.spark_type) != spark_type(col.spark_type):
                self._widen(table, have, col)
        if added:
            self._add_columns(table, added)
        self._ensured[table] = schema

    def _create_table(
        self,
        path: str,
        schema: T.StructType,
        props: Mapping[str, str],
        spark: SparkSession | None = None,
        partitioned_by: Sequence[str] = (),
    ) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(spark or self.spark).location(path)
        builder = builder.addColumns(schema)
        if partitioned_by:
            builder = builder.partitionedBy(*partitioned_by)
        for key, value in props.items():
            builder = builder.property(key, value)
        builder.execute()

    @staticmethod
    def _refuse_reserved(schema: TableSchema) -> None:
        table = schema.table
        clash = [c.name for c in schema.columns if c.name.lower() in RESERVED_COLUMNS]
        if clash:
            raise DblogError(
                f"{table}: the column name {', '.join(clash)} is one the lake's tables "
                f"reserve for dblog ({', '.join(RESERVED_COLUMNS)}, in any case); rename it in "
                f"the source, or leave {table} out of the configuration (a tailer that met "
                "it in the log goes on past it with `dblog tail --from-head`, then "
                "`dblog capture`)")

    def _create_beside_others(self, schema: TableSchema, attempts: int = 4) -> None:
        """Create the table's Delta tables, another process creating them at the same
        moment (a capture beside its first select, the tailer at a high watermark) or not:
        Delta refuses the creation that lost the race (a protocol or metadata change), and
        the creation is tried again, which then finds the winner's tables."""
        for attempt in range(1, attempts + 1):
            try:
                self._create(schema)
                return
            except Exception as exc:
                self._columns.pop(schema.table, None)
                for path in (self.layout.changelog(schema.table),
                             self.layout.mirror(schema.table)):
                    self._remove_unborn_log(path)
                if attempt == attempts:
                    raise
                log.info("creating the lake tables of %s met another creator (%s); trying "
                         "again", schema.table, type(exc).__name__)
                time.sleep(0.2 * attempt)

    def _remove_unborn_log(self, path: str) -> bool:
        """Remove the Delta log directory of the table at ``path`` if it holds no commit: a
        creation killed after Delta made the directory (with ``_staged_commits`` in it) and
        before its first commit left one, and Delta then refuses to create the table there
        (``DELTA_TABLE_NOT_FOUND``), so every later creation failed.

        Such a directory holds no file but hidden ones (the temporary file of a commit never
        renamed into place, its checksum): those are deleted, then the directories one by
        one, each only if empty, so that a commit another creator lands meanwhile stays.
        Returns whether the directory is gone."""
        from py4j.protocol import Py4JJavaError

        jvm = self.spark._jvm
        assert jvm is not None
        log_dir = jvm.org.apache.hadoop.fs.Path(path, "_delta_log")
        fs = log_dir.getFileSystem(self.spark._jsc.hadoopConfiguration())
        try:
            if not fs.exists(log_dir):
                return False
            files: list[Any] = []
            dirs: list[Any] = []
            pending = [log_dir]
            while pending:
                directory = pending.pop()
                dirs.append(directory)
                for status in fs.listStatus(directory):
                    (pending if status.isDirectory() else files).append(status.getPath())
            if any(not f.getName().startswith(".") for f in files):
                return False
            for f in files:
                fs.delete(f, False)
            for directory in reversed(dirs):  # children before their parents
                fs.delete(directory, False)
        except Py4JJavaError as exc:  # not empty after all: a creator committed meanwhile
            log.info("kept the Delta log at %s (%s)", path, exc.java_exception)
            return False
        log.warning("removed the Delta log at %s: it held no commit (a creation of the "
                    "table that died before its first commit)", path)
        return True

    def _create(self, schema: TableSchema) -> None:
        table = schema.table
        props = {**table_properties(schema.names), "dblog.key": json.dumps(list(schema.key)),
                 "dblog.source": self.layout.source, "dblog.table": str(table)}
        self._create_table(self.layout.changelog(table), changelog_schema(schema.columns),
                           {**props, **CHANGELOG_STATS})
        self._create_table(self.layout.mirror(table), mirror_schema(schema.columns),
                           {**props, **NO_CHANGE_FEED})
        self._columns.pop(table, None)  # read back: the tables may be another creator's

    def _targets(self, table: TableId) -> list[tuple[str, str, dict[str, T.DataType]]]:
        """The three places a column lives (changelog ``before.``/``after.``, mirror), each
        with its lake path, column prefix and the fields it has now."""
        changelog = self.layout.changelog(table)
        mirror = self.layout.mirror(table)
        log_schema = self.spark.read.format("delta").load(changelog).schema
        mirror_schema_ = self.spark.read.format("delta").load(mirror).schema
        out: list[tuple[str, str, dict[str, T.DataType]]] = []
        for prefix in ("before", "after"):
            struct = log_schema[prefix].dataType
            assert isinstance(struct, T.StructType)
            out.append((changelog, prefix + ".", {f.name: f.dataType for f in struct.fields}))
        out.append((mirror, "", {f.name: f.dataType for f in mirror_schema_.fields}))
        return out

    def properties(self, path: str) -> dict[str, str]:
        """The table's properties, from its snapshot's metadata (``DESCRIBE DETAIL`` would
        also count the table's files and bytes: a Spark job over the whole Delta log, ~1 s
        on a table read for the first time, 5 s in a fresh JVM). The calling thread's
        active Spark session is left as it was (the mirror merger's is its own)."""
        with kept_active_session(self.spark):
            return DeltaTxn(self.spark, path).configuration()

    def _set_props(self, path: str, props: Mapping[str, str]) -> None:
        """Set table properties the table does not have yet (one commit, or none)."""
        current = self.properties(path)
        todo = {k: v for k, v in props.items() if current.get(k) != v}
        if todo:
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in todo.items())
            self.spark.sql(f"ALTER TABLE delta.{quote_ident(path)} SET TBLPROPERTIES ({pairs})")

    def _complete_targets(self, table: TableId, columns: Sequence[Column]) -> bool:
        """Give every place a column lives (:meth:`_targets`) each of ``columns``, at least
        as wide; whether anything was altered. A place with a type Delta cannot widen is
        left to :meth:`_widen`, which compares the mirror's."""
        altered = False
        with self._mirror_lock:
            for path, prefix, fields in self._targets(table):
                missing = [c for c in columns if c.name not in fields]
                narrower = [
                    (c, spark_type(c.spark_type)) for c in columns
                    if c.name in fields and fields[c.name] != spark_type(c.spark_type)
                    and widens(fields[c.name], spark_type(c.spark_type))
                ]
                if missing:
                    self._add_to(path, prefix, missing)
                    altered = True
                for column, new_type in narrower:
                    self._widen_at(path, prefix, column.name, new_type)
                    altered = True
        return altered

    def _add_columns(self, table: TableId, added: list[Column]) -> None:
        """Add ``added`` where each is missing: a crash between the three ALTERs leaves some
        targets with the column, so every target is checked on its own."""
        with self._mirror_lock:
            self._add_missing_columns(table, added)

    def _add_missing_columns(self, table: TableId, added: list[Column]) -> None:
        for path, prefix, fields in self._targets(table):
            missing = [c for c in added if c.name not in fields]
            if missing:
                self._add_to(path, prefix, missing)
        known = {c.name for c in self._columns.get(table, [])}
        self._columns[table] = self._columns.get(table, []) + [
            c for c in added if c.name not in known
        ]

    def _add_to(self, path: str, prefix: str, missing: Sequence[Column]) -> None:
        """One ALTER adding ``missing`` to the lake table at ``path`` (under ``prefix``)."""
        types = [spark_type(c.spark_type) for c in missing]
        self._set_props(path, features_for(types, [c.name for c in missing]))
        ddl = ", ".join(
            f"{prefix}{quote_ident(c.name)} {t.simpleString()}"
            for c, t in zip(missing, types, strict=True)
        )
        self.spark.sql(f"ALTER TABLE delta.{quote_ident(path)} ADD COLUMNS ({ddl})")

    def _widen(self, table: TableId, have: Column, new: Column) -> None:
        """Follow a source type change: widen the lake column, or keep a wider lake type.

        Type widening is enabled on a table only here (delta-rs cannot read a table with it);
        each target is checked on its own, so a crash between the ALTERs resumes."""
        old_type, new_type = spark_type(have.spark_type), spark_type(new.spark_type)
        if widens(new_type, old_type):
            return  # the source narrowed: its values still fit the lake's wider type
        if not widens(old_type, new_type):
            raise SchemaEvolutionError(
                f"{table}.{have.name} changed type from {have.spark_type} to {new.spark_type}, "
                "which Delta cannot widen; nothing of the change was written. To follow it: "
                f"take {table} out of the config's tables and run `dblog tail` past the "
                f"change, move its lake tables ({self.layout.changelog(table)}, "
                f"{self.layout.mirror(table)}) aside, put it back and run `dblog capture "
                f"{table}`"
            )
        with self._mirror_lock:
            self._alter_types(table, have, new_type)
        self._columns[table] = [
            Column(c.name, new.spark_type) if c.name == have.name else c
            for c in self._columns[table]
        ]

    def _alter_types(self, table: TableId, have: Column, new_type: T.DataType) -> None:
        for path, prefix, fields in self._targets(table):
            current = fields.get(have.name)
            if current is None or current == new_type or widens(new_type, current):
                continue  # already widened (a resumed crash) or wider still
            self._widen_at(path, prefix, have.name, new_type)

    def _widen_at(self, path: str, prefix: str, name: str, new_type: T.DataType) -> None:
        """One ALTER widening column ``name`` (under ``prefix``) of the lake table at
        ``path`` to ``new_type``, type widening enabled there first."""
        self._set_props(path, {**TYPE_WIDENING, **features_for([new_type], [])})
        self.spark.sql(f"ALTER TABLE delta.{quote_ident(path)} ALTER COLUMN "
                       f"{prefix}{quote_ident(name)} TYPE {new_type.simpleString()}")

    def key_columns(self, table: TableId) -> tuple[str, ...]:
        """The table's key columns, as its lake tables record them (``dblog.key``)."""
        self.known_columns(table)
        return self._keys[table]
