"""Committed transactions from PostgreSQL's WAL: logical replication with ``pgoutput``
through psycopg2's replication connection.

Why ``pgoutput`` rather than wal2json (both were tried on PostgreSQL 15): wal2json writes
NaN and +-Infinity of numeric and float columns as JSON ``null``, indistinguishable from
NULL, so a NaN would reach the lake as NULL without any error; ``pgoutput`` sends every
value in the server's own text form, ships with PostgreSQL (nothing to install), sends
only the tables of its publication, and marks a TOASTed value an update left unchanged.

Positions: every change of a transaction has ``Position(lsn=commit LSN + 1, seq=i)`` (``i``
its index in the transaction, the commit LSN being where its commit record starts); the
transaction's resume point, and so the position a batch commits, is the LSN just after its
commit record (``{"lsn": <int>}``). Both grow in commit order, which is the order logical
decoding sends transactions in, and a transaction's changes lie strictly between the
previous commit's end and its own (the next commit record may start exactly where the
previous one ends, hence the + 1).

The slot keeps the WAL from the position last confirmed (:meth:`PostgresLogReader.confirm`,
called by the tailer with what it has committed and no open window still needs): every
status update the server gets carries exactly that position (:mod:`.libpq`: psycopg2's own
keepalive handling would confirm past it). While the captured tables are idle the reader's
resume follows the server's keepalives, so an idle tailer commits, and then confirms,
positions past WAL written elsewhere (the slot never holds WAL forever). A keepalive moves
the resume only between transactions: its position is the end of the last record the
walsender decoded, so every transaction of the publication that committed before it has
been received, and a transaction still open there commits after it and is sent again from
there.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extras

from dblog.core.errors import (
    ConfigError,
    DblogError,
    LogPurgedError,
    SourceError,
    SourceUnavailable,
)
from dblog.core.events import ChangeEvent, Key, Op, Position, TableId, WatermarkEvent
from dblog.sources.base import (
    Column,
    LogItem,
    SchemaChange,
    TableSchema,
    Transaction,
    UnloggedChange,
)
from dblog.sources.postgres import pgoutput as po
from dblog.sources.postgres import replication as rp
from dblog.sources.postgres.connection import (
    PostgresSettings,
    connect,
    connect_replication,
    translate,
)
from dblog.sources.postgres.libpq import CopyBoth
from dblog.sources.postgres.publication import RESETS_TABLE
from dblog.sources.postgres.schema import refuse_array_keys
from dblog.sources.postgres.types import (
    Converter,
    canonical_type,
    converter,
    source_type_name,
)

WATERMARK_TABLE = "watermark"
RELATION_CHECK_S = 5.0
"""How often the reader has the publication checked for dropped or re-created tables."""
RECONNECT_S = 30.0
"""How long the reader reconnects, from its last commit, after a stream it had was lost
(a server restart, a terminated walsender, a network cut) before it reports the source
unavailable."""


class SlotInUse(SourceError):
    """Another connection streams the slot."""
log = logging.getLogger(__name__)


def native_lsn(native: Mapping[str, Any]) -> int:
    """Validate a ``{"lsn": <int>}`` position."""
    try:
        lsn = native["lsn"]
    except (KeyError, TypeError):
        raise ConfigError(f"PostgreSQL position needs 'lsn': {native!r}") from None
    if not isinstance(lsn, int) or isinstance(lsn, bool) or not 0 <= lsn < 2**63:
        raise ConfigError(f"PostgreSQL position out of range: {native!r}")
    return lsn


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to decode one relation's rows."""

    table: TableId
    schema: TableSchema
    converters: tuple[Converter | None, ...]
    key_index: tuple[int, ...]
    watermark: bool
    resets: bool = False
    """The rows are resets of tables (:mod:`dblog.sources.postgres.publication`)."""
    partial: str | None = None
    """Why the log's old images of this table are incomplete (its REPLICA IDENTITY was
    changed from FULL after dblog started): its updates and deletes are then healed key by
    key instead of written."""
    keyless_old: bool = False
    """REPLICA IDENTITY NOTHING or USING INDEX: the old primary key may not be logged (a
    delete, a key change): the whole table is read again instead."""


