"""One exception root for the engine; retry logic checks :attr:`DblogError.transient`."""

from __future__ import annotations


class DblogError(Exception):
    """Base of every error the engine raises on purpose. Messages are one clear line."""

    transient: bool = False


class TransientError(DblogError):
    """Worth retrying as-is (connection dropped, lock held, service starting)."""

    transient = True


class ConfigError(DblogError):
    """The configuration or an argument is wrong; fix it and run again."""


class ServiceError(DblogError):
    """A local service could not be installed, started or reached."""


class SourceError(DblogError):
    """The source database refuses or lacks something the pipeline needs."""


class SourceUnavailable(SourceError, TransientError):
    """The source database cannot be reached right now."""


class LogPurgedError(SourceError):
    """The stored log position is no longer in the source's log; a capture is needed."""


class StateConflict(TransientError):
    """A compare-and-set on shared state lost a race; re-read and retry."""


class LockHeld(DblogError):
    """Another process holds the lock (e.g. another tailer runs for the source)."""


class LeadershipLost(TransientError):
    """This process no longer holds the tailer lock: it must stop writing at once."""
