"""The YAML configuration's schema, validated by pydantic (:func:`validate_document`).

Every section refuses keys it does not know (a typo would otherwise leave a setting at its
default), numbers are not taken from booleans or text (but for ``source.port`` and
``source.server_id``, which may come from ``${ENV}``), and every problem is reported at
once with its place in the document: ``capture.chunk_size must be a positive number, got 0``.
:mod:`dblog.app.config` turns the validated document into its frozen settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from dblog.core.errors import ConfigError
from dblog.core.events import TableId

__all__ = ["CaptureSection", "ConfigDocument", "RepairSection", "TailSection",
           "validate_document"]

Positive = Annotated[int, Strict(), Field(gt=0)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0)]
SecondsOrOff = Annotated[float, Strict(), Field(ge=0)]
"""A number of seconds; 0 turns the thing off."""


def _whole_number(value: Any) -> Any:
    """Text (``${ENV}`` expanded) as a whole number; anything else as it is."""
    if isinstance(value, str):
        try:
            return int(os.path.expandvars(value))
        except ValueError:
            raise ValueError(f"must be a whole number, got {value!r}") from None
    return value


WholeNumberOrEnv = Annotated[int, Strict(), BeforeValidator(_whole_number)]
Text = Annotated[str, Strict()]


def _env_name(value: str | None) -> str | None:
    """An environment variable's name; never a secret itself."""
    if value is not None and (not value.replace("_", "a").isalnum() or value[0].isdigit()):
        raise ValueError("must name an environment variable (letters, digits, _), "
                         "not hold a secret")
    return value


class _Section(BaseModel):
    """A mapping of the document: unknown keys are refused with the ones it knows."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @classmethod
    def known_keys(cls, data: Mapping[str, Any]) -> tuple[set[str], str]:
        """The keys ``data`` may have, and what they depend on (text for the error)."""
        return set(cls.model_fields), ""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            known, depending = cls.known_keys(data)
            unknown = {str(k) for k in data} - known
            if unknown:
                raise ValueError(f"unknown keys{depending}: {', '.join(sorted(unknown))} "
                                 f"(known: {', '.join(sorted(known))})")
        return data


_POSTGRES_ONLY = {"database", "slot", "publication", "watermark_schema"}


class SourceSection(_Section):
    """``source``: the database whose tables are captured and whose log is tailed."""

    name: Text
    """The source's name: its ZooKeeper state, lake folder and Dagster asset prefix (letters,
    digits, ``-`` and ``_``)."""
    kind: Literal["mariadb", "mysql", "postgres"]
    """The database: MariaDB/MySQL (ROW binlog, full row images) or PostgreSQL (logical
    replication, pgoutput)."""
    host: Text
    """Where the database listens."""
    port: WholeNumberOrEnv
    """Its port (a number, or ``${ENV}``)."""
    user: Text
    """The user dblog logs in as (docs/sources.md lists the privileges it needs)."""
    password_env: Text
    """The environment variable holding that user's password (never the password)."""
    server_id: WholeNumberOrEnv = 5401
    """MariaDB/MySQL: the replica server id the binlog reader uses (unique among the
    server's replicas)."""
    watermark_database: Text | None = None
    """MariaDB/MySQL: the database of dblog's watermark table (default ``dblog``)."""
    database: Text = ""
    """PostgreSQL only: the database to connect to (tables are then ``schema.table``)."""
    slot: Text = ""
    """PostgreSQL only: the replication slot (default ``dblog_<name>``)."""
    publication: Text = ""
    """PostgreSQL only: the publication, created and kept by dblog (default
    ``dblog_<name>``)."""
    watermark_schema: Text | None = None
    """PostgreSQL only: the schema of dblog's watermark table (default ``dblog``)."""

    @classmethod
    def known_keys(cls, data: Mapping[str, Any]) -> tuple[set[str], str]:
        keys, kind = set(cls.model_fields), data.get("kind")
        return (keys if kind == "postgres" else keys - _POSTGRES_ONLY,
                f" for kind {kind!r}" if kind in ("mariadb", "mysql", "postgres") else "")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{name!r}: use letters, digits, - and _")
        return name

    @field_validator("password_env")
    @classmethod
    def _password_env(cls, name: str) -> str:
        return _env_name(name) or name

    @model_validator(mode="after")
    def _postgres_database(self) -> SourceSection:
        if self.kind == "postgres" and not self.database:
            raise ValueError("source.database (the PostgreSQL database) is missing")
        return self


