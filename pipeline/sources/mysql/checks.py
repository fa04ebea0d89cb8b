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
