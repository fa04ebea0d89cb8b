"""What every source database implements, and the values it hands to the engine."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dblog.core.chunking import KeyRange
from dblog.core.events import ChangeEvent, Key, Position, TableId, WatermarkEvent

SPARK_TYPES = (
    "BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "STRING", "BINARY",
    "DATE", "TIMESTAMP", "TIMESTAMP_NTZ",
)
"""Canonical column types, as Spark DDL names (plus ``DECIMAL(p,s)``).

Python values handed to the engine follow them: int, bool, float, Decimal, str, bytes,
datetime.date, datetime.datetime (naive for TIMESTAMP_NTZ, UTC-aware for TIMESTAMP).
"""


FETCH_ROWS = 10_000
"""Rows a chunk select's JDBC cursor fetches at a time: the driver streams the result
instead of holding it whole in memory."""


def element_type(spark_type: str) -> str | None:
    """The element type of a canonical ``ARRAY<...>`` type; None for any other type."""
    if spark_type.startswith("ARRAY<") and spark_type.endswith(">"):
        return spark_type[6:-1]
    return None


@dataclass(frozen=True, slots=True)
class Column:
    """A column in its canonical form: name, Spark DDL type, nullability."""

    name: str
    spark_type: str
    nullable: bool = True
    source_type: str = ""


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A table's columns (in table order) and primary-key column names (in key order)."""

    table: TableId
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def key_of(self, row: Mapping[str, Any]) -> Key:
        return tuple(row[k] for k in self.key)


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """A DDL statement seen in the log for a tracked table. Events carry their own column
    list, so decoding never depends on it; ``resets_rows`` marks the ones that empty it."""

    table: TableId
    statement: str
    position: Position
    resets_rows: bool = False
    """The statement removed every row of the table without row events (TRUNCATE, DROP
    TABLE, DROP DATABASE): the lake table is emptied at ``position``."""
    rewrites_rows: bool = False
    """The statement may have changed stored values without row events (a column type or
    default changed, a character set converted, another table renamed into its place): the
    mirror may differ from the source until a capture of the table repairs it."""


@dataclass(frozen=True, slots=True)
class UnloggedChange:
    """Rows of a tracked table changed at ``position`` without the row events that say how:
    a statement-format DML, a partial row image, a foreign-key cascade. The lake must read
    them again from the table (a heal, :mod:`dblog.tail.heal`).

    ``keys``: the keys whose rows changed, when the log names them (None: any row of the
    table may have changed). ``reason`` says what happened and how to avoid it, in the
    operator's words (the setting or schema feature, and its fix)."""

    table: TableId
    position: Position
    reason: str
    keys: tuple[Key, ...] | None = None


LogItem = ChangeEvent | WatermarkEvent | SchemaChange | UnloggedChange


@dataclass(frozen=True, slots=True)
class Transaction:
    """One committed source transaction, in log order.

    ``resume`` is the source-native position just after its commit: a reader started there
    continues with the next transaction. ``schemas`` holds the schema each touched table had
    when the events were written (from the log's own metadata).
    """

    items: tuple[LogItem, ...]
    resume: Mapping[str, Any]
    position: Position
    commit_ts_ms: int | None = None
    schemas: Mapping[TableId, TableSchema] = field(default_factory=dict)


class LogReader(Protocol):
    """Reads committed transactions from a source log, starting at a resume position."""

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        """Return up to ``max_transactions`` committed transactions; waits at most
        ``max_wait_s`` when none are available (returns ``[]`` then)."""
        ...

    def close(self) -> None: ...


