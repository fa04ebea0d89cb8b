"""A malformed configuration fails with a clear message naming what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import load_config, parse_config
from dblog.core.errors import ConfigError
from dblog.core.events import TableId

GOOD: dict[str, Any] = {
    "source": {"name": "main", "kind": "mariadb", "host": "127.0.0.1", "port": 13306,
               "user": "dblog", "password_env": "DBLOG_TEST_PW"},
    "tables": ["shop.accounts", {"name": "shop.orders", "chunk_size": 10}],
    "lake": "lake",
}


def test_good_config(tmp_path: Path) -> None:
    config = parse_config(GOOD, base_dir=tmp_path)
    assert config.table_ids == (TableId("shop", "accounts"), TableId("shop", "orders"))
    assert config.table("shop.orders").chunk_size == 10
    assert config.table("shop.accounts").chunk_size == 100_000  # the default first chunk
    assert config.capture.chunk_max_rows == 500_000
    assert config.capture.max_rows_per_s is None  # as fast as it goes
    throttled = parse_config({**GOOD, "capture": {"max_rows_per_s": 2500}})
    assert throttled.capture.max_rows_per_s == 2500.0
    assert config.tail.maintain_every_s == 3600.0
    assert parse_config({**GOOD, "tail": {"maintain_every_s": 0}}).tail.maintain_every_s == 0
    assert config.tail.mirror_every_s_behind == 60.0
    behind = parse_config({**GOOD, "tail": {"mirror_every_s_behind": 0}}).tail
    assert behind.mirror_every_s_behind == 0
    assert config.tail.mirror_every_s_capturing == 60.0
    capturing = parse_config({**GOOD, "tail": {"mirror_every_s_capturing": 0}}).tail
    assert capturing.mirror_every_s_capturing == 0
    assert config.lake == str((tmp_path / "lake").resolve())
    # The rolling verification's pace and range size (README's YAML block).
    assert (config.repair.max_rows_per_s, config.repair.range_rows) == (10_000.0, 100_000)
    paced = parse_config({**GOOD, "repair": {"max_rows_per_s": 250, "range_rows": 5000}})
    assert (paced.repair.max_rows_per_s, paced.repair.range_rows) == (250.0, 5000)
    assert parse_config({**GOOD, "repair": None}).repair == config.repair


@pytest.mark.parametrize(("uri", "root"), [
    ("s3a://bucket/lake/", "s3a://bucket/lake"),
    ("abfss://c@acct.dfs.core.windows.net/l", "abfss://c@acct.dfs.core.windows.net/l"),
    ("gs://bucket//lake", "gs://bucket/lake"), ("hdfs://nn:8020/lake", "hdfs://nn:8020/lake"),
    ("file:///data/lake", "file:/data/lake"), ("file:/data/lake/", "file:/data/lake"),
])
def test_a_lake_uri_is_kept_in_hadoop_s_spelling(uri: str, root: str) -> None:
    assert parse_config({**GOOD, "lake": uri}).lake == root


def test_spark_settings_and_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3_ENDPOINT", "http://127.0.0.1:9000")
    config = parse_config({**GOOD, "spark": {
        "master": "spark://h:7077", "jars": ["/opt/jars/hadoop-aws.jar"],
        "conf": {"spark.hadoop.fs.s3a.endpoint": "${S3_ENDPOINT}",
                 "spark.hadoop.fs.s3a.path.style.access": True}}})
    assert config.spark_master == "spark://h:7077"
    assert config.spark_jars == ("/opt/jars/hadoop-aws.jar",)
    assert config.spark_conf == {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
                                 "spark.hadoop.fs.s3a.path.style.access": "true"}


def test_password_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config(GOOD)
    monkeypatch.delenv("DBLOG_TEST_PW", raising=False)
    with pytest.raises(ConfigError, match="DBLOG_TEST_PW"):
        _ = config.source.password
    monkeypatch.setenv("DBLOG_TEST_PW", "s3cret")
    assert config.source.password == "s3cret"
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"source": None}, "source must be a mapping"),
        ({"tables": []}, "tables must not be empty"),
        ({"tables": ["no_dot"]}, r"tables\[0\].*DATABASE.TABLE"),
        ({"tables": ["a.b", "a.b"]}, "listed twice"),
        ({"bogus": 1},
         r"config: unknown keys: bogus \(known: capture, lake, repair, source, spark, tables, "
         r"tail, zookeeper\)"),
        ({"repair": {"max_rows_per_s": 0}}, "repair.max_rows_per_s must be a positive number"),
        ({"repair": {"max_rows_per_s": "fast"}}, "repair.max_rows_per_s must be a number"),
        ({"repair": {"max_rows_per_s": True}}, "repair.max_rows_per_s must be a number"),
        ({"repair": {"range_rows": 0}}, "repair.range_rows must be a positive number, got 0"),
        ({"repair": {"range_rows": 2.5}}, "repair.range_rows must be a whole number, got 2.5"),
        ({"repair": {"rate": 10}},
         r"repair: unknown keys: rate \(known: max_rows_per_s, range_rows\)"),
        ({"repair": "slow"}, "repair must be a mapping"),
        ({"capture": {"chunk_size": 0}}, "capture.chunk_size must be a positive number"),
        ({"capture": {"chunk_size": "many"}},
         "capture.chunk_size must be a whole number, got 'many'"),
        ({"capture": {"max_rows_per_s": 0}}, "capture.max_rows_per_s must be a positive"),
        ({"capture": {"max_rows_per_s": "slow"}}, "capture.max_rows_per_s must be a number"),
        ({"source": {**GOOD["source"], "kind": "oracle"}}, "not supported"),
        ({"source": {**GOOD["source"], "port": "x"}}, "source.port must be a whole number"),
        ({"source": {k: v for k, v in GOOD["source"].items() if k != "host"}},
         "source.host is missing"),
        ({"source": {**GOOD["source"], "name": "a/b"}}, "source.name"),
        ({"tail": {"maintain_every_s": -1}}, r"tail.maintain_every_s must be .*\(0: off\)"),
        ({"tail": {"mirror_every_s_behind": "1m"}}, r"tail.mirror_every_s_behind must be"),
        ({"tail": {"mirror_every_s_capturing": -5}}, r"tail.mirror_every_s_capturing must be"),
        ({"tail": {"mirror_every_s_captureing": 0}},
         r"tail: unknown keys: mirror_every_s_captureing \(known: .*mirror_every_s_capturing"),
        ({"tail": [1]}, "tail must be a mapping"),
        ({"capture": {"chunksize": 10}},
         r"capture: unknown keys: chunksize \(known: chunk_max_rows, chunk_size,"),
        ({"capture": "fast"}, "capture must be a mapping"),
        ({"source": {**GOOD["source"], "kind": "postgres"}}, "source.database"),
        ({"source": {**GOOD["source"], "slot": "s"}},
         "source: unknown keys for kind 'mariadb': slot"),
        ({"source": {**GOOD["source"], "kind": "postgres", "database": "d", "server_id": 1,
                     "bogus": 2}}, "source: unknown keys for kind 'postgres': bogus"),
        ({"zookeeper": {"session_timeout": 5}}, "zookeeper: unknown keys: session_timeout "),
        ({"zookeeper": {"session_timeout_s": 1}},
         "zookeeper.session_timeout_s must be between 2 and 120 seconds, got 1"),
        ({"zookeeper": {"session_timeout_s": "long"}}, "session_timeout_s must be a number"),
        ({"lake": "s3a://AKIA:secret@bucket/lake"}, "must not hold credentials"),
        ({"lake": "s3a:///lake"}, "names no bucket"),
        ({"lake": "s3a://bucket/lake?x=1"}, "query or fragment"),
        ({"lake": 3}, "lake must be a string, got 3"),
        ({"spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "x"}}}, "no credentials"),
        ({"spark": {"conf": {"fs.s3a.endpoint": "x"}}}, "is not a Spark setting"),
        ({"spark": {"conf": {"spark.x": [1]}}}, "must be a single value"),
        ({"spark": {"jars": "a.jar"}}, "spark.jars must be a list, got 'a.jar'"),
        ({"spark": {"executors": 3}},
         r"spark: unknown keys: executors \(known: conf, jars, master\)"),
        ({"spark": ["local[2]"]}, "spark must be a mapping"),
    ],
)
def test_bad_config(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({**GOOD, **patch})


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    top = tmp_path / "top.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(top)


def test_a_postgres_source() -> None:
    config = parse_config({**GOOD, "source": {
        "name": "billing", "kind": "postgres", "host": "h", "port": 5432, "user": "u",
        "password_env": "P", "database": "billing", "slot": "my_slot",
        "watermark_schema": "wm"}})
    assert (config.source.kind, config.source.database) == ("postgres", "billing")
    assert (config.source.slot, config.source.publication) == ("my_slot", "")
    assert config.source.watermark_database == "wm"


def test_zookeeper_credentials_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config({**GOOD, "zookeeper": {"auth_env": "DBLOG_TEST_ZK"}})
    monkeypatch.delenv("DBLOG_TEST_ZK", raising=False)
    with pytest.raises(ConfigError, match="DBLOG_TEST_ZK .* is not set"):
        _ = config.zookeeper_auth
    monkeypatch.setenv("DBLOG_TEST_ZK", "no-colon")
    with pytest.raises(ConfigError, match="user:password"):
        _ = config.zookeeper_auth
    monkeypatch.setenv("DBLOG_TEST_ZK", "dblog:pa:ss")
    assert config.zookeeper_auth == ("dblog", "pa:ss")
    assert parse_config(GOOD).zookeeper_auth is None
    with pytest.raises(ConfigError, match="must name an environment variable"):
        parse_config({**GOOD, "zookeeper": {"auth_env": "dblog:hunter2"}})


def test_a_missing_extra_jar_is_named(tmp_path: Path) -> None:
    from dblog.app.spark import spark_conf

    with pytest.raises(ConfigError, match="no such jar file: .*hadoop-aws.jar"):
        spark_conf(jars=[str(tmp_path / "hadoop-aws.jar")])


def test_every_tail_setting_reaches_the_tailer() -> None:
    from dataclasses import fields

    from dblog.app.config import CaptureConfig, TailConfig
    from dblog.app.runtime import tail_options
    from dblog.capture import CaptureOptions
    from dblog.tail import TailOptions

    settings = {"batch_max_events": 5000, "batch_max_seconds": 1.5, "poll_seconds": 0.25,
                "window_expiry_s": 600, "maintain_every_s": 0, "mirror_every_s": 5,
                "mirror_every_s_behind": 30, "mirror_every_s_capturing": 20,
                "mirror_max_events": 1000, "chunk_files_timeout_s": 60, "pin_ahead_s": 2.5}
    config = parse_config({**GOOD, "tail": settings})
    options = tail_options(config.tail)
    for name, value in settings.items():
        assert getattr(options, name) == value, name
    # every tail setting but the asset checks' lag levels and the healing switch (the
    # runtime gives the tailer a healer, or none) is a tailer option
    assert set(TailConfig.model_fields) - {f.name for f in fields(TailOptions)} == {
        "lag_warn_s", "lag_error_s", "heal"}
    # the options take their defaults from the one definition of each setting
    for option in fields(TailOptions):
        if option.name in TailConfig.model_fields:
            assert option.default == TailConfig.model_fields[option.name].default, option.name
    for option in fields(CaptureOptions):
        if option.name in CaptureConfig.model_fields:
            assert option.default == CaptureConfig.model_fields[option.name].default, option.name
    defaults = tail_options(parse_config(GOOD).tail)
    assert (defaults.pin_ahead_s, defaults.chunk_files_timeout_s) == (10.0, 300.0)


def test_every_problem_is_named_at_once_with_its_place() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**GOOD, "capture": {"chunk_size": 0, "max_in_flight": True},
                      "tables": ["shop.a", {"name": "shop.b", "repair_cron": "daily"}]})
    message = str(caught.value)
    assert message.startswith("config: 3 problems:")
    assert "capture.chunk_size must be a positive number, got 0" in message
    assert "capture.max_in_flight must be a whole number, got True" in message
    assert "tables[1].repair_cron must be a 5-field cron expression, got 'daily'" in message


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"tail": {"pin_ahead_s": -1}}, r"tail.pin_ahead_s must be a number of seconds"),
        ({"tail": {"chunk_files_timeout_s": 0}}, "tail.chunk_files_timeout_s must be a positive"),
        ({"tail": {"batch_max_events": 10.5}}, "tail.batch_max_events must be a whole number"),
        ({"tail": {"poll_seconds": "1"}}, "tail.poll_seconds must be a number, got '1'"),
        ({"tail": {"lag_warn_s": 100, "lag_error_s": 50}}, "lag_error_s must not be below"),
        ({"tables": ["shop.a", {"name": "shop.b", "repair_capture_all": "yes"}]},
         r"tables\[1\].repair_capture_all must be true or false"),
        ({"tables": [{"chunk_size": 5}]}, r"tables\[0\].name is missing"),
        ({"source": {**GOOD["source"], "password_env": "hunter2 secret"}},
         "source.password_env must name an environment variable"),
        ({"spark": {"master": 7}}, "spark.master must be a string, got 7"),
    ],
)
def test_bad_settings_name_their_place(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({**GOOD, **patch})


def test_empty_sections_and_null_settings_keep_the_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_config({**GOOD, "tail": None, "capture": {"chunk_size": None},
                           "zookeeper": None, "spark": {"conf": None, "jars": None}})
    assert config.tail.pin_ahead_s == 10.0
    assert config.capture.chunk_size == 100_000
    assert config.spark_conf == {} and config.spark_jars == ()
    monkeypatch.setenv("DBLOG_TEST_PORT", "23306")
    port = parse_config({**GOOD, "source": {**GOOD["source"], "port": "${DBLOG_TEST_PORT}"}})
    assert port.source.port == 23306


def test_every_capture_setting_reaches_the_capture() -> None:
    from dataclasses import fields

    from dblog.app.config import CaptureConfig
    from dblog.app.runtime import capture_options
    from dblog.capture import CaptureOptions

    settings = {"chunk_size": 7, "chunk_max_rows": 70, "chunk_target_seconds": 3.5,
                "max_in_flight": 2, "read_partitions": 3, "read_partition_rows": 9,
                "max_rows_per_s": 123.0}
    config = parse_config({**GOOD, "capture": settings})
    options = capture_options(config)
    for name, value in settings.items():
        assert getattr(options, name) == value, name
    assert options.chunk_sizes == {TableId("shop", "accounts"): 7, TableId("shop", "orders"): 10}
    assert set(CaptureConfig.model_fields) - {f.name for f in fields(CaptureOptions)} == {
        "range_rows"}


def test_the_users_jvm_options_are_added_to_dblogs() -> None:
    from dblog.app.spark import C2_THRESHOLDS, JAVA_OPTIONS, spark_conf

    ours = spark_conf()[JAVA_OPTIONS]
    assert all(flag in ours for flag in C2_THRESHOLDS)
    theirs = spark_conf(extra={JAVA_OPTIONS: "-Xss4m -Dx=1", "spark.sql.shuffle.partitions": "8"})
    assert theirs[JAVA_OPTIONS] == f"{ours} -Xss4m -Dx=1"
    assert theirs["spark.sql.shuffle.partitions"] == "8"  # any other setting replaces dblog's
    assert spark_conf(extra={JAVA_OPTIONS: " "})[JAVA_OPTIONS] == ours


def test_healing_is_on_by_default_and_can_only_notify() -> None:
    assert parse_config(GOOD).tail.heal == "capture"
    assert parse_config({**GOOD, "tail": {"heal": "notify"}}).tail.heal == "notify"
    with pytest.raises(ConfigError, match="tail.heal"):
        parse_config({**GOOD, "tail": {"heal": "sometimes"}})


def test_the_configuration_page_is_the_schemas() -> None:
    """docs/configuration.md is rendered from the schema: a setting added, changed or
    documented there without the page written again fails here."""
    from dblog.app.config_docs import PAGE, render

    assert PAGE.read_text() == render(), (
        "docs/configuration.md differs from the schema: run `python -m dblog.app.config_docs`")
    for section in ("source", "tables", "lake", "zookeeper", "tail", "capture", "spark",
                    "repair"):
        assert f"## `{section}`" in render()
    undocumented = [
        line.split("|")[1] for line in render().splitlines()
        if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert not undocumented, f"settings without a docstring in the schema: {undocumented}"
