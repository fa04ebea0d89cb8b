"""Pure checks of a server's configuration and the pipeline user's privileges."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dblog.core.events import ChangeEvent
from dblog.sources.base import Transaction

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


STRICT_MODES = frozenset({"STRICT_TRANS_TABLES", "STRICT_ALL_TABLES"})
ZERO_DATE_TYPES = frozenset({"date", "datetime", "timestamp"})


def zero_date_loopholes(sql_mode: str) -> list[str]:
    """What in ``sql_mode`` lets a DATE/DATETIME/TIMESTAMP column store a value the lake
    cannot hold: a zero date ('0000-00-00'), a partial zero date ('2020-00-15') or an invalid
    date ('2020-02-31'). Empty when the mode refuses all three.

    Without a strict mode NO_ZERO_DATE and NO_ZERO_IN_DATE only warn and store the value.
    """
    modes = {m.strip().upper() for m in sql_mode.split(",") if m.strip()}
    loopholes = []
    if not modes & STRICT_MODES:
        loopholes.append("no strict mode (STRICT_TRANS_TABLES)")
    for name in ("NO_ZERO_DATE", "NO_ZERO_IN_DATE"):
        if name not in modes:
            loopholes.append(f"no {name}")
    if "ALLOW_INVALID_DATES" in modes:
        loopholes.append("ALLOW_INVALID_DATES")
    return loopholes


def check_temporal_key(table: object, key_types: Sequence[tuple[str, str]], sql_mode: str
                       ) -> list[str]:
    """Problems with DATE/DATETIME/TIMESTAMP primary-key columns under the server's
    ``sql_mode`` (empty when the table's key is safe).

    ``key_types`` are the key columns' ``(name, base type)`` in key order. A zero, partial
    zero or invalid date has no lake value (it would land as NULL, and two source keys could
    become one lake key): the operator is warned unless ``sql_mode`` refuses those values.
    Should such a value ever arrive, the tailer and the chunk read stop on it
    (:func:`null_key_problem`) instead of merging keys.
    """
    temporal = [(n, t) for n, t in key_types if t.lower() in ZERO_DATE_TYPES]
    loopholes = zero_date_loopholes(sql_mode)
    if not temporal or not loopholes:
        return []
    shown = sql_mode.strip() or "''"
    problems = []
    for name, base in temporal:
        problems.append(
            f"table {table}: primary key column {name!r} is "
            f"{base.upper()} and the server's sql_mode {shown} ({', '.join(loopholes)}) lets "
            "it hold zero, partial zero or invalid dates ('0000-00-00', '2020-00-15', "
            "'2020-02-31'), which the lake cannot represent: a row with such a key would stop "
            "the tailer and captures of the table. To rule it out: add STRICT_TRANS_TABLES, "
            "NO_ZERO_DATE and NO_ZERO_IN_DATE to sql_mode (and remove ALLOW_INVALID_DATES) "
            "under [mariadbd] in the server's configuration and with SET GLOBAL sql_mode=..., "
            f"after checking that no row holds such a value in {name!r}"
        )
    return problems


def null_key_problem(txn: Transaction) -> str | None:
    """Why ``txn`` cannot be applied, if a change in it has NULL in a primary-key column.

    Key columns are NOT NULL in the source, so a NULL there is a value the log decoder
    could not represent (a zero, partial zero, year-0 or invalid date). Applying it would
    merge distinct source rows into one lake key.
    """
    for item in txn.items:
        if not isinstance(item, ChangeEvent) or all(v is not None for v in item.key):
            continue
        schema = txn.schemas.get(item.table)
        names = schema.key if schema is not None else ()
        columns = [n for n, v in zip(names, item.key, strict=False) if v is None]
        where = (f"binlog file {item.position.binlog_file_index} offset "
                 f"{item.position.binlog_offset}")
        return (
            f"{item.table}: a change at {where} has NULL in primary key column(s) "
            f"{', '.join(repr(c) for c in columns) or '?'}: the source value cannot be "
            "represented in the lake (a zero, partial zero, year-0 or invalid date such as "
            "'0000-00-00', '2020-00-15', '0000-01-01'), and distinct rows would merge into "
            "one lake key. Fix such rows in the source and refuse them with sql_mode "
            "(STRICT_TRANS_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE); the tailer cannot pass this "
            "change: run `dblog tail --from-head`, then `dblog capture` to re-snapshot"
        )
    return None
