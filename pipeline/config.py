"""The pipeline's YAML configuration, validated at load time.

Secrets are never in the file: the source names the environment variable that holds its
password (``password_env``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError
from pipeline.events import TableId
from pipeline.paths import dblog_home


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


@dataclass(frozen=True)
class TailConfig:
    batch_max_events: int = 100_000
    batch_max_seconds: float = 2.0
    poll_seconds: float = 0.5
    window_expiry_s: float = 1800.0
    maintain_every_s: float = 3600.0
    mirror_every_s: float = 10.0
    """The mirror merges the changelog's new batches at least this often (see the README)."""
    mirror_every_s_behind: float = 60.0
    """...or this often (if longer) while the tailer is behind the log..."""
    mirror_every_s_capturing: float = 60.0
    """...or this often (if longer) while a capture's chunk window is open."""
    lag_warn_s: float = 60.0
    """The tail-lag asset check warns above this many seconds behind the source..."""
    lag_error_s: float = 600.0
    """...and fails (severity ERROR) above this many."""


@dataclass(frozen=True)
class CaptureConfig:
    chunk_size: int = 100_000
    chunk_max_rows: int = 500_000
    chunk_target_seconds: float = 15.0
    max_in_flight: int = 4
    range_rows: int = 100000
    read_partitions: int = 1
    """A large chunk is read by this many selects at once, each over its own key range. One
    by default: on two cores four bought ~4% of capture speed (64.7k vs 62.1k rows/s) and
    raised the source's commit p99 under a capture (`bench_impact`, pinned) 2.60x -> 3.68x;
    raise it where Spark has cores to spare and the source has headroom."""
    read_partition_rows: int = 50_000
    """...each of at least this many rows (smaller chunks are read by fewer selects)."""
    max_rows_per_s: float | None = None
    """At most this many rows a second read from the source by one capture process (None:
    as fast as it goes), in chunks of at most ``chunk_target_seconds`` of them: spares a
    source whose application must not feel the capture (`bench_impact`)."""


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

    from pipeline.lake.layout import is_uri

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


