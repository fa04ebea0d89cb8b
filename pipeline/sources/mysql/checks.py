"""Pure checks of a server's configuration and the pipeline user's privileges."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

REQUIRED_VARIABLES: dict[str, str] = {
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}

_FIXES = {
    "log_bin": "enable it with log-bin=mysql-bin under [mariadbd] in the server's "
               "configuration and restart the server",
    "binlog_format": "set binlog_format=ROW under [mariadbd] in the server's configuration "
                     "(or SET GLOBAL binlog_format=ROW)",
    "binlog_row_image": "set binlog_row_image=FULL under [mariadbd] in the server's "
                        "configuration (or SET GLOBAL binlog_row_image=FULL)",
    "binlog_row_metadata": "set binlog_row_metadata=FULL under [mariadbd] in the server's "
                           "configuration (or SET GLOBAL binlog_row_metadata=FULL; needs "
                           "MariaDB >= 10.5 or MySQL >= 8.0.14)",
}


FORBIDDEN_VARIABLES: dict[str, str] = {
    "binlog_transaction_compression": "ON",
    "log_bin_compress": "ON",
    "binlog_order_commits": "OFF",
}
"""Settings under which changes silently go missing (a server without the variable is fine).

The binlog reader cannot decode compressed events (MySQL's Transaction_payload, MariaDB's
compressed query and row events): they arrive as unknown events and would be skipped. With
``binlog_order_commits=OFF`` (MySQL) transactions can become visible in another order than
the binlog's, so a chunk select can miss a change the log places before its window.
"""

_FORBIDDEN_FIXES = {
    "binlog_transaction_compression":
        "compressed transaction payloads cannot be decoded by the binlog reader, so their "
        "changes would be skipped; SET GLOBAL binlog_transaction_compression=OFF and set "
        "binlog_transaction_compression=OFF under [mysqld] in the server's configuration "
        "(binlogs written while it was ON cannot be read)",
    "log_bin_compress":
        "compressed binlog events cannot be decoded by the binlog reader, so their changes "
        "would be skipped; SET GLOBAL log_bin_compress=OFF and set log_bin_compress=OFF "
        "under [mariadbd] in the server's configuration (binlogs written while it was ON "
        "cannot be read)",
    "binlog_order_commits":
        "transactions can then become visible in another order than the binlog's, so a "
        "chunk select can miss a change the log places before its window; SET GLOBAL "
        "binlog_order_commits=ON and set binlog_order_commits=ON under [mysqld] in the "
        "server's configuration",
}

VALIDATED_VARIABLES = tuple(REQUIRED_VARIABLES) + tuple(FORBIDDEN_VARIABLES)
"""Every global variable :func:`check_server_variables` looks at."""


def _normalize(value: object) -> str:
    text = str(value).strip().upper()
    return {"1": "ON", "0": "OFF"}.get(text, text)


def check_server_variables(variables: Mapping[str, object]) -> list[str]:
    """Problems with the server's binlog settings (empty when capture can work).

    ``variables`` maps lower-case variable names to values (as SHOW VARIABLES gives).
    """
    lower = {k.lower(): v for k, v in variables.items()}
    problems = []
    for name, wanted in REQUIRED_VARIABLES.items():
        if name not in lower:
            problems.append(f"{name} is not available on this server (needs {wanted}): "
                            f"{_FIXES[name]}")
            continue
        actual = _normalize(lower[name])
        if actual != wanted:
            problems.append(f"{name} is {actual}, DBLog needs {wanted}: {_FIXES[name]}")
    for name, refused in FORBIDDEN_VARIABLES.items():
        if name in lower and _normalize(lower[name]) == refused:
            problems.append(f"{name} is {refused}, DBLog cannot capture with it: "
                            f"{_FORBIDDEN_FIXES[name]}")
    return problems


def check_privileges(global_privileges: Iterable[str], *, has_select: bool, grantee: str
                     ) -> list[str]:
    """Missing privileges for log reading and chunk selects (empty when all are there).

    ``global_privileges`` are the user's (and its roles') global privilege names;
    ``has_select`` is whether SELECT is granted at any level.
    """
    privs = {p.strip().upper() for p in global_privileges}
    if "ALL PRIVILEGES" in privs:
        return []
    problems = []
    if "REPLICATION SLAVE" not in privs:
        problems.append(
            f"missing privilege REPLICATION SLAVE (to read the binlog): "
            f"GRANT REPLICATION SLAVE ON *.* TO {grantee}"
        )
    if not privs & {"BINLOG MONITOR", "REPLICATION CLIENT", "SUPER"}:
        problems.append(
            f"missing privilege BINLOG MONITOR (MySQL: REPLICATION CLIENT) for SHOW MASTER "
            f"STATUS / SHOW BINARY LOGS: GRANT BINLOG MONITOR ON *.* TO {grantee}"
        )
    if "SELECT" not in privs and not has_select:
        problems.append(
            f"missing privilege SELECT on the captured tables: "
            f"GRANT SELECT ON db.* TO {grantee}"
        )
    return problems
