"""Telling an outage from a failure (``dblog.core.outage``), and riding one out."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dblog.core.errors import SourceError, SourceUnavailable
from dblog.core.outage import ride_out, unreachable
from dblog.state import StateUnavailable


class JavaError:
    """The shape of a Java exception as Py4J hands it over: class name, SQLState, cause."""

    def __init__(self, name: str, message: str, state: str | None = None,
                 cause: JavaError | None = None) -> None:
        self.name, self.message, self.state, self.cause = name, message, state, cause

    def getClass(self) -> Any:  # noqa: N802 - the Java method's name
        name = self.name
        return type("Class", (), {"getName": lambda _self: name})()

    def getSQLState(self) -> str | None:  # noqa: N802
        if self.state is None:
            raise AttributeError("not an SQLException")
        return self.state

    def getMessage(self) -> str:  # noqa: N802
        return self.message

    def getCause(self) -> JavaError | None:  # noqa: N802
        return self.cause


class Py4JLike(Exception):
    def __init__(self, java: JavaError) -> None:
        super().__init__("An error occurred while calling o78.load.")
        self.java_exception = java


@pytest.mark.parametrize("java", [
    JavaError("java.sql.SQLNonTransientConnectionException",
              "Socket fail to connect to 127.0.0.1:13306. Connection refused", "08000"),
    JavaError("org.apache.spark.SparkException", "Job aborted", None, JavaError(
        "org.postgresql.util.PSQLException", "Connection to 127.0.0.1:15432 refused", "08001")),
    JavaError("org.apache.spark.SparkException", "Job aborted", None,
              JavaError("java.net.ConnectException", "Connection refused")),
])
def test_lost_or_refused_connections_are_outages(java: JavaError) -> None:
    reason = unreachable(Py4JLike(java))
    assert reason is not None and "refused" in reason


@pytest.mark.parametrize("exc", [
    Py4JLike(JavaError("java.sql.SQLSyntaxErrorException", "Unknown column 'x'", "42S22")),
    Py4JLike(JavaError("org.postgresql.util.PSQLException", "permission denied", "42501")),
    SourceError("access denied for user 'dblog'"),
    ValueError("a bug"),
])
def test_other_failures_are_not(exc: Exception) -> None:
    assert unreachable(exc) is None


def test_the_engine_s_own_outage_errors_are_outages() -> None:
    assert unreachable(SourceUnavailable("cannot reach MariaDB/MySQL at h:1: refused"))
    assert unreachable(StateUnavailable("ZooKeeper connection lost"))


def test_ride_out_retries_an_outage_then_succeeds() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise SourceUnavailable("cannot reach the source")
        return "done"

    assert ride_out(flaky, patience_s=10, what="resume", pause_s=0.01) == "done"
    assert len(calls) == 3


def test_ride_out_gives_up_with_what_to_do_and_never_retries_a_failure() -> None:
    def down() -> None:
        raise SourceUnavailable("cannot reach the source")

    with pytest.raises(SourceUnavailable, match=r"cannot reach the source .*run `dblog resume"):
        ride_out(down, patience_s=0.05, what="run `dblog resume`", pause_s=0.01)
    calls = []

    def broken() -> None:
        calls.append(1)
        raise SourceError("access denied")

    with pytest.raises(SourceError):
        ride_out(broken, patience_s=10, what="x", pause_s=0.01)
    assert len(calls) == 1
    stop = threading.Event()
    stop.set()
    with pytest.raises(SourceUnavailable):  # a stop ends the waiting at once
        ride_out(down, patience_s=10, what="x", stop=stop)


def test_a_wait_for_the_tailer_rides_out_a_zookeeper_outage() -> None:
    from dblog.app.runtime import Runtime

    answers = iter([StateUnavailable("ZooKeeper unavailable during get position"),
                    StateUnavailable("ZooKeeper unavailable during get position"), False, True])
    checks: list[int] = []

    def done() -> bool:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    Runtime._wait_until(done, lambda: checks.append(1), 30, "the tailer did not catch up")
    assert len(checks) == 3  # each reading that was not yet done checks the tailer's health


def test_a_wait_that_times_out_in_an_outage_says_so() -> None:
    from dblog.app.runtime import Runtime
    from dblog.core.errors import DblogError

    def done() -> bool:
        raise StateUnavailable("ZooKeeper unavailable during get position: ConnectionLoss")

    with pytest.raises(DblogError, match=r"did not catch up within 0s \(last: ZooKeeper "
                                         r"unavailable during get position: ConnectionLoss\)"):
        Runtime._wait_until(done, lambda: None, 0, "the tailer did not catch up")
