"""PostgreSQL (15+) as a DBLog source: the :class:`SourceDialect` implementation."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg2

from dblog.core.chunking import KeyRange
from dblog.core.errors import ConfigError, LogPurgedError, SourceError
from dblog.core.events import Key, Position, TableId
from dblog.sources.base import FETCH_ROWS, ChunkSpec, TableSchema
from dblog.sources.postgres.connection import PostgresSettings, connect, translate
from dblog.sources.postgres.pgoutput import lsn_text
from dblog.sources.postgres.publication import RESETS_TABLE, bookkeeping_ddl, sync_publication
from dblog.sources.postgres.schema import key_columns, load_table_schema
from dblog.sources.postgres.snapshot import (
    build_chunk_sql,
    key_at_offset_sql,
    key_from_row,
    max_key_sql,
    read_query,
)
from dblog.sources.postgres.sqltext import quote_ident, quote_table
from dblog.sources.postgres.types import SESSION_SETTINGS, spark_orders_like_source
from dblog.sources.postgres.wal import WATERMARK_TABLE, PostgresLogReader, native_lsn

SLOT_GENERATIONS = "slot_generation"
log = logging.getLogger(__name__)

VISIBILITY_WAIT_S = 120.0
"""How long a low watermark waits for transactions the WAL holds before it to become visible
(a synchronous standby that does not answer holds them back) before the capture stops."""
_LOCAL_COMMITS = (
    "SELECT set_config('synchronous_commit', 'local', false)"
    " WHERE current_setting('synchronous_commit') NOT IN ('off', 'local')"
)
"""The control connection's commits (watermarks, table resets) wait for the local WAL flush
only, never for a synchronous standby: the log reader decodes the primary's WAL once it is
flushed there, standby or not."""
_SEES_WAITS = (
    "SELECT current_setting('synchronous_standby_names') <> '',"
    " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
    " OR pg_has_role('pg_read_all_stats', 'USAGE')"
)
_WAITING_FOR_STANDBY = (
    "SELECT coalesce(array_agg(backend_xid::text), '{}') FROM pg_stat_activity"
    " WHERE wait_event = 'SyncRep' AND backend_xid IS NOT NULL"
)
"""The transactions whose commits wait for a synchronous standby: in the WAL (the log
reader may have decoded them) but not visible to other sessions yet."""
_STILL_RUNNING = (
    "/* dblog: the chunk select waits for transactions in the WAL to become visible */"
    " SELECT coalesce(array_agg(backend_xid::text), '{}') FROM pg_stat_activity"
    " WHERE backend_xid = ANY(%s::xid[])"
)
"""Which of those a backend still runs: a transaction's backend clears its xid when the
transaction becomes visible (ProcArrayEndTransaction), and from then on every snapshot taken
sees it."""

T = TypeVar("T")
WATERMARK_LENGTH = 36
INITIAL_WATERMARK = "00000000-0000-0000-0000-000000000000"
_END_OF_RECORDS = (
    "SELECT CASE WHEN mod(lsn, seg) = 40 THEN lsn - 40 WHEN mod(lsn, blk) = 24 THEN lsn - 24"
    " ELSE lsn END FROM (SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint AS lsn,"
    " current_setting('wal_block_size')::bigint AS blk,"
    " pg_size_bytes(current_setting('wal_segment_size')) AS seg) AS insert_position"
)
"""The WAL insert position as the end of the last record. At the start of a page the insert
position lies past the page's header (24 bytes, 40 on a segment's first page), where no
record ends: a tailer's position (the end of the records it read) never gets there until
the next record, so the head is the page's start instead."""


