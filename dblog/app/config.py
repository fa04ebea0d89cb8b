"""The pipeline's YAML configuration, validated at load time.

Secrets are never in the file: the source names the environment variable that holds its
password (``password_env``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dblog.app.config_schema import (
    CaptureSection,
    RepairSection,
    TailSection,
    validate_document,
)
from dblog.app.paths import dblog_home
from dblog.core.errors import ConfigError
from dblog.core.events import TableId


@dataclass(frozen=True)
class SourceConfig:
    """Where the source database is and how to log in."""

    name: str
    kind: str
    host: str
    port: int
    user: str
    password_env: str
    server_id: int = 5401
    watermark_database: str = "dblog"
    database: str = ""
    """PostgreSQL: the database to connect to (tables are then ``schema.table``)."""
    slot: str = ""
    """PostgreSQL: the replication slot (default ``dblog_<name>``)."""
    publication: str = ""
    """PostgreSQL: the publication (default ``dblog_<name>``, created and kept by dblog)."""
    secret: str | None = field(default=None, repr=False, compare=False)
    """The password itself, when a caller resolved it (Dagster's ``EnvVar``); else it is
    read from ``password_env`` when needed."""

    @property
    def password(self) -> str:
        if self.secret is not None:
            return self.secret
        try:
            return os.environ[self.password_env]
        except KeyError:
            raise ConfigError(
                f"source {self.name!r}: environment variable {self.password_env} "
                "(its password) is not set"
            ) from None


@dataclass(frozen=True)
class TableConfig:
    """One captured table, its own chunk size and its repair-dump schedule."""

    table: TableId
    chunk_size: int
    repair_cron: str | None = None
    """When to compare mirror and source and capture the ranges that differ (off: None)."""
    repair_capture_all: bool = False
    """A repair captures every range instead of only the differing ones."""


TailConfig = TailSection
"""The ``tail`` settings (defined once, in :mod:`dblog.app.config_schema`)."""
CaptureConfig = CaptureSection
"""The ``capture`` settings."""
RepairConfig = RepairSection
"""The ``repair`` settings (``dblog.app.repair``)."""
TAIL_DEFAULTS = TailConfig()
"""Every ``tail`` setting at its default (the tailer's options take their defaults here)."""
CAPTURE_DEFAULTS = CaptureConfig()
"""Every ``capture`` setting at its default."""


@dataclass(frozen=True)
class PipelineConfig:
    """Everything ``dblog`` and the Dagster definitions need."""

    source: SourceConfig
    tables: tuple[TableConfig, ...]
    lake: str
    """The lake root: an absolute local path, or a URI for Spark's Hadoop filesystems
    (``s3a://bucket/lake``, ``abfss://...``, ``gs://...``, ``hdfs://...``, ``file:///...``)."""
    zookeeper_hosts: str
    zookeeper_root: str = "dblog"
    zookeeper_session_timeout_s: float = 10.0
    """After this long without a heartbeat (a killed or frozen tailer) ZooKeeper ends the
    session: its tailer lock goes to a standing-by tailer."""
    zookeeper_auth_env: str | None = None
    """The environment variable holding ``user:password`` for ZooKeeper digest
    authentication; when set, every node dblog creates is readable and writable by that
    identity only."""

    @property
    def zookeeper_auth(self) -> tuple[str, str] | None:
        """``(user, password)`` from ``zookeeper_auth_env`` (None: no authentication)."""
        if self.zookeeper_auth_env is None:
            return None
        raw = os.environ.get(self.zookeeper_auth_env)
        if raw is None:
            raise ConfigError(f"zookeeper: environment variable {self.zookeeper_auth_env} "
                              "(user:password for ZooKeeper) is not set")
        user, sep, password = raw.partition(":")
        if not sep or not user or not password:
            raise ConfigError(f"zookeeper: {self.zookeeper_auth_env} must be user:password")
        return user, password
    tail: TailConfig = field(default_factory=TailConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    repair: RepairConfig = field(default_factory=RepairConfig)
    spark_master: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    """Extra Spark settings from ``spark.conf`` (never credentials)."""
    spark_jars: tuple[str, ...] = ()
    """Extra local jar files from ``spark.jars``, shipped beside dblog's own."""

    def table(self, name: str | TableId) -> TableConfig:
        wanted = name if isinstance(name, TableId) else TableId.parse(name)
        for tc in self.tables:
            if tc.table == wanted:
                return tc
        known = ", ".join(str(t.table) for t in self.tables)
        raise ConfigError(f"table {wanted} is not in the configuration (configured: {known})")

    @property
    def table_ids(self) -> tuple[TableId, ...]:
        return tuple(t.table for t in self.tables)


def _expand(value: str) -> str:
    return os.path.expandvars(value)


def _lake_root(raw: str, base_dir: Path | None) -> str:
    """An absolute local path, or a URI kept as written (without a trailing ``/``)."""
    from urllib.parse import urlsplit

    from dblog.lake.layout import is_uri

    if not is_uri(raw):
        path = Path(raw)
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        return str(path.resolve())
    parts = urlsplit(raw)
    if parts.password is not None:  # abfss://container@account is no credential
        raise ConfigError("config: lake must not hold credentials (user:secret@ in the URI); "
                          "give them to Spark's filesystem instead (for s3a: an instance "
                          "profile or the AWS_* environment variables)")
    if not parts.netloc and parts.scheme != "file":
        raise ConfigError(f"config: lake {raw!r} names no bucket or host "
                          f"(expected {parts.scheme}://bucket/path)")
    if parts.query or parts.fragment:
        raise ConfigError(f"config: lake {raw!r} must not have a query or fragment")
    # Hadoop's own spelling of the URI (``file:///x`` is ``file:/x``, no doubled ``/``):
    # Delta compares a table's location as text and refuses a second spelling of it.
    within = re.sub("/+", "/", parts.path).rstrip("/")
    return (f"{parts.scheme}://{parts.netloc}{within}" if parts.netloc
            else f"{parts.scheme}:{within}")


def parse_config(data: Any, *, base_dir: Path | None = None) -> PipelineConfig:
    """Validate a parsed YAML document into a :class:`PipelineConfig` (relative lake paths
    from ``base_dir``, the config file's folder)."""
    doc = validate_document(data)
    src = doc.source
    source = SourceConfig(
        name=src.name,
        kind=src.kind,
        host=_expand(src.host),
        port=src.port,
        user=_expand(src.user),
        password_env=src.password_env,
        server_id=src.server_id,
        watermark_database=src.watermark_schema or src.watermark_database or "dblog",
        database=_expand(src.database),
        slot=src.slot,
        publication=src.publication,
    )
    capture = doc.capture
    tables = tuple(
        TableConfig(TableId.parse(entry.name), entry.chunk_size or capture.chunk_size,
                    entry.repair_cron, entry.repair_capture_all)
        for entry in doc.tables)
    lake = _lake_root(_expand(doc.lake if doc.lake is not None
                              else str(dblog_home() / "lake")), base_dir)
    zk = doc.zookeeper
    tail = doc.tail
    if tail.lag_error_s < tail.lag_warn_s:
        raise ConfigError("config: tail.lag_error_s must not be below tail.lag_warn_s")
    return PipelineConfig(
        source=source,
        tables=tables,
        lake=lake,
        zookeeper_hosts=_expand(zk.hosts).replace(
            "${DBLOG_ZK_PORT}", os.environ.get("DBLOG_ZK_PORT", "12181")),
        zookeeper_root=zk.root,
        zookeeper_session_timeout_s=zk.session_timeout_s,
        zookeeper_auth_env=zk.auth_env,
        tail=tail,
        capture=capture,
        repair=doc.repair,
        spark_master=doc.spark.master,
        spark_conf={key: str(value).lower() if isinstance(value, bool) else _expand(str(value))
                    for key, value in doc.spark.conf.items()},
        spark_jars=tuple(_expand(j) for j in doc.spark.jars),
    )


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML config file; ConfigError names what is wrong."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config: {path} is not valid YAML: {exc}".splitlines()[0]) from None
    return parse_config(data, base_dir=path.parent)