def confirm_log(reader: Any, native: Mapping[str, Any]) -> None:
    """Tell ``reader`` that the log before ``native`` will never be read again (a source
    that keeps log for its consumer, such as a PostgreSQL replication slot, may release
    it); readers of sources that keep no such state have no ``confirm``."""
    confirm = getattr(reader, "confirm", None)
    if confirm is not None:
        confirm(native)


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """Which rows one chunk select reads.

    Bounds are ``(after_key, upper_key]``: exclusive below, inclusive above, None = open.
    ``keys`` limits the chunk to those primary keys; ``where`` is an operator-supplied SQL
    filter (trusted configuration, never end-user data). ``limit`` None: no ``LIMIT``, the
    key bounds alone bound the chunk (planned before its select); without a ``LIMIT`` the
    select, as Spark's JDBC reader wraps it in a subquery, is merged into its outer query
    by MariaDB instead of being materialized in a temporary table first.
    """

    table: TableId
    limit: int | None
    after_key: Key | None = None
    upper_key: Key | None = None
    keys: Sequence[Key] | None = None
    where: str | None = None


class SourceDialect(Protocol):
    """One source database: validation, metadata, watermarks, log reading, chunk SQL."""

    name: str

    def validate(self) -> None:
        """Refuse (SourceError with a clear message) if the server cannot be captured."""
        ...

    def ensure_watermark_table(self) -> None: ...

    def write_watermark(self, value: str, *, low: bool = False) -> None:
        """Write ``value`` to the watermark table in its own committed transaction.

        ``low``: a chunk window's low watermark. Returns only once a select started after it
        sees every transaction the log holds before it (a source whose transactions can be
        in the log before they are visible waits for them here)."""
        ...

    def table_schema(self, table: TableId) -> TableSchema:
        """Current schema; SourceError for an unknown table or one without a primary key."""
        ...

    def head_position(self) -> Mapping[str, Any]:
        """The source-native position of the end of the log now."""
        ...

    def to_position(self, native: Mapping[str, Any]) -> Position: ...

    def log_bytes_between(self, position: Mapping[str, Any], head: Mapping[str, Any]
                          ) -> int | None:
        """Bytes of source log from ``position`` to ``head`` (None: not known)."""
        ...

    def open_log(self, start: Mapping[str, Any], tables: Sequence[TableId]) -> LogReader:
        """A reader from ``start``; LogPurgedError if the log no longer reaches back there."""
        ...

    def chunk_sql(self, spec: ChunkSpec, schema: TableSchema) -> str:
        """A SELECT for one chunk in key order, for Spark JDBC's ``query`` option."""
        ...

    def jdbc_options(self) -> dict[str, str]:
        """Spark JDBC options (url, driver, user, password) for chunk selects."""
        ...

    def read_chunk(self, spark: Any, spec: ChunkSpec, schema: TableSchema) -> Any:
        """One chunk as a Spark DataFrame in the table's canonical schema, in key order."""
        ...

    def read_max_key(self, spark: Any, schema: TableSchema, after_key: Key | None) -> Any:
        """The greatest key above ``after_key`` as a DataFrame of the key columns in their
        canonical types: one row, or none when no key lies above ``after_key``."""
        ...

    def key_after(self, table: TableId, after: Key | None, offset: int,
                  upper: Key | None = None) -> Key | None:
        """The key at 0-based ``offset`` above ``after`` (and at or below ``upper``) in the
        database's key order, or ``None`` (plans key ranges and chunk reads without
        Spark)."""
        ...

    def range_checksums(
        self, table: TableId, ranges: Sequence[KeyRange],
        on_snapshot: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[dict[str, Any], list[tuple[int, int]]]:
        """Per key range, ``(row count, checksum)`` computed on the database from one
        snapshot, and the native log position of that snapshot (also handed to
        ``on_snapshot`` as soon as it is known)."""
        ...

    def spark_orders_keys_like_source(self, table: TableId) -> bool:
        """True only when Spark's natural ordering of the key columns' canonical lake values
        equals the database's ``ORDER BY`` of those key columns (so key ranges, bounds and
        sort order mean the same on both sides); False whenever that is not guaranteed."""
        ...

    def close(self) -> None: ...
