"""Builds the engine's parts from a :class:`PipelineConfig` (CLI, Dagster and tests share it)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from dblog.app.config import PipelineConfig, TailConfig
from dblog.capture import CaptureOptions, Capturer
from dblog.capture.throttle import RowRate
from dblog.core.errors import ConfigError, DblogError
from dblog.core.events import TableId
from dblog.core.outage import ride_out
from dblog.lake.layout import LakeLayout
from dblog.state import StateStore, StateUnavailable
from dblog.tail import MIRROR_DOC, Tailer, TailOptions
from dblog.tail.heal import Healer

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dblog.lake.sink import DeltaSink
    from dblog.sources.base import SourceDialect


def make_dialect(config: PipelineConfig) -> SourceDialect:
    """The source dialect the config names."""
    src = config.source
    if src.kind in ("mariadb", "mysql"):
        from dblog.sources.mysql import MySqlDialect, MySqlSettings

        return MySqlDialect(MySqlSettings(
            name=src.name, host=src.host, port=src.port, user=src.user,
            password=src.password, server_id=src.server_id,
            watermark_database=src.watermark_database,
        ))
    if src.kind == "postgres":
        from dblog.sources.postgres import PostgresDialect, PostgresSettings

        return PostgresDialect(PostgresSettings(
            name=src.name, host=src.host, port=src.port, user=src.user,
            database=src.database, password=src.password, tables=config.table_ids,
            watermark_schema=src.watermark_database, slot=src.slot,
            publication=src.publication,
        ))
    raise ConfigError(f"source kind {src.kind!r} is not supported")


def identifier() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _shared_settings(settings: Any, options: type[Any]) -> dict[str, Any]:
    """The values of ``settings`` (a config section) for every field ``options`` (the
    component's options dataclass) has by the same name."""
    names = set(type(settings).model_fields) & {f.name for f in fields(options)}
    return {name: getattr(settings, name) for name in sorted(names)}


def tail_options(tail: TailConfig) -> TailOptions:
    """The tailer's options from the configuration's ``tail`` section: every setting the
    two share by name (the lag levels are the asset checks' own)."""
    return TailOptions(**_shared_settings(tail, TailOptions))


def capture_options(config: PipelineConfig) -> CaptureOptions:
    """A capture's options from the configuration's ``capture`` section (every setting the
    two share by name; ``range_rows`` is the Dagster partitions' own) and each table's
    first chunk size."""
    return CaptureOptions(**_shared_settings(config.capture, CaptureOptions),
                          chunk_sizes={t.table: t.chunk_size for t in config.tables})


@dataclass
class Runtime:
    """A connected source and state store; Spark and the lake writer start on first use."""

    config: PipelineConfig
    dialect: SourceDialect
    state: StateStore
    _spark: SparkSession | None = None
    _sink: DeltaSink | None = None
    spark_factory: Callable[[], SparkSession] | None = None
    """Builds the session on first use (Dagster's PySpark resource); default: our own."""
    _read_rate: RowRate | None = None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            if self.spark_factory is not None:
                self._spark = self.spark_factory()
            else:
                from dblog.app.spark import build_spark_session

                self._spark = build_spark_session(
                    master=self.config.spark_master, extra=self.config.spark_conf,
                    jars=self.config.spark_jars)
        return self._spark

    @property
    def sink(self) -> DeltaSink:
        if self._sink is None:
            from dblog.lake.sink import DeltaSink

            self._sink = DeltaSink(self.spark, self.layout)
        return self._sink

    @property
    def layout(self) -> LakeLayout:
        return LakeLayout(self.config.lake, self.config.source.name)

    def tailer(self, tables: Sequence[TableId] | None = None, **kwargs: object) -> Tailer:
        """The source's tailer (of ``tables``, default every configured table); with
        ``tail.heal: capture`` its leading runs heal rows changed without row events."""
        options = tail_options(self.config.tail)
        chosen = self.config.table_ids if tables is None else tuple(tables)
        healer = (partial(Healer, self.state, self.capturer, chosen)
                  if self.config.tail.heal == "capture" else None)
        return Tailer(dialect=self.dialect, state=self.state, sink=self.sink,
                      tables=chosen, options=options, healer=healer,
                      identifier=identifier(), **kwargs)  # type: ignore[arg-type]

    def capturer(self) -> Capturer:
        cap = self.config.capture
        options = capture_options(self.config)
        if cap.max_rows_per_s is not None and self._read_rate is None:
            self._read_rate = RowRate(cap.max_rows_per_s)
        return Capturer(dialect=self.dialect, state=self.state, sink=self.sink,
                        spark=self.spark, options=options, read_rate=self._read_rate)

    def wait_started(self, check: Callable[[], None], timeout: float = 120) -> None:
        """Wait until a tailer stored its first position; ``check`` raises if it died."""
        self._wait_until(lambda: self.state.get_position() is not None, check, timeout,
                         "the tailer did not start")

    def wait_caught_up(self, check: Callable[[], None], timeout: float = 240, *,
                       mirrors: bool = True) -> None:
        """Wait until the committed position reaches the source's head as of now (and the
        mirrors are merged that far, unless ``mirrors`` is False)."""
        self.wait_for_position(self.dialect.head_position(), check, timeout,
                               "the tailer did not catch up with the log", mirrors=mirrors)

    def wait_for_position(self, native: Mapping[str, Any], check: Callable[[], None],
                          timeout: float, failure: str, *, mirrors: bool = True) -> None:
        """Wait until the tailer committed at or past ``native`` (a source log position)
        and, unless ``mirrors`` is False, merged the mirrors that far."""
        target = self.dialect.to_position(native)

        def reached() -> bool:
            pos = self.state.get_position()
            if pos is None or self.dialect.to_position(pos.value.source_position) < target:
                return False
            if not mirrors:
                return True
            mirror = self.state.get(MIRROR_DOC)
            return (mirror is not None
                    and self.dialect.to_position(mirror.value["source_position"]) >= target)

        self._wait_until(reached, check, timeout, failure)

    @staticmethod
    def _wait_until(done: Callable[[], bool], check: Callable[[], None], timeout: float,
                    failure: str) -> None:
        # A ZooKeeper outage shorter than the timeout is waited out: this only reads.
        deadline = time.monotonic() + timeout
        outage: StateUnavailable | None = None
        while True:
            try:
                if done():
                    return
                outage = None
            except StateUnavailable as exc:
                outage = exc
            check()
            if time.monotonic() >= deadline:
                during = f" (last: {outage})" if outage is not None else ""
                raise DblogError(f"{failure} within {timeout:.0f}s{during}")
            time.sleep(0.1 if outage is None else 1.0)

    def close(self) -> None:
        self.state.close()
        self.dialect.close()


T = TypeVar("T")
STARTUP_OUTAGE_S = 120.0
"""How long a source that answered at start-up and then went away (a restart) is waited for
while the start-up reads the tables' schemas."""
_UNREACHABLE = "check that the service runs and the config's host and port"


def _patiently(call: Callable[[], T], patience_s: float) -> T:
    """``call()``; with a patience, called again while its service cannot be reached."""
    if patience_s <= 0:
        return call()
    return ride_out(call, patience_s=patience_s, what=_UNREACHABLE)


def _read_schemas(dialect: SourceDialect, config: PipelineConfig) -> None:
    dialect.ensure_watermark_table()
    for table in config.table_ids:
        dialect.table_schema(table)


@contextmanager
def open_runtime(
    config: PipelineConfig, *, spark: SparkSession | None = None, validate: bool = True,
    spark_factory: Callable[[], SparkSession] | None = None, patience_s: float = 0.0,
) -> Iterator[Runtime]:
    """Connect the source and ZooKeeper; closes connections (not Spark) on exit.

    ``patience_s``: how long a first contact with a service that cannot be reached is tried
    again (services still starting); 0 fails at once (a wrong host or port says so without
    a wait). Once the source answered, an outage during the rest of the start-up (it
    restarting) is ridden out like one later on."""
    dialect = make_dialect(config)
    try:
        if validate:
            _patiently(dialect.validate, patience_s)
            ride_out(partial(_read_schemas, dialect, config), patience_s=STARTUP_OUTAGE_S,
                     what=_UNREACHABLE)
        state = _patiently(partial(StateStore.connect, config.zookeeper_hosts,
                                   config.source.name, chroot=config.zookeeper_root,
                                   timeout=config.zookeeper_session_timeout_s,
                                   auth=config.zookeeper_auth), patience_s)
    except BaseException:
        dialect.close()
        raise
    try:
        yield Runtime(config, dialect, state, spark, spark_factory=spark_factory)
    finally:
        state.close()
        dialect.close()