class TableEntry(_Section):
    """``tables``: each a ``DATABASE.TABLE`` (PostgreSQL: ``SCHEMA.TABLE``) or a mapping."""

    name: Text
    """The table, ``DATABASE.TABLE``; it needs a primary key."""
    chunk_size: Positive | None = None
    """Rows of the table's first chunk (default ``capture.chunk_size``)."""
    repair_cron: Text | None = None
    """When to compare mirror and source and capture the ranges that differ (a 5-field
    cron expression; null: no schedule)."""
    repair_capture_all: Annotated[bool, Strict()] = False
    """A scheduled repair captures every range instead of only the differing ones."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @field_validator("name")
    @classmethod
    def _table_name(cls, name: str) -> str:
        TableId.parse(name)  # ValueError: expected DATABASE.TABLE
        return name

    @field_validator("repair_cron")
    @classmethod
    def _five_fields(cls, cron: str | None) -> str | None:
        if cron is not None and len(cron.split()) != 5:
            raise ValueError(f"must be a 5-field cron expression, got {cron!r}")
        return cron


class ZookeeperSection(_Section):
    """``zookeeper``: where positions, capture progress and the tailer lock live."""

    hosts: Text = "127.0.0.1:${DBLOG_ZK_PORT}"
    """The ensemble, ``host:port,host:port``."""
    root: Text = "dblog"
    """The folder (chroot) of dblog's nodes; each source has its own below it."""
    session_timeout_s: PositiveFloat = 10.0
    """After this long without a heartbeat (a killed or frozen tailer) ZooKeeper ends the
    session: its tailer lock goes to a standing-by tailer (2 to 120 seconds)."""
    auth_env: Text | None = None
    """The environment variable holding ``user:password`` for ZooKeeper digest
    authentication; when set, every node dblog creates is readable and writable by that
    identity only."""

    @field_validator("session_timeout_s")
    @classmethod
    def _session_timeout(cls, seconds: float) -> float:
        if not 2.0 <= seconds <= 120.0:
            raise ValueError(f"must be between 2 and 120 seconds, got {seconds:g}")
        return seconds

    @field_validator("auth_env")
    @classmethod
    def _auth_env(cls, name: str | None) -> str | None:
        return _env_name(name)


class _Settings(_Section):
    """A section of settings with defaults: one left out, or null, keeps its default. Each
    setting is defined here once (type, bound, default, docstring): the engine's options
    and ``docs/configuration.md`` (:mod:`dblog.app.config_docs`) are derived from it."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data


class TailSection(_Settings):
    """``tail``: how the tailer batches the log and keeps the mirror."""

    batch_max_events: Positive = 100_000
    """A micro-batch closes at this many log events..."""
    batch_max_seconds: PositiveFloat = 2.0
    """...or once its first change has waited this long (seconds)."""
    poll_seconds: PositiveFloat = 0.5
    """How long the tailer waits for the log between reads when it is idle (seconds)."""
    window_expiry_s: PositiveFloat = 1800.0
    """A registered chunk window whose high watermark is not seen within this many seconds
    of its registration is aborted (its capture selects the chunk again)."""
    maintain_every_s: SecondsOrOff = 3600.0
    """How often the tailer compacts the lake tables it writes (0: never; ``dblog
    maintain`` does it by hand)."""
    mirror_every_s: SecondsOrOff = 10.0
    """The mirror merges the changelog's new batches at least this often
    (docs/design.md)..."""
    mirror_every_s_behind: SecondsOrOff = 60.0
    """...or this often (if longer) while the tailer is behind the log..."""
    mirror_every_s_capturing: SecondsOrOff = 60.0
    """...or this often (if longer) while a capture's chunk window is open."""
    mirror_max_events: Positive = 500_000
    """...or once the batches the mirror lacks hold this many log events."""
    chunk_files_timeout_s: PositiveFloat = 300.0
    """How long a pinned chunk's files may take before its window is aborted (the capture
    selects the chunk again)."""
    pin_ahead_s: SecondsOrOff = 10.0
    """How long a batch's log changes may wait while the tailer reads on and pins further
    chunks into it (0: a batch holding log changes pins no more); then it closes, and later
    chunks are pinned for the batch after it."""
    heal: Literal["capture", "notify"] = "capture"
    """What the tailer does when rows of a table changed without row events (a DDL that
    fills or rewrites a column, a statement-format DML, a partial row image, a foreign-key
    cascade): ``capture`` captures them again (the table, or the keys the log names) beside
    the tail; ``notify`` only notes it in ``dblog status`` and the log."""
    lag_warn_s: PositiveFloat = 60.0
    """The tail-lag asset check warns above this many seconds behind the source..."""
    lag_error_s: PositiveFloat = 600.0
    """...and fails (severity ERROR) above this many."""


