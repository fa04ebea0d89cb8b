#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, the Python virtual environment,
# and the JVM jars Spark loads from local files. Every failure ends with one clear line.
set -euo pipefail
cd "$(dirname "$0")/.."

DBLOG_HOME="${DBLOG_HOME:-$PWD/.dblog}"
JARS="${DBLOG_JARS:-$DBLOG_HOME/jars}"
VENV="${DBLOG_VENV:-$PWD/.venv}"
PYTHON="${PYTHON:-python3.11}"
APT_PACKAGES=(mariadb-server mariadb-client postgresql-15 postgresql-client-15
              postgresql-15-wal2json zookeeper openjdk-17-jdk-headless maven
              chromium fonts-dejavu-core)

fail() { echo "setup: error: $*" >&2; exit 1; }
say() { echo "setup: $*"; }

# 1. Debian packages
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/tmp/dblog-apt.log 2>&1 || fail "apt-get update failed (see /tmp/dblog-apt.log)"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/dblog-apt.log 2>&1 \
    || fail "apt-get install ${missing[*]} failed (see /tmp/dblog-apt.log)"
fi

# 2. Python virtual environment with the pinned dependencies
command -v "$PYTHON" >/dev/null || fail "$PYTHON not found: install Python 3.11 (or set PYTHON=...)"
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" || fail "could not create a virtual environment at $VENV"
fi
stamp="$VENV/.dblog-installed"
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
  say "installing Python packages (pyproject.toml)"
  "$VENV/bin/pip" install -q --upgrade pip >/tmp/dblog-pip.log 2>&1 || true
  "$VENV/bin/pip" install -q -e '.[dev]' >>/tmp/dblog-pip.log 2>&1 \
    || fail "pip install failed (see /tmp/dblog-pip.log)"
  touch "$stamp"
fi

# 3. JVM jars for Spark (Delta, JDBC drivers), fetched once with Maven
jar_stamp="$JARS/.fetched"
if [[ ! -f "$jar_stamp" || jars/pom.xml -nt "$jar_stamp" ]]; then
  say "fetching jars with Maven into $JARS"
  mkdir -p "$JARS"
  rm -f "$JARS"/*.jar
  mvn -q -B -f jars/pom.xml dependency:copy-dependencies -DexcludeTransitive=true \
      -DincludeScope=runtime -DoutputDirectory="$JARS" >/tmp/dblog-mvn.log 2>&1 \
    || fail "Maven could not fetch the jars in jars/pom.xml (see /tmp/dblog-mvn.log)"
  touch "$jar_stamp"
fi
# 4. A class-data sharing archive of the Spark JVM (every dblog process starts faster; once
#    per JDK and Spark version: dblog/app/jvm_archive.py)
DBLOG_HOME="$DBLOG_HOME" DBLOG_JARS="$JARS" "$VENV/bin/python" -m dblog.app.jvm_archive \
  >/tmp/dblog-jvm-archive.log 2>&1 \
  || fail "could not write the JVM's class archive (see /tmp/dblog-jvm-archive.log; DBLOG_JVM_ARCHIVE=off skips it)"
say "ready"
