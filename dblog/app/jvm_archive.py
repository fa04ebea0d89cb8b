"""A class-data sharing archive of the Spark JVM: every dblog process starts its JVM faster.

A fresh JVM loads and verifies Spark's, Scala's and Delta's classes one by one: 5-7 s before
the session exists and as long again before its first Delta write is done. The JVM can map
the classes a run loaded, already parsed and verified, from an archive it wrote at the end
of an earlier run (HotSpot's dynamic CDS archive, ``-XX:ArchiveClassesAtExit``). ``make
setup`` (``python -m dblog.app.jvm_archive``) writes one with a short Spark and Delta run;
:func:`archive_options` then adds it to every session's JVM options while it exists.

The archive is only ever used whole: it is written under a temporary name by a JVM that
exited normally and renamed into place (a partly written archive crashes the JVM that maps
it). The JVM checks it against its own build and class path on every start and runs
without it when they differ (a new JDK or Spark), silently; its name carries the JDK and
pyspark versions, so a set-up after an upgrade writes a new one. ``DBLOG_JVM_ARCHIVE=off``
turns it off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dblog.app.paths import dblog_home

_OFF = ("0", "off", "false", "no")


def _turned_off() -> bool:
    """``DBLOG_JVM_ARCHIVE`` says not to write or map the archive."""
    return os.environ.get("DBLOG_JVM_ARCHIVE", "on").strip().lower() in _OFF


def _java_home() -> str:
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.path.realpath(home)
    java = shutil.which("java")
    return os.path.realpath(java) if java else "no-java"


def archive_path() -> Path:
    """Where this machine's archive is, named for its JDK and pyspark."""
    import pyspark

    key = hashlib.sha1(f"{_java_home()}|{pyspark.__version__}".encode()).hexdigest()[:12]
    return dblog_home() / "jvm" / f"spark-{pyspark.__version__}-{key}.jsa"


def archive_options() -> list[str]:
    """The JVM options that map the archive, if there is one (and it is not turned off)."""
    if _turned_off():
        return []
    path = archive_path()
    if not path.is_file():
        return []
    # -Xshare:auto (the default): a JVM that cannot use the archive runs without it.
    return [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


def _train(archive: str) -> None:
    """A short Spark and Delta run in a JVM that writes the classes it loaded to
    ``archive`` when it exits; returns once that JVM has exited."""
    from dblog.app.spark import JAVA_OPTIONS, build_spark_session

    spark = build_spark_session(extra={JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={archive}"})
    work = tempfile.mkdtemp(prefix="dblog-jvm-archive-")
    try:
        path = str(Path(work, "t"))
        frame = spark.range(1000).selectExpr("id", "cast(id as string) AS v",
                                             "named_struct('a', id) AS s")
        frame.write.format("delta").save(path)
        frame.write.format("delta").mode("append").save(path)
        from delta.tables import DeltaTable

        table = DeltaTable.forPath(spark, path)
        (table.alias("t").merge(frame.alias("c"), "t.id = c.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        table.history(5).collect()
        spark.read.format("delta").load(path).groupBy("v").count().collect()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gateway = spark.sparkContext._gateway
    spark.stop()
    if gateway is None:
        raise RuntimeError("no JVM gateway: the archive needs a JVM this process started")
    proc = gateway.proc
    proc.stdin.close()  # the JVM exits when its stdin closes, and writes the archive then
    proc.wait(timeout=300)


def _running(pid: str) -> bool:
    """Whether process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    return True


def build_archive(*, force: bool = False) -> Path | None:
    """Write this machine's archive unless it exists; returns its path (None: turned off)."""
    if _turned_off():
        return None
    final = archive_path()
    if final.is_file() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    for left in final.parent.glob("spark-*.jsa.*.tmp"):
        if not _running(left.suffixes[-2].lstrip(".")):
            left.unlink(missing_ok=True)  # a build that was killed left it
    temp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    env = dict(os.environ, DBLOG_JVM_ARCHIVE="off")
    done = subprocess.run([sys.executable, "-m", "dblog.app.jvm_archive", "--train", str(temp)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 or not temp.is_file():
        temp.unlink(missing_ok=True)
        raise RuntimeError(f"the JVM archive run failed ({done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-2000:]}")
    os.replace(temp, final)  # whole, or not at all
    for stale in final.parent.glob("spark-*.jsa"):
        if stale != final:
            stale.unlink(missing_ok=True)  # an earlier JDK's or Spark's
    return final


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--train"]:
        _train(args[1])
        return 0
    path = build_archive(force="--force" in args)
    print(f"jvm archive: {path if path is not None else 'turned off (DBLOG_JVM_ARCHIVE)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