class CaptureSection(_Settings):
    """``capture``: how captures read the source's tables in chunks."""

    chunk_size: Positive = 100_000
    """Rows of a range's first chunk (a table's own ``chunk_size`` in ``tables`` wins)."""
    chunk_max_rows: Positive = 500_000
    """Chunks grow (2x-8x, toward ``chunk_target_seconds``) up to this many rows while one
    takes under half the target."""
    chunk_target_seconds: PositiveFloat = 15.0
    """How long one chunk's select should take (seconds)."""
    max_in_flight: Positive = 4
    """Chunks of one range selected and waiting for their high watermark at once."""
    parallel_ranges: Positive = 2
    """Key ranges of one capture run at once, each with its own chunks and windows (a
    capture of many tables, or of many Dagster partitions, moves several ranges along while
    each waits for its windows' commits)."""
    range_rows: Positive = 100_000
    """Rows per key range: the Dagster ``full_state`` partitions' size."""
    read_partitions: Positive = 1
    """A large chunk is read by this many selects at once, each over its own key range. One
    by default: on two cores four bought ~4% of capture speed (64.7k vs 62.1k rows/s) and
    raised the source's commit p99 under a capture (`bench_impact`, pinned) 2.60x -> 3.68x;
    raise it where Spark has cores to spare and the source has headroom."""
    read_partition_rows: Positive = 50_000
    """...each of at least this many rows (smaller chunks are read by fewer selects)."""
    max_rows_per_s: PositiveFloat | None = None
    """At most this many rows a second read from the source by one capture process (null:
    as fast as it goes), in chunks of at most ``chunk_target_seconds`` of them: spares a
    source whose application must not feel the capture (`bench_impact`)."""


class RepairSection(_Settings):
    """``repair``: the rolling verification (``dblog repair``, the Dagster repair job and
    check), one key range at a time, paced. Its pace has no "off": a verification that runs
    forever must be paced."""

    max_rows_per_s: PositiveFloat = 10_000.0
    """Source rows checksummed a second, at most (every comparison of a range counts): a
    pass over a table of N rows takes about N / this many seconds, which bounds the time
    until any divergence is found (1M rows: 100 s)."""
    range_rows: Positive = 100_000
    """Rows per compared range, where no ranges are given (the Dagster job and check use
    the ``full_state`` partitions'): the unit compared, and captured when it differs."""


_SECRET_CONF = ("secret", "password", "access.key", "session.token", "sas.token",
                "credential")

SparkValue = StrictBool | StrictInt | StrictFloat | StrictStr


class SparkSection(_Section):
    """``spark``: where Spark runs and how it reaches the lake."""

    master: Text | None = None
    """Where Spark runs (``spark://host:7077``, ``yarn``, ...; default ``local[2]``)."""
    conf: dict[str, SparkValue] = Field(default_factory=dict)
    """Extra Spark settings (for example the lake's filesystem and LogStore)."""
    jars: list[Text] = Field(default_factory=list)
    """Extra local jars (for example hadoop-aws)."""

    @field_validator("conf", mode="before")
    @classmethod
    def _spark_settings(cls, conf: Any) -> Any:
        if conf is None:
            return {}
        if not isinstance(conf, Mapping):
            return conf
        for key, value in conf.items():
            if not isinstance(key, str) or not key.startswith("spark."):
                raise ValueError(f"key {key!r} is not a Spark setting "
                                 "(spark.*; Hadoop settings are spark.hadoop.*)")
            if any(word in key.lower() for word in _SECRET_CONF):
                raise ValueError(
                    f"must hold no credentials ({key}): give them to the filesystem "
                    "through its environment or instance credentials (for s3a: "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an instance profile)")
            if isinstance(value, Mapping | list) or value is None:
                raise ValueError(f"{key} must be a single value")
        return conf

    @field_validator("jars", mode="before")
    @classmethod
    def _no_jars(cls, jars: Any) -> Any:
        return [] if jars is None else jars