class PostgresDialect:
    """PostgreSQL source: validation, watermarks, logical replication (pgoutput), chunks.

    One control connection (autocommit, :data:`SESSION_SETTINGS`) serves metadata and
    watermark writes, guarded by a lock; each log reader has its own replication connection.
    """

    def __init__(self, settings: PostgresSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self._lock = threading.Lock()
        self._conn: Any = None
        self._generation: str | None = None

    def __repr__(self) -> str:
        return f"PostgresDialect({self.settings!r})"

    @property
    def watermark_table(self) -> TableId:
        return TableId(self.settings.watermark_schema, WATERMARK_TABLE)

    def _run(self, work: Callable[[Any], T], doing: str = "") -> T:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self.settings)
                    with self._conn.cursor() as cur:
                        cur.execute(_LOCAL_COMMITS)
                return work(self._conn)
            except (psycopg2.Error, OSError) as exc:
                if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
                    self._close_locked()
                raise translate(exc, self.settings, doing) from None

    def _close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # already broken
                pass
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _query(self, sql: str, params: Sequence[Any] = (), doing: str = "") -> list[Any]:
        def run(conn: Any) -> list[Any]:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []

        return self._run(run, doing)

    # -- validation ---------------------------------------------------------------------

    def validate(self) -> None:
        """Refuse (SourceError naming the setting and the fix) unless the server can be
        captured: ``wal_level=logical``, free replication slots, a role with the
        REPLICATION attribute, and, with synchronous standbys, one that sees other sessions'
        wait events (:meth:`write_watermark`)."""
        rows = self._query(
            "SELECT current_setting('wal_level'), current_setting('max_replication_slots'),"
            " current_setting('server_version_num')::int,"
            " (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)",
            doing="validate")
        wal_level, slots, version, replication = rows[0]
        standbys, sees_waits = self._query(_SEES_WAITS, doing="validate")[0]
        problems = []
        if wal_level != "logical":
            problems.append(f"wal_level is {wal_level!r}: set wal_level = logical in "
                            "postgresql.conf and restart the server")
        if int(slots) < 1:
            problems.append("max_replication_slots is 0: set it to at least 1 and restart")
        if int(version) < 150000:
            problems.append(f"server version {version}: PostgreSQL 15 or newer is needed")
        if not replication:
            problems.append(f"role {self.settings.user!r} lacks the REPLICATION attribute: "
                            f"ALTER ROLE {quote_ident(self.settings.user)} REPLICATION")
        if standbys and not sees_waits:
            problems.append(self._blind_to_standby_waits())
        if problems:
            raise SourceError(f"source {self.name!r} ({self.settings.address}) cannot be "
                              "captured: " + "; ".join(problems))

    # -- watermarks, publication, slot ----------------------------------------------------

    def ensure_watermark_table(self) -> None:
        """Create ``<watermark_schema>.watermark`` with its one row, then the publication and
        the replication slot, each only if missing."""
        schema = quote_ident(self.settings.watermark_schema)
        table = quote_table(self.watermark_table)

        def create(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} (id smallint PRIMARY KEY,"
                    " value varchar(36) NOT NULL, written_at timestamptz)")
                cur.execute(f"INSERT INTO {table} (id, value) VALUES (1, %s)"  # noqa: S608 - quoted
                            " ON CONFLICT (id) DO NOTHING", (INITIAL_WATERMARK,))
                for ddl in bookkeeping_ddl(self.settings.watermark_schema):
                    cur.execute(ddl)

        self._run(create, "creating the watermark table")
        for configured in self.settings.tables:  # a clear refusal before any publication
            self.table_schema(configured)
        self.sync_publication()
        self._ensure_slot()

    def sync_publication(self, tables: Sequence[TableId] = ()) -> list[str]:
        """Keep the configured tables (and ``tables``) in the publication and reset any
        whose relation changed (:mod:`dblog.sources.postgres.publication`); returns
        the resets."""
        always = [self.watermark_table, TableId(self.settings.watermark_schema, RESETS_TABLE)]
        wanted = list(dict.fromkeys([*self.settings.tables, *tables]))
        return self._run(lambda conn: sync_publication(conn, self.settings, wanted, always),
                         "keeping the publication")

    def _slot(self) -> tuple[str, int | None, str | None, str | None] | None:
        """The slot's plugin, confirmed position, WAL status and database (None: no slot)."""
        rows = self._query(
            "SELECT plugin, (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint, wal_status, database"
            " FROM pg_replication_slots WHERE slot_name = %s", (self.settings.slot_name,),
            "reading the replication slot")
        if not rows:
            return None
        plugin, confirmed, status, database = rows[0]
        return str(plugin), None if confirmed is None else int(confirmed), status, database

    @property
    def _generations(self) -> str:
        return quote_table(TableId(self.settings.watermark_schema, SLOT_GENERATIONS))

    def slot_generation(self) -> str:
        """An id dblog gives its slot when it creates (or first finds) it: positions carry
        it, so a position read from an earlier slot of the same name is never resumed."""
        if self._generation is None:
            rows = self._query(f"SELECT generation FROM {self._generations}"  # noqa: S608
                               " WHERE slot_name = %s", (self.settings.slot_name,),
                               "reading the replication slot's generation")
            if not rows:
                raise SourceError(f"no generation recorded for replication slot "
                                  f"{self.settings.slot_name!r}: run ensure_watermark_table")
            self._generation = str(rows[0][0])
        return self._generation

    def _ensure_slot(self) -> None:
        self._query(f"CREATE TABLE IF NOT EXISTS {self._generations} (slot_name text PRIMARY"
                    " KEY, generation text NOT NULL)", doing="creating the slot generations")
        slot = self._slot()
        name = self.settings.slot_name
        record = (f"INSERT INTO {self._generations} VALUES (%s, %s) ON CONFLICT (slot_name)"  # noqa: S608
                  " DO UPDATE SET generation = EXCLUDED.generation")
        if slot is None:
            try:
                self._query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                            (name,), "creating the replication slot")
            except SourceError as exc:
                if "already exists" not in str(exc):
                    raise
            else:
                self._query(record, (name, uuid.uuid4().hex), "recording the slot generation")
                self._generation = None
                return
        known = f"SELECT 1 FROM {self._generations} WHERE slot_name = %s"  # noqa: S608
        rows = self._query(known, (name,), "reading the slot generation")
        if not rows:  # a slot made before generations were recorded, or by hand
            self._query(record, (name, uuid.uuid4().hex), "recording the slot generation")
            self._generation = None
        slot = self._slot()
        if slot is None:
            return
        plugin, _, _, database = slot
        if plugin != "pgoutput" or database != self.settings.database:
            raise SourceError(
                f"replication slot {name!r} on {self.settings.host}:{self.settings.port} "
                f"decodes database {database!r} with {plugin!r}, not {self.settings.database!r}"
                " with pgoutput: drop it or configure another source.slot")

    def write_watermark(self, value: str, *, low: bool = False) -> None:
        """Write ``value`` to the watermark row: one UPDATE, its own committed transaction.

        ``low``: then wait until the transactions whose commits wait for a synchronous
        standby are visible (:meth:`_wait_until_visible`)."""
        if not isinstance(value, str) or not value or len(value) > WATERMARK_LENGTH:
            raise ConfigError(f"watermark value must be 1-36 characters, got {value!r}")
        sql = (f"UPDATE {quote_table(self.watermark_table)}"  # noqa: S608 - quoted identifier
               " SET value = %s, written_at = now() WHERE id = 1")

        def write(conn: Any) -> tuple[int, list[str]]:
            with conn.cursor() as cur:
                cur.execute(sql, (value,))
                written = int(cur.rowcount)
                if not low or written != 1:
                    return written, []
                cur.execute(_SEES_WAITS)
                standbys, sees = cur.fetchone()
                if standbys and not sees:
                    raise SourceError(self._blind_to_standby_waits())
                cur.execute(_WAITING_FOR_STANDBY)
                return written, [str(x) for x in cur.fetchone()[0]]

        written, waiting = self._run(write, "writing a watermark")
        if written != 1:
            raise SourceError(
                f"watermark row missing in {self.watermark_table}: run ensure_watermark_table")
        if waiting:
            self._wait_until_visible(waiting)

    def _blind_to_standby_waits(self) -> str:
        return (f"synchronous_standby_names is set on {self.settings.address}: a commit "
                "waiting for a synchronous standby is in the WAL before it is visible, and "
                "dblog must see which sessions wait (pg_stat_activity.wait_event) so that no "
                "chunk overwrites such a transaction: GRANT pg_read_all_stats TO "
                f"{quote_ident(self.settings.user)}")

    def _wait_until_visible(self, xids: list[str]) -> None:
        """Wait until no backend runs any of ``xids`` any more: transactions that waited for
        a synchronous standby right after a low watermark committed, so possibly in the
        WAL before it (decoded, outside the window) yet invisible to the chunk's select.

        PostgreSQL writes a commit record (and, with ``synchronous_commit`` on, flushes it,
        which is all the log reader waits for) and marks it in ``pg_xact`` before it waits
        for a synchronous standby, and the transaction becomes visible only after that wait
        (``ProcArrayEndTransaction``). A select taken meanwhile reads the older row, and the
        chunk, emitted at the high watermark, would overwrite the newer value the log gave.
        The set is fixed at the low watermark, so this ends under any load: once the
        standby answers for them, or their waits are cancelled (they then commit locally).
        ``pg_xact_status()`` cannot tell them apart from running transactions: it reports
        "in progress" while the proc array still holds them."""
        began = time.monotonic()
        pause, warned = 0.002, began
        while xids:
            waited = time.monotonic() - began
            if waited >= VISIBILITY_WAIT_S:
                raise SourceError(
                    f"transactions {', '.join(xids)} on {self.settings.address} committed in "
                    "the WAL but stayed invisible for "
                    f"{VISIBILITY_WAIT_S:.0f} s, waiting for a synchronous standby "
                    "(synchronous_standby_names): a chunk selected now could overwrite their "
                    "changes; the capture stops (resume it once the standby answers)")
            if time.monotonic() - warned >= 10:
                warned = time.monotonic()
                log.warning("a chunk select waits %.0f s for transactions %s, committed in "
                            "the WAL but not visible yet: their commits wait for a "
                            "synchronous standby", waited, ", ".join(xids))
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            rows = self._query(_STILL_RUNNING, (xids,),
                               "waiting for transactions in the WAL to become visible")
            xids = [str(x) for x in rows[0][0]]

    # -- metadata and positions --------------------------------------------------------

    def table_schema(self, table: TableId) -> TableSchema:
        return self._run(lambda conn: load_table_schema(conn, table), f"reading {table}")

    def head_position(self) -> dict[str, Any]:
        """``{"lsn": <int>, "slot": <generation>}``: the end of the WAL now.

        The insert position, not ``pg_current_wal_lsn()`` (the write position): with
        ``synchronous_commit = off`` a committed transaction's commit record may not be
        written yet, and a head before it would call a tailer caught up too early."""
        rows = self._query(_END_OF_RECORDS, doing="reading the WAL position")
        return {"lsn": int(rows[0][0]), "slot": self.slot_generation()}

    def to_position(self, native: Mapping[str, Any]) -> Position:
        return Position(native_lsn(native))

    def log_bytes_between(self, position: Mapping[str, Any], head: Mapping[str, Any]
                          ) -> int | None:
        """Bytes of WAL from ``position`` to ``head`` (LSNs subtract)."""
        diff = native_lsn(head) - native_lsn(position)
        return diff if diff >= 0 else None

    def open_log(self, start: Mapping[str, Any], tables: Sequence[TableId]
                 ) -> PostgresLogReader:
        """A reader from ``start``; LogPurgedError if the slot is gone or has confirmed
        past ``start`` (the WAL in between is no longer kept for this consumer)."""
        lsn = native_lsn(start)
        for table in tables:
            if not isinstance(table, TableId):
                raise ConfigError(f"expected a TableId, got {table!r}")
        slot = self._slot()
        name = self.settings.slot_name
        if slot is None:
            raise LogPurgedError(
                f"replication slot {name!r} on {self.settings.address} does not exist (was it "
                "dropped?): run `dblog tail --from-head`, then `dblog capture` to re-snapshot")
        _, confirmed, wal_status, _ = slot
        if wal_status == "lost":
            raise LogPurgedError(
                f"replication slot {name!r} on {self.settings.address} lost WAL it needed "
                "(max_slot_wal_keep_size): run `dblog tail --from-head`, then `dblog capture` "
                "to re-snapshot")
        generation = self.slot_generation()
        if "slot" in start and start["slot"] != generation:
            raise LogPurgedError(
                f"WAL position {lsn_text(lsn)} was read from an earlier replication slot "
                f"{name!r} (the slot was dropped and made again since): run "
                "`dblog tail --from-head`, then `dblog capture` to re-snapshot")
        if confirmed is not None and lsn < confirmed and "slot" not in start:
            raise LogPurgedError(
                f"WAL position {lsn_text(lsn)} is older than replication slot {name!r}'s "
                f"confirmed position {lsn_text(confirmed)} (the slot was recreated, or another "
                "consumer advanced it): run `dblog tail --from-head`, then `dblog capture` to "
                "re-snapshot")
        # Of the same slot, a confirmed position past ``start`` was left by a version before
        # 2026-12-02, whose psycopg2 confirmed keepalive positions by itself; the server
        # resumes after it. Now the slot is confirmed only where the tailer committed.
        # A table the tailer serves beyond the configuration it started with (`tail
        # --follow-config`) joins the publication now; its changes are published from here.
        self.sync_publication(tables)
        return PostgresLogReader(self.settings, {"lsn": lsn, "slot": generation}, tables,
                                 check_relations=lambda: self.sync_publication(tables))

    # -- chunks ---------------------------------------------------------------------------

    def chunk_sql(self, spec: ChunkSpec, schema: TableSchema) -> str:
        if spec.table != schema.table:
            raise ConfigError(f"chunk of {spec.table} with the schema of {schema.table}")
        return build_chunk_sql(spec, schema)

    def jdbc_options(self) -> dict[str, str]:
        """Spark JDBC options; the session settings travel in the ``options`` parameter."""
        s = self.settings
        host = f"[{s.host}]" if ":" in s.host else s.host
        options = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
        params = "&".join([
            f"options={quote(options, safe='')}",
            f"connectTimeout={max(1, int(s.connect_timeout))}",
            f"ApplicationName={quote('dblog-' + s.name, safe='')}",
        ])
        return {
            "url": f"jdbc:postgresql://{host}:{s.port}/{quote(s.database, safe='')}?{params}",
            "driver": "org.postgresql.Driver",
            "user": s.user,
            "password": s.password,
        }

    def read_chunk(self, spark: Any, spec: ChunkSpec, schema: TableSchema) -> Any:
        """One chunk through Spark JDBC in the canonical schema, in key order; each select
        is its own autocommit statement, so it reads a fresh READ COMMITTED snapshot."""
        options = {**self.jdbc_options(), "fetchsize": str(FETCH_ROWS)}
        return read_query(spark, options, self.chunk_sql(spec, schema), schema.columns)

    def read_max_key(self, spark: Any, schema: TableSchema, after_key: Key | None) -> Any:
        return read_query(spark, self.jdbc_options(), max_key_sql(schema, after_key),
                          [schema.column(k) for k in schema.key])

    def key_after(self, table: TableId, after: Key | None, offset: int,
                  upper: Key | None = None) -> Key | None:
        schema = self.table_schema(table)
        rows = self._query(key_at_offset_sql(schema, after, offset, upper),
                           doing=f"planning key ranges of {table}")
        return None if not rows else key_from_row(schema, rows[0])

    def range_checksums(
        self, table: TableId, ranges: Sequence[KeyRange],
        on_snapshot: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[dict[str, Any], list[tuple[int, int]]]:
        """Row count and checksum of each key range from one REPEATABLE READ snapshot, and
        the WAL position read as that snapshot was taken."""
        from dblog.sources.postgres.checksum import all_checksum_sql

        schema = self.table_schema(table)
        statements = all_checksum_sql(schema, ranges)
        conn = connect(self.settings, autocommit=False)
        try:
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with conn.cursor() as cur:
                cur.execute(_END_OF_RECORDS)
                position = {"lsn": int(cur.fetchone()[0])}
                if on_snapshot is not None:
                    on_snapshot(position)
                out = []
                for sql in statements:
                    cur.execute(sql)
                    count, total = cur.fetchone()
                    out.append((int(count), int(total)))
            conn.rollback()
        except (psycopg2.Error, OSError) as exc:
            raise translate(exc, self.settings, f"checksumming {table}") from None
        finally:
            conn.close()
        return position, out

    def spark_orders_keys_like_source(self, table: TableId) -> bool:
        columns = self._run(lambda conn: key_columns(conn, table), f"reading {table}")
        return bool(columns) and all(
            spark_orders_like_source(oid, typmod, collation)
            for _, oid, typmod, collation in columns)