def _require(data: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in data:
        raise ConfigError(f"config: {where}.{key} is missing")
    value = data[key]
    if kind is int and isinstance(value, str):
        try:
            value = int(_expand(value))
        except ValueError:
            raise ConfigError(f"config: {where}.{key} must be a whole number") from None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ConfigError(f"config: {where}.{key} must be {kind.__name__}, got {value!r}")
    return value


def _not_negative(value: Any, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"config: {where} must be a number of seconds (0: off), "
                          f"got {value!r}")
    return float(value)


def _env_name(value: Any, where: str) -> str | None:
    """An environment variable's name (None when absent); never a secret itself."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.replace("_", "a").isalnum() or \
            value[0].isdigit():
        raise ConfigError(f"config: {where} must name an environment variable "
                          "(letters, digits, _), not hold a secret")
    return value


def _positive(value: Any, where: str, kind: type = int) -> Any:
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"config: {where} must be a positive number, got {value!r}")
    return kind(value)


def _section(data: Mapping[str, Any], name: str, known: set[str]) -> Mapping[str, Any]:
    """The mapping under ``name`` (empty when absent); a key it does not know (a typo)
    is refused rather than silently left at its default."""
    section = data.get(name) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"config: {name} must be a mapping")
    unknown = set(section) - known
    if unknown:
        raise ConfigError(f"config: unknown {name} keys: {', '.join(sorted(map(str, unknown)))}"
                          f" (known: {', '.join(sorted(known))})")
    return section


def parse_config(data: Any, *, base_dir: Path | None = None) -> PipelineConfig:
    """Validate a parsed YAML document into a :class:`PipelineConfig`."""
    if not isinstance(data, Mapping):
        raise ConfigError("config: the top level must be a mapping")
    unknown = set(data) - {"source", "tables", "lake", "zookeeper", "tail", "capture", "spark"}
    if unknown:
        raise ConfigError(f"config: unknown top-level keys: {', '.join(sorted(unknown))}")
    src = data.get("source")
    if not isinstance(src, Mapping):
        raise ConfigError("config: source must be a mapping")
    kind = _require(src, "kind", "source", str)
    if kind not in ("mariadb", "mysql", "postgres"):
        raise ConfigError(f"config: source.kind {kind!r} is not supported "
                          "(mariadb, mysql, postgres)")
    known_source = {"name", "kind", "host", "port", "user", "password_env", "server_id",
                    "watermark_database"}
    if kind == "postgres":
        known_source |= {"database", "slot", "publication", "watermark_schema"}
        if not isinstance(src.get("database"), str) or not src.get("database"):
            raise ConfigError("config: source.database (the PostgreSQL database) is missing")
    unknown_source = set(src) - known_source
    if unknown_source:
        raise ConfigError(f"config: source: unknown keys for kind {kind!r}: "
                          f"{', '.join(sorted(map(str, unknown_source)))}")
    source = SourceConfig(
        name=_require(src, "name", "source", str),
        kind=kind,
        host=_expand(_require(src, "host", "source", str)),
        port=_require(src, "port", "source", int),
        user=_expand(_require(src, "user", "source", str)),
        password_env=_require(src, "password_env", "source", str),
        server_id=int(src.get("server_id", 5401)),
        watermark_database=str(src.get("watermark_schema",
                                        src.get("watermark_database", "dblog"))),
        database=_expand(str(src.get("database", ""))),
        slot=str(src.get("slot", "")),
        publication=str(src.get("publication", "")),
    )
    if not source.name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"config: source.name {source.name!r}: use letters, digits, - and _")
    capture_data = _section(data, "capture", {f.name for f in fields(CaptureConfig)})
    default = CaptureConfig()
    capture = CaptureConfig(
        chunk_size=_positive(capture_data.get("chunk_size", default.chunk_size),
                             "capture.chunk_size"),
        chunk_max_rows=_positive(capture_data.get("chunk_max_rows", default.chunk_max_rows),
                                 "capture.chunk_max_rows"),
        chunk_target_seconds=_positive(
            capture_data.get("chunk_target_seconds", default.chunk_target_seconds),
            "capture.chunk_target_seconds", float),
        max_in_flight=_positive(capture_data.get("max_in_flight", default.max_in_flight),
                                "capture.max_in_flight"),
        range_rows=_positive(capture_data.get("range_rows", default.range_rows),
                             "capture.range_rows"),
        read_partitions=_positive(capture_data.get("read_partitions", default.read_partitions),
                                  "capture.read_partitions"),
        read_partition_rows=_positive(
            capture_data.get("read_partition_rows", default.read_partition_rows),
            "capture.read_partition_rows"),
        max_rows_per_s=None if capture_data.get("max_rows_per_s") is None else _positive(
            capture_data["max_rows_per_s"], "capture.max_rows_per_s", float),
    )
    raw_tables = data.get("tables")
    if not isinstance(raw_tables, list) or not raw_tables:
        raise ConfigError("config: tables must be a non-empty list of DATABASE.TABLE")
    tables: list[TableConfig] = []
    for i, entry in enumerate(raw_tables):
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise ConfigError(f"config: tables[{i}] must be DATABASE.TABLE or {{name: ...}}")
        try:
            tid = TableId.parse(str(entry["name"]))
        except ValueError as exc:
            raise ConfigError(f"config: tables[{i}]: {exc}") from None
        size = _positive(entry.get("chunk_size", capture.chunk_size), f"tables[{i}].chunk_size")
        unknown_keys = set(entry) - {"name", "chunk_size", "repair_cron", "repair_capture_all"}
        if unknown_keys:
            raise ConfigError(f"config: tables[{i}]: unknown keys: "
                              f"{', '.join(sorted(map(str, unknown_keys)))}")
        cron = entry.get("repair_cron")
        if cron is not None and (not isinstance(cron, str) or len(cron.split()) != 5):
            raise ConfigError(f"config: tables[{i}].repair_cron must be a 5-field cron "
                              f"expression, got {cron!r}")
        capture_all = entry.get("repair_capture_all", False)
        if not isinstance(capture_all, bool):
            raise ConfigError(f"config: tables[{i}].repair_capture_all must be true or false")
        tables.append(TableConfig(tid, size, cron, capture_all))
    if len({t.table for t in tables}) != len(tables):
        raise ConfigError("config: a table is listed twice")
    lake_raw = data.get("lake", str(dblog_home() / "lake"))
    if not isinstance(lake_raw, str):
        raise ConfigError("config: lake must be a path")
    lake = _lake_root(_expand(lake_raw), base_dir)
    zk = _section(data, "zookeeper", {"hosts", "root", "session_timeout_s", "auth_env"})
    session_timeout = _positive(zk.get("session_timeout_s", 10.0),
                                "zookeeper.session_timeout_s", float)
    if not 2.0 <= session_timeout <= 120.0:
        raise ConfigError("config: zookeeper.session_timeout_s must be between 2 and 120")
    tail_data = _section(data, "tail", {f.name for f in fields(TailConfig)})
    tail = TailConfig(
        batch_max_events=_positive(tail_data.get("batch_max_events", 100_000),
                                   "tail.batch_max_events"),
        batch_max_seconds=_positive(tail_data.get("batch_max_seconds", 2.0),
                                    "tail.batch_max_seconds", float),
        poll_seconds=_positive(tail_data.get("poll_seconds", 0.5), "tail.poll_seconds", float),
        window_expiry_s=_positive(tail_data.get("window_expiry_s", 1800.0),
                                  "tail.window_expiry_s", float),
        maintain_every_s=_not_negative(tail_data.get("maintain_every_s", 3600.0),
                                       "tail.maintain_every_s"),
        mirror_every_s=_not_negative(tail_data.get("mirror_every_s", 10.0),
                                     "tail.mirror_every_s"),
        mirror_every_s_behind=_not_negative(tail_data.get("mirror_every_s_behind", 60.0),
                                            "tail.mirror_every_s_behind"),
        mirror_every_s_capturing=_not_negative(tail_data.get("mirror_every_s_capturing", 60.0),
                                               "tail.mirror_every_s_capturing"),
        lag_warn_s=_positive(tail_data.get("lag_warn_s", 60.0), "tail.lag_warn_s", float),
        lag_error_s=_positive(tail_data.get("lag_error_s", 600.0), "tail.lag_error_s", float),
    )
    if tail.lag_error_s < tail.lag_warn_s:
        raise ConfigError("config: tail.lag_error_s must not be below tail.lag_warn_s")
    spark = _section(data, "spark", {"master", "conf", "jars"})
    return PipelineConfig(
        source=source,
        tables=tuple(tables),
        lake=lake,
        zookeeper_hosts=_expand(str(zk.get("hosts", "127.0.0.1:${DBLOG_ZK_PORT}"))).replace(
            "${DBLOG_ZK_PORT}", os.environ.get("DBLOG_ZK_PORT", "12181")
        ),
        zookeeper_root=str(zk.get("root", "dblog")),
        zookeeper_session_timeout_s=session_timeout,
        zookeeper_auth_env=_env_name(zk.get("auth_env"), "zookeeper.auth_env"),
        tail=tail,
        capture=capture,
        **_spark_settings(spark),
    )


_SECRET_CONF = ("secret", "password", "access.key", "session.token", "sas.token",
                "credential")


def _spark_settings(spark: Mapping[str, Any]) -> dict[str, Any]:
    """``spark: {master, conf, jars}``: where Spark runs, extra settings (for example the
    lake's filesystem and LogStore) and extra local jars (for example hadoop-aws)."""
    master = spark.get("master")
    if master is not None and not isinstance(master, str):
        raise ConfigError("config: spark.master must be a string (spark://host:7077, yarn, ...)")
    conf = spark.get("conf") or {}
    if not isinstance(conf, Mapping):
        raise ConfigError("config: spark.conf must be a mapping of Spark settings")
    settings: dict[str, str] = {}
    for key, value in conf.items():
        if not isinstance(key, str) or not key.startswith("spark."):
            raise ConfigError(f"config: spark.conf key {key!r} is not a Spark setting "
                              "(spark.*; Hadoop settings are spark.hadoop.*)")
        if any(word in key.lower() for word in _SECRET_CONF):
            raise ConfigError(f"config: spark.conf must hold no credentials ({key}): give "
                              "them to the filesystem through its environment or instance "
                              "credentials (for s3a: AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or an instance profile)")
        if isinstance(value, (Mapping, list)) or value is None:
            raise ConfigError(f"config: spark.conf {key} must be a single value")
        settings[key] = str(value).lower() if isinstance(value, bool) else _expand(str(value))
    jars = spark.get("jars") or []
    if not isinstance(jars, list) or not all(isinstance(j, str) for j in jars):
        raise ConfigError("config: spark.jars must be a list of jar file paths")
    return {"spark_master": master, "spark_conf": settings,
            "spark_jars": tuple(_expand(j) for j in jars)}


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
