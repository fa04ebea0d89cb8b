"""A table's current state read without a Spark session: delta-rs (the ``deltalake``
package) and pyarrow, the same rows as :func:`dblog.lake.current.current_state` gives in
Spark, for consumers of the lake that run no JVM (a service, a notebook, a job in another
engine). Nothing here starts Spark; the package's imports need pyspark installed only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dblog.core.errors import DblogError
from dblog.core.events import Op
from dblog.lake.current import MIRROR_ROW, mark_in_history
from dblog.lake.types import LSN_FLOOR, META_COLUMNS, TRUNCATE_OP, name_apart


def _newest_per_key(rows: pa.Table, key: list[str]) -> pa.Table:
    """The newest row (by ``_dblog_lsn``, ``_dblog_seq``) of every key of ``rows``."""
    ordered = rows.sort_by([(k, "ascending") for k in key]
                           + [(m, "ascending") for m in META_COLUMNS])
    n = ordered.num_rows
    if n <= 1:
        return ordered
    same = pa.array([True] * (n - 1))
    for k in key:
        column = ordered.column(k).combine_chunks()
        a, b = column.slice(0, n - 1), column.slice(1)
        equal = pc.fill_null(pc.equal(a, b), False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        same = pc.and_(same, pc.or_(equal, both_null))
    last = pa.concat_arrays([pc.invert(same), pa.array([True])])
    return ordered.filter(last)


def read_current_state(mirror_uri: str, changelog_uri: str, *,
                       storage_options: Mapping[str, str] | None = None) -> pa.Table:
    """The current state of the table whose lake tables are at ``mirror_uri`` and
    ``changelog_uri``: the mirror's latest version with every changelog row after that
    version's mark applied as the mirror's MERGE applies them (see
    :mod:`dblog.lake.current`). The mirror's columns and position columns, in no order."""
    try:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
    except ImportError as exc:
        raise DblogError("read_current_state needs the deltalake package: install "
                         "dblog-delta[readers] (pip install 'dblog-delta[readers]')") from exc

    options = dict(storage_options or {})
    try:
        mirror_table = DeltaTable(mirror_uri, storage_options=options)
    except TableNotFoundError as exc:
        raise DblogError(f"no mirror at {mirror_uri}: tail the source (and capture the "
                         "table) first") from exc
    version = mirror_table.version()
    key = json.loads(mirror_table.metadata().configuration.get("dblog.key", "[]"))
    if not key:
        raise DblogError(f"{mirror_uri} records no key (dblog.key): not a dblog mirror")
    mark = mark_in_history(mirror_table.history(), version)
    if mark is None:
        mark = LSN_FLOOR
    mirror = mirror_table.to_pyarrow_table()
    changes = DeltaTable(changelog_uri, storage_options=options).to_pyarrow_table(
        filters=[("_dblog_lsn", ">", mark)])
    truncates = changes.filter(pc.equal(changes.column("op"), TRUNCATE_OP))
    if truncates.num_rows:
        newest = max(zip(truncates.column("_dblog_lsn").to_pylist(),
                         truncates.column("_dblog_seq").to_pylist(), strict=True))

        def after_truncate(t: pa.Table) -> pa.Table:
            lsn, seq = t.column("_dblog_lsn"), t.column("_dblog_seq")
            return t.filter(pc.or_(pc.greater(lsn, newest[0]),
                                   pc.and_(pc.equal(lsn, newest[0]),
                                           pc.greater(seq, newest[1]))))

        mirror, changes = after_truncate(mirror), after_truncate(changes)
    changes = changes.filter(pc.not_equal(changes.column("op"), TRUNCATE_OP))
    columns = [c for c in mirror.column_names if c not in META_COLUMNS]
    after_type = changes.schema.field("after").type
    after_fields = [after_type.field(i).name for i in range(after_type.num_fields)]
    columns += [c for c in after_fields if c not in columns]
    is_delete = pc.equal(changes.column("op"), Op.DELETE.value)
    flat: dict[str, Any] = {}
    for c in columns:
        if c not in after_fields:
            flat[c] = pa.nulls(changes.num_rows, mirror.schema.field(c).type)
            continue
        value = pc.struct_field(changes.column("after"), c)
        if c in key:
            value = pc.if_else(is_delete, pc.struct_field(changes.column("before"), c), value)
        flat[c] = value
    for m in META_COLUMNS:
        flat[m] = changes.column(m)
    op = name_apart("_dblog_op", columns)  # a row's op beside the table's columns
    flat[op] = changes.column("op")
    held = mirror.append_column(op, pa.array([MIRROR_ROW] * mirror.num_rows, pa.string()))
    both = pa.concat_tables([held, pa.table(flat)], promote_options="permissive")
    newest = _newest_per_key(both, key)
    kept = newest.filter(pc.not_equal(newest.column(op), Op.DELETE.value))
    return kept.select([*columns, *META_COLUMNS])


__all__ = ["read_current_state"]
