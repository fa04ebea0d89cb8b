"""The JVM's class-data sharing archive: used only when it exists whole, never half."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dblog.app import jvm_archive
from dblog.app.paths import jars_dir
from dblog.app.spark import JAVA_OPTIONS, spark_conf


def test_the_archive_is_mapped_only_when_it_exists_and_is_not_turned_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOG_JARS", str(jars_dir()))  # the jars stay where they are
    monkeypatch.setenv("DBLOG_HOME", str(tmp_path))
    monkeypatch.delenv("DBLOG_JVM_ARCHIVE", raising=False)
    path = jvm_archive.archive_path()
    assert path.parent == tmp_path / "jvm" and path.suffix == ".jsa"
    assert jvm_archive.archive_options() == []
    # a temporary file of a run still writing (or killed) is never taken
    path.parent.mkdir(parents=True)
    path.with_name(f"{path.name}.123.tmp").write_bytes(b"partial")
    assert jvm_archive.archive_options() == []
    path.write_bytes(b"archive")
    options = jvm_archive.archive_options()
    assert options[0] == f"-XX:SharedArchiveFile={path}"
    assert "-Xlog:cds=off" in options  # a JVM that cannot use it runs without it, silently
    assert options[0] in spark_conf()[JAVA_OPTIONS].split()
    monkeypatch.setenv("DBLOG_JVM_ARCHIVE", "off")
    assert jvm_archive.archive_options() == []
    assert jvm_archive.build_archive() is None


def test_the_archive_is_named_for_the_jdk_and_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOG_HOME", str(tmp_path))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk-a"))
    first = jvm_archive.archive_path()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk-b"))
    assert jvm_archive.archive_path() != first


def test_a_failed_build_raises_and_clears_what_a_killed_build_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOG_HOME", str(tmp_path))
    monkeypatch.setenv("DBLOG_JARS", str(tmp_path / "no-jars"))  # the training run fails
    monkeypatch.delenv("DBLOG_JVM_ARCHIVE", raising=False)
    path = jvm_archive.archive_path()
    path.parent.mkdir(parents=True)
    killed = path.with_name(f"{path.name}.999999999.tmp")  # no such process
    writing = path.with_name(f"{path.name}.{os.getppid()}.tmp")  # a live process's build
    killed.write_bytes(b"partial")
    writing.write_bytes(b"partial")
    path.write_bytes(b"archive")
    assert jvm_archive.build_archive() == path  # there already: nothing is built
    assert killed.exists()
    path.unlink()
    with pytest.raises(RuntimeError, match="archive run failed"):
        jvm_archive.build_archive()
    assert not killed.exists() and writing.exists() and not path.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == [writing.name]