def _empty_when_null(value: Any) -> Any:
    return {} if value is None else value


class ConfigDocument(_Section):
    """The whole YAML document."""

    source: SourceSection
    tables: Annotated[list[TableEntry], Field(min_length=1)]
    lake: Text | None = None
    """The lake root: a local path (relative to the config file) or a URI for Spark's
    Hadoop filesystems (``s3a://bucket/lake``, ``abfss://...``, ``gs://...``,
    ``hdfs://...``); default ``$DBLOG_HOME/lake``."""
    zookeeper: Annotated[ZookeeperSection, BeforeValidator(_empty_when_null)] = Field(
        default_factory=ZookeeperSection)
    tail: Annotated[TailSection, BeforeValidator(_empty_when_null)] = Field(
        default_factory=TailSection)
    capture: Annotated[CaptureSection, BeforeValidator(_empty_when_null)] = Field(
        default_factory=CaptureSection)
    spark: Annotated[SparkSection, BeforeValidator(_empty_when_null)] = Field(
        default_factory=SparkSection)
    repair: Annotated[RepairSection, BeforeValidator(_empty_when_null)] = Field(
        default_factory=RepairSection)

    @model_validator(mode="after")
    def _tables_once(self) -> ConfigDocument:
        seen: set[TableId] = set()
        for entry in self.tables:
            table = TableId.parse(entry.name)
            if table in seen:
                raise ValueError(f"table {table} is listed twice")
            seen.add(table)
        return self


def _place(loc: tuple[int | str, ...]) -> str:
    """``('tables', 2, 'chunk_size')`` as ``tables[2].chunk_size``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


_MESSAGES = {
    "missing": "is missing",
    "int_type": "must be a whole number, got {input!r}",
    "int_parsing": "must be a whole number, got {input!r}",
    "int_from_float": "must be a whole number, got {input!r}",
    "float_type": "must be a number, got {input!r}",
    "float_parsing": "must be a number, got {input!r}",
    "string_type": "must be a string, got {input!r}",
    "bool_type": "must be true or false, got {input!r}",
    "list_type": "must be a list, got {input!r}",
    "dict_type": "must be a mapping, got {input!r}",
    "model_type": "must be a mapping, got {input!r}",
    "model_attributes_type": "must be a mapping, got {input!r}",
    "too_short": "must not be empty",
    "literal_error": "{input!r} is not supported ({expected})",
}


def _describe(error: ErrorDetails) -> str:
    """One validation error as a sentence naming its place in the document."""
    place = _place(tuple(p for p in error["loc"] if not str(p).startswith("function-")))
    kind, ctx = error["type"], dict(error.get("ctx") or {})
    if kind == "value_error":
        text = str(ctx.get("error", error["msg"]))
        if place and text.startswith(place):  # the message names its place itself
            return text
        if not place:
            return text
        return f"{place} {text}" if text.startswith("must ") else f"{place}: {text}"
    if kind == "greater_than" and ctx.get("gt") == 0:
        template = "must be a positive number, got {input!r}"
    elif kind == "greater_than_equal" and ctx.get("ge") == 0:
        template = "must be a number of seconds (0: off), got {input!r}"
    else:
        template = _MESSAGES.get(kind, "{msg}")
    text = template.format(input=error.get("input"), msg=error["msg"], **ctx)
    return f"{place} {text}" if place else text


def validate_document(data: Any) -> ConfigDocument:
    """The parsed YAML ``data`` as a :class:`ConfigDocument`; a :class:`ConfigError` names
    every problem and where it is."""
    if not isinstance(data, Mapping):
        raise ConfigError("config: the top level must be a mapping")
    try:
        return ConfigDocument.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(e) for e in exc.errors()]
        if len(problems) == 1:
            raise ConfigError(f"config: {problems[0]}") from None
        raise ConfigError("config: " + f"{len(problems)} problems:\n  "
                          + "\n  ".join(problems)) from None