KEY_AND_NULLS_SQL = """
SELECT a.attname, a.attnotnull,
       COALESCE((SELECT k.ord FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                 WHERE k.attnum = a.attnum), 0) AS key_at
FROM pg_attribute a
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


class PostgresLogReader:
    """A :class:`dblog.sources.base.LogReader` over one replication slot."""

    def __init__(self, settings: PostgresSettings, start: Mapping[str, Any],
                 tables: Iterable[TableId],
                 check_relations: Callable[[], object] | None = None) -> None:
        self._settings = settings
        self._tracked = frozenset(tables)
        self._watermark = TableId(settings.watermark_schema, WATERMARK_TABLE)
        self._resets = TableId(settings.watermark_schema, RESETS_TABLE)
        self._check_relations = check_relations
        self._next_check = time.monotonic() + RELATION_CHECK_S
        self._boundary = native_lsn(start)
        self._slot_generation = start.get("slot")
        self._conn: Any = None
        self._cur: Any = None
        self._stream: CopyBoth | None = None
        self._catalog: Any = None
        self._plans: dict[int, _Plan | None] = {}
        self._known: dict[TableId, TableSchema] = {}
        self._confirm = 0
        self._sent_confirm = 0
        self._reported_at = 0.0
        self._keepalives_in_transactions = 0
        self._closed = False
        self._streamed = False  # a stream was established once: a loss is worth retrying
        self._lost_at: float | None = None
        self._reset_transaction()

    @property
    def resume(self) -> dict[str, Any]:
        """The position after the last complete transaction read (or skipped while idle)."""
        return self._native(self._boundary)

    def _native(self, lsn: int) -> dict[str, Any]:
        if self._slot_generation is None:
            return {"lsn": lsn}
        return {"lsn": lsn, "slot": self._slot_generation}

    def confirm(self, native: Mapping[str, Any]) -> None:
        """The WAL before ``native`` will never be read again: the slot may release it
        (sent to the server by the next :meth:`read`, the only position it is ever told)."""
        self._confirm = max(self._confirm, native_lsn(native))

    @property
    def keepalives_in_transactions(self) -> int:
        """Keepalives that arrived between a transaction's changes (they move nothing)."""
        return self._keepalives_in_transactions

    def _reset_transaction(self) -> None:
        self._in_txn = False
        self._commit_lsn = 0
        self._ts_ms: int | None = None
        self._items: list[LogItem] = []
        self._touched: dict[TableId, TableSchema] = {}
        self._seq = 0

    # -- connection ---------------------------------------------------------------------

    def _open(self) -> None:
        s = self._settings
        log.info("streaming slot %s from %s", s.slot_name, po.lsn_text(self._boundary))
        self._conn = connect_replication(s)
        self._cur = self._conn.cursor()
        try:
            self._cur.start_replication(
                slot_name=s.slot_name, slot_type=psycopg2.extras.REPLICATION_LOGICAL,
                start_lsn=self._boundary, decode=False,
                options={"proto_version": "1", "publication_names": s.publication_name},
            )
            self._stream = CopyBoth(self._conn)
            self._sent_confirm = 0  # a new walsender: tell it again
            self._streamed = True
        except psycopg2.errors.ObjectInUse as exc:
            self._drop()
            raise SlotInUse(
                f"replication slot {s.slot_name!r} on {s.address} is in use by another "
                f"consumer ({str(exc).strip()}): stop it, or give this source its own "
                "source.slot"
            ) from None
        except psycopg2.errors.UndefinedObject as exc:
            self._drop()
            raise LogPurgedError(
                f"replication slot {s.slot_name!r} on {s.address} is gone ({str(exc).strip()}):"
                " run `dblog tail --from-head`, then `dblog capture` to re-snapshot"
            ) from None

    def _drop(self) -> None:
        for thing in (self._cur, self._conn):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # closing a broken connection
                    pass
        self._conn = self._cur = self._stream = None
        self._reset_transaction()

    def close(self) -> None:
        self._closed = True
        self._drop()
        if self._catalog is not None:
            try:
                self._catalog.close()
            except Exception:  # already broken
                pass
            self._catalog = None

    # -- reading ------------------------------------------------------------------------

    def read(self, *, max_transactions: int, max_wait_s: float) -> list[Transaction]:
        """Up to ``max_transactions`` committed transactions touching the tracked tables or
        the watermark table; returns early once the server has nothing more and something
        was read, otherwise waits at most about ``max_wait_s``."""
        if self._closed:
            raise SourceError("the WAL reader is closed")
        out: list[Transaction] = []
        if max_transactions <= 0:
            return out
        deadline = time.monotonic() + max(0.0, max_wait_s)
        try:
            if self._stream is None:
                self._open()
            stream = self._stream
            assert stream is not None
            interval = self._settings.status_interval_s
            while len(out) < max_transactions:
                now = time.monotonic()
                if self._check_relations is not None and now >= self._next_check:
                    self._check_relations()  # a reset it writes arrives later in the log
                    self._next_check = time.monotonic() + RELATION_CHECK_S
                if self._confirm > self._sent_confirm or now - self._reported_at >= interval:
                    self._report(stream)
                message = stream.receive()
                if message is None:
                    left = deadline - time.monotonic()
                    if out or left <= 0:
                        break
                    select.select([self._conn], [], [], min(left, 0.2))
                    continue
                if message[0] == rp.XLOG_DATA:
                    txn = self._handle(po.parse(message, rp.XLOG_DATA_HEADER))
                    if txn is not None:
                        out.append(txn)
                else:
                    self._on_keepalive(rp.parse_keepalive(message), stream)
        except (SourceUnavailable, SlotInUse) as exc:  # reconnecting (the walsender of
            # the lost stream may still be exiting and hold the slot)
            if self._reconnecting(exc, out, deadline):
                return out
            raise
        except DblogError:
            self._drop()
            raise
        except Exception as exc:  # translated below
            self._drop()
            error = translate(exc, self._settings, "reading the WAL")
            if isinstance(error, SourceUnavailable) and self._reconnecting(error, out,
                                                                           deadline):
                return out
            raise error from exc
        self._lost_at = None
        return out

    def _report(self, stream: CopyBoth) -> None:
        """A status update carrying the confirmed position (and nothing the reader decided
        by itself)."""
        confirmed = self._confirm
        stream.send(rp.standby_status(confirmed=confirmed, now_us=time.time_ns() // 1000))
        self._sent_confirm = confirmed
        self._reported_at = time.monotonic()

    def _on_keepalive(self, keepalive: rp.Keepalive, stream: CopyBoth) -> None:
        """Between transactions the resume moves to the keepalive's position: every
        transaction of the publication that committed before it was received (and one
        open there commits after it). Inside one, nothing moves."""
        if self._in_txn:
            self._keepalives_in_transactions += 1
        elif keepalive.wal_end > self._boundary:
            self._boundary = keepalive.wal_end
        if keepalive.reply_requested:
            self._report(stream)

    def _reconnecting(self, error: DblogError, out: list[Transaction], deadline: float
                      ) -> bool:
        """After a stream was lost: whether to go on (the next :meth:`read` reconnects at
        the last commit; what is complete in ``out`` is delivered), until ``RECONNECT_S``
        of failures in a row."""
        self._drop()
        if not self._streamed:
            return False
        now = time.monotonic()
        if self._lost_at is None:
            self._lost_at = now
        if now - self._lost_at > RECONNECT_S:
            self._lost_at = None
            return False
        log.warning("the WAL stream of slot %s failed after %d transactions (%s); it "
                    "reconnects at %s", self._settings.slot_name, len(out), error,
                    po.lsn_text(self._boundary))
        if not out:
            time.sleep(max(0.05, min(1.0, deadline - now)))
        return True

    # -- messages -----------------------------------------------------------------------

    def _handle(self, msg: po.Message) -> Transaction | None:
        if isinstance(msg, po.Begin):
            self._reset_transaction()
            self._in_txn = True
            self._commit_lsn = msg.final_lsn + 1
            self._ts_ms = (msg.commit_ts_us + po.PG_EPOCH_US) // 1000
            return None
        if isinstance(msg, po.Commit):
            return self._commit(msg)
        if isinstance(msg, po.Relation):
            self._on_relation(msg)
            return None
        if isinstance(msg, po.Insert | po.Update | po.Delete):
            self._on_row(msg)
            return None
        if isinstance(msg, po.Truncate):
            for oid in msg.relations:
                plan = self._plans.get(oid)
                if plan is not None and not plan.watermark and not plan.resets:
                    self._items.append(SchemaChange(plan.table, "TRUNCATE", self._next(), True))
            return None
        return None

    def _next(self) -> Position:
        position = Position(self._commit_lsn, self._seq)
        self._seq += 1
        return position

    def _key_and_nulls(self, oid: int) -> dict[str, tuple[bool, int]]:
        """Per column: NOT NULL, and its place in the primary key (0: not a key column)."""
        if self._catalog is None:
            self._catalog = connect(self._settings)
        try:
            with self._catalog.cursor() as cur:
                cur.execute(KEY_AND_NULLS_SQL, (oid,))
                return {str(r[0]): (bool(r[1]), int(r[2])) for r in cur.fetchall()}
        except psycopg2.Error as exc:
            self._catalog = None
            raise translate(exc, self._settings, "reading a table's key") from None

    def _on_relation(self, msg: po.Relation) -> None:
        table = TableId(msg.namespace, msg.name)
        watermark = table == self._watermark
        if table == self._resets:
            schema = TableSchema(table, tuple(Column(c.name, "STRING") for c in msg.columns),
                                 ())
            self._plans[msg.oid] = _Plan(table, schema, tuple(None for _ in msg.columns), (),
                                         watermark=False, resets=True)
            return
        if not watermark and table not in self._tracked:
            log.info("relation %s (oid %d) is not captured", table, msg.oid)
            self._plans[msg.oid] = None
            return
        facts = self._key_and_nulls(msg.oid)
        columns = []
        converters = []
        for col in msg.columns:
            spark = canonical_type(col.type_oid, col.typmod)
            not_null, _ = facts.get(col.name, (False, 0))
            columns.append(Column(col.name, spark, not not_null,
                                  source_type_name(col.type_oid, col.typmod)))
            converters.append(converter(spark))
        partial = None
        ranked = sorted((at, name) for name, (_, at) in facts.items() if at > 0)
        key = tuple(name for _, name in ranked)
        names = [c.name for c in msg.columns]
        if not watermark:
            if not key:
                raise SourceError(f"table {table} has no primary key: dblog needs one to "
                                  "capture it (add a primary key)")
            if msg.replica_identity != "f":
                # Refused at start (schema.py); changed since, the log holds no full old
                # rows (nor unchanged TOASTed values) until it is FULL again.
                partial = (
                    f"REPLICA IDENTITY of {table} changed to "
                    f"{_IDENTITY.get(msg.replica_identity)}: its updates and deletes carry no "
                    "full old rows, so their keys are read again from the table; run ALTER "
                    f"TABLE {table} REPLICA IDENTITY FULL")
            refuse_array_keys(table, tuple(columns), key)
            missing = [k for k in key if k not in names]
            if missing:
                raise SourceError(f"the log's columns of {table} lack key columns {missing}")
        schema = TableSchema(table, tuple(columns), key)
        previous = self._known.get(table)
        if previous is not None and previous != schema and self._in_txn and not watermark:
            self._items.append(SchemaChange(table, _describe(previous, schema), self._next(),
                                            False, _rewrites(previous, schema)))
        self._known[table] = schema
        self._plans[msg.oid] = _Plan(table, schema, tuple(converters),
                                     tuple(names.index(k) for k in key), watermark,
                                     partial=partial, keyless_old=msg.replica_identity in "ni")

    def _decode(self, plan: _Plan, row: po.Tuple, fill: dict[str, Any] | None
                ) -> dict[str, Any]:
        columns = plan.schema.columns
        if len(row) != len(columns):
            raise SourceError(f"a row of {plan.table} has {len(row)} columns, its relation "
                              f"message {len(columns)}")
        out: dict[str, Any] = {}
        for col, conv, value in zip(columns, plan.converters, row, strict=True):
            if value is po.UNCHANGED_TOAST:
                if fill is None or col.name not in fill:
                    raise SourceError(
                        f"an update of {plan.table} left TOASTed column {col.name!r} unchanged "
                        "and the log has no old value for it: run ALTER TABLE "
                        f"{plan.table} REPLICA IDENTITY FULL")
                out[col.name] = fill[col.name]
                continue
            if value is not None and conv is not None:
                try:
                    value = conv(str(value))
                except SourceError as exc:
                    raise SourceError(f"{plan.table} column {col.name!r}: {exc}") from None
                except ValueError:
                    raise SourceError(f"{plan.table} column {col.name!r}: cannot read "
                                      f"{value!r} as {col.spark_type}") from None
            out[col.name] = value
        return out

    def _on_row(self, msg: po.Insert | po.Update | po.Delete) -> None:
        plan = self._plans.get(msg.relation)
        if plan is None:
            if msg.relation not in self._plans:
                raise SourceError(f"a row of relation {msg.relation} came before its "
                                  "relation message")
            return
        if plan.resets:
            self._on_reset(plan, msg)
            return
        if plan.watermark:
            if isinstance(msg, po.Delete):
                return
            row = self._decode(plan, msg.new, None)
            value = row.get("value")
            if value is not None:
                self._items.append(WatermarkEvent(str(value), self._next(), self._ts_ms))
            return
        table = plan.table
        self._touched[table] = plan.schema
        ts = self._ts_ms
        if isinstance(msg, po.Insert):
            after = self._decode(plan, msg.new, None)
            key = tuple(after[k] for k in plan.schema.key)
            self._items.append(ChangeEvent(table, Op.CREATE, key, self._next(), None, after, ts))
            return
        if plan.partial is not None:
            self._heal_keys(plan, msg)
            return
        if isinstance(msg, po.Delete):
            if msg.old_is_key:
                raise SourceError(f"a delete of {table} carries only its key: run ALTER TABLE "
                                  f"{table} REPLICA IDENTITY FULL")
            before = self._decode(plan, msg.old, None)
            key = tuple(before[k] for k in plan.schema.key)
            self._items.append(ChangeEvent(table, Op.DELETE, key, self._next(), before, None, ts))
            return
        if msg.old is None or msg.old_is_key:
            raise SourceError(f"an update of {table} carries no full old row: run ALTER TABLE "
                              f"{table} REPLICA IDENTITY FULL")
        before = self._decode(plan, msg.old, None)
        after = self._decode(plan, msg.new, before)
        old_key = tuple(before[k] for k in plan.schema.key)
        new_key = tuple(after[k] for k in plan.schema.key)
        if old_key == new_key:
            self._items.append(ChangeEvent(table, Op.UPDATE, new_key, self._next(), before,
                                           after, ts))
        else:
            self._items.append(ChangeEvent(table, Op.DELETE, old_key, self._next(), before,
                                           None, ts))
            self._items.append(ChangeEvent(table, Op.CREATE, new_key, self._next(), None,
                                           after, ts))

    def _heal_keys(self, plan: _Plan, msg: po.Update | po.Delete) -> None:
        """An update or delete without a full old row. A delete's key is all it needs: it
        is written as a delete (its before image holds NULL in the columns the log lacks).
        An update's new row may lack unchanged TOASTed values: its key is read again from
        the table (an unlogged change, healed), and an update that moved its key deletes
        the old one. Without the old key (REPLICA IDENTITY NOTHING or USING INDEX), the
        whole table is read again."""
        assert plan.partial is not None
        table, ts = plan.table, self._ts_ms
        if plan.keyless_old:
            self._items.append(UnloggedChange(table, self._next(), plan.partial))
            return
        new_key = None if isinstance(msg, po.Delete) else self._keyed(plan, msg.new)[1]
        if msg.old is not None:
            before, old_key = self._keyed(plan, msg.old)
            if old_key != new_key:
                self._items.append(ChangeEvent(table, Op.DELETE, old_key, self._next(),
                                               before, None, ts))
        if new_key is not None:
            self._items.append(UnloggedChange(table, self._next(), plan.partial, (new_key,)))

    def _keyed(self, plan: _Plan, row: po.Tuple) -> tuple[dict[str, Any], Key]:
        """A partial row (its unchanged TOASTed values, or all but its key, unknown: NULL)
        and its key, which must be in it."""
        unknown = dict.fromkeys(c.name for c in plan.schema.columns)
        values = self._decode(plan, row, unknown)
        key = tuple(values[k] for k in plan.schema.key)
        missing = [k for k, v in zip(plan.schema.key, key, strict=True) if v is None]
        if missing:
            raise SourceError(f"a change of {plan.table} has no value for its key columns "
                              f"{missing} in the log: run ALTER TABLE {plan.table} REPLICA "
                              "IDENTITY FULL, then `dblog capture` the table")
        return values, key

    def _on_reset(self, plan: _Plan, msg: po.Insert | po.Update | po.Delete) -> None:
        """A configured table's relation changed: its lake table is emptied here and a
        capture is advised (the rows written before this point are in no log)."""
        if not isinstance(msg, po.Insert):
            return
        row = self._decode(plan, msg.new, None)
        table = TableId(str(row["schema_name"]), str(row["table_name"]))
        if row.get("publication") != self._settings.publication_name or \
                table not in self._tracked:
            return
        reason = str(row["reason"])
        if row.get("kind") == "heal":  # its rows changed without logical changes
            self._items.append(UnloggedChange(table, self._next(), reason))
            return
        self._known.pop(table, None)
        self._items.append(SchemaChange(table, reason, self._next(), resets_rows=True))
        self._items.append(SchemaChange(table, reason, self._next(), rewrites_rows=True))

    def _commit(self, msg: po.Commit) -> Transaction | None:
        items, touched, ts = self._items, self._touched, self._ts_ms
        self._reset_transaction()
        self._boundary = max(self._boundary, msg.end_lsn)
        if not items:
            return None
        return Transaction(items=tuple(items), resume=self._native(msg.end_lsn),
                           position=Position(msg.end_lsn), commit_ts_ms=ts, schemas=touched)


_IDENTITY = {"d": "DEFAULT without a full row", "n": "NOTHING", "i": "USING INDEX", "f": "FULL"}


def _describe(old: TableSchema, new: TableSchema) -> str:
    """A statement-like account of a definition change seen in the log."""
    before = {c.name: c.source_type for c in old.columns}
    after = {c.name: c.source_type for c in new.columns}
    parts = [f"ADD COLUMN {n} {t}" for n, t in after.items() if n not in before]
    parts += [f"DROP COLUMN {n}" for n in before if n not in after]
    parts += [f"ALTER COLUMN {n} TYPE {t}" for n, t in after.items()
              if n in before and before[n] != t]
    return f"ALTER TABLE {new.table} " + ", ".join(parts or ["(definition changed)"])


def _rewrites(old: TableSchema, new: TableSchema) -> bool:
    """Never from the relation message alone: a column added with a default that existing
    rows take, and a type change that rewrites the table, move the table's shape, which the
    publication check turns into a heal (:mod:`dblog.sources.postgres.publication`); an
    added nullable column without a default, or a type change that keeps the stored bytes
    (``varchar(10)`` to ``varchar(20)``), leaves every value as it was."""
    del old, new
    return False
