"""The YAML configuration's schema, validated by pydantic (:func:`validate_document`).

Every section refuses keys it does not know (a typo would otherwise leave a setting at its
default), numbers are not taken from booleans or text (but for ``source.port`` and
``source.server_id``, which may come from ``${ENV}``), and every problem is reported at
once with its place in the document: ``capture.chunk_size must be a positive number, got 0``.
:mod:`pipeline.config` turns the validated document into its frozen settings.
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

from pipeline.errors import ConfigError
from pipeline.events import TableId

__all__ = ["ConfigDocument", "validate_document"]

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

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    name: Text
    kind: Literal["mariadb", "mysql", "postgres"]
    host: Text
    port: WholeNumberOrEnv
    user: Text
    password_env: Text
    server_id: WholeNumberOrEnv = 5401
    watermark_database: Text | None = None
    database: Text = ""
    """PostgreSQL only: the database to connect to."""
    slot: Text = ""
    publication: Text = ""
    watermark_schema: Text | None = None

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
    name: Text
    chunk_size: Positive | None = None
    repair_cron: Text | None = None
    """When to compare mirror and source and capture the ranges that differ (off: None)."""
    repair_capture_all: Annotated[bool, Strict()] = False

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
    hosts: Text = "127.0.0.1:${DBLOG_ZK_PORT}"
    root: Text = "dblog"
    session_timeout_s: PositiveFloat = 10.0
    auth_env: Text | None = None

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


class TailSection(_Section):
    """``tail``: each setting left out (or null) keeps :class:`~pipeline.config.TailConfig`'s
    default."""

    batch_max_events: Positive | None = None
    batch_max_seconds: PositiveFloat | None = None
    poll_seconds: PositiveFloat | None = None
    window_expiry_s: PositiveFloat | None = None
    maintain_every_s: SecondsOrOff | None = None
    mirror_every_s: SecondsOrOff | None = None
    mirror_every_s_behind: SecondsOrOff | None = None
    mirror_every_s_capturing: SecondsOrOff | None = None
    mirror_max_events: Positive | None = None
    chunk_files_timeout_s: PositiveFloat | None = None
    pin_ahead_s: SecondsOrOff | None = None
    heal: Literal["capture", "notify"] | None = None
    lag_warn_s: PositiveFloat | None = None
    lag_error_s: PositiveFloat | None = None


class CaptureSection(_Section):
    """``capture``: each setting left out (or null) keeps
    :class:`~pipeline.config.CaptureConfig`'s default (``max_rows_per_s``: no limit)."""

    chunk_size: Positive | None = None
    chunk_max_rows: Positive | None = None
    chunk_target_seconds: PositiveFloat | None = None
    max_in_flight: Positive | None = None
    parallel_ranges: Positive | None = None
    range_rows: Positive | None = None
    read_partitions: Positive | None = None
    read_partition_rows: Positive | None = None
    max_rows_per_s: PositiveFloat | None = None


class RepairSection(_Section):
    """``repair``: the rolling verification (``dblog repair``, the Dagster repair job and
    check); each setting left out (or null) keeps :class:`~pipeline.config.RepairConfig`'s
    default. Its pace has no "off": a verification that runs forever must be paced."""

    max_rows_per_s: PositiveFloat | None = None
    range_rows: Positive | None = None


_SECRET_CONF = ("secret", "password", "access.key", "session.token", "sas.token",
                "credential")

SparkValue = StrictBool | StrictInt | StrictFloat | StrictStr


class SparkSection(_Section):
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
