# ruff: noqa: S608 - test SQL is built from constants
"""Merge-on-read: a tail that ends without merging the mirrors leaves the current state
readable from the mirror and the changelog rows it lacks, equal to the source, and the
next merge makes the mirror exactly that state."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from dblog.app.config import parse_config
from dblog.app.runtime import open_runtime
from dblog.app.verify import verify_table
from dblog.core.errors import DblogError
from dblog.core.events import TableId
from dblog.lake.current import current_state
from dblog.lake.current_arrow import read_current_state
from devtools.sample import config_dict
from devtools.services import Endpoints
from tests.integration.helpers import execute, make_db

pytestmark = pytest.mark.integration


def test_the_current_state_holds_what_the_mirror_has_not_merged(
    services: Endpoints, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBLOG_MARIADB_PASSWORD", services.mariadb_password)
    # Columns named as the MERGE's and the readers' own work columns were (op, _rn) or
    # could be (_dblog_op, _dblog_rank) are the table's like any other.
    db = make_db(services, prefix="current", ddl=[
        "CREATE TABLE {db}.t (id INT, part CHAR(1), v VARCHAR(20), op VARCHAR(5) DEFAULT 'd', "
        "_rn INT DEFAULT 1, _dblog_op CHAR(1) DEFAULT 'd', _dblog_rank INT DEFAULT 2, "
        "PRIMARY KEY (id, part))"])
    table = TableId(db, "t")
    raw = config_dict(source=f"current-{uuid.uuid4().hex[:8]}", ep=services,
                      tables=[f"{db}.t"], lake=tmp_path / "lake", batch_seconds=0.3,
                      poll_seconds=0.2)
    raw["tail"].update(mirror_every_s=3600)  # the mirror merges only when a run ends
    with open_runtime(parse_config(raw), spark=spark) as rt:
        rt.tailer().run(until_caught_up=True)  # a first position, at the head
        execute(services, db, *[f"INSERT INTO t (id, part, v) VALUES ({i}, 'a', 'v{i}')"
                                for i in range(1, 7)])
        rt.tailer().run(until_caught_up=True)
        assert verify_table(rt.dialect, rt.sink, table).ok
        key = rt.sink.key_columns(table)
        assert key == ("id", "part")

        def tail_without_merging() -> None:
            mark = rt.sink.mirror_lsn(table)
            rt.tailer().run(until_caught_up=True, merge_at_end=False)
            assert rt.sink.mirror_lsn(table) == mark, "the run merged the mirror"
            lagging = verify_table(rt.dialect, rt.sink, table)
            assert not lagging.ok, "the mirror should lack the run's changes"
            current = verify_table(rt.dialect, rt.sink, table, current=True)
            assert current.ok, current.summary()
            # The same rows read without Spark (delta-rs and pyarrow).
            spark_rows = current_state(spark, rt.layout, table, key)
            arrow_rows = read_current_state(rt.layout.mirror(table), rt.layout.changelog(table))
            assert arrow_rows.column_names == spark_rows.columns
            assert (sorted(tuple(r.values()) for r in arrow_rows.to_pylist())
                    == sorted(tuple(r) for r in spark_rows.collect()))

        # Updates (one key twice), a delete, an insert then its delete, a new row and a key
        # changed by an UPDATE: per key the newest change wins, deletes leave no row.
        execute(services, db,
                "UPDATE t SET v = 'one' WHERE id = 1",
                "UPDATE t SET v = 'uno', op = 'c', _rn = 7, _dblog_op = 'u' WHERE id = 1",
                "DELETE FROM t WHERE id = 2",
                "INSERT INTO t (id, part, v) VALUES (7, 'a', 'seven')",
                "INSERT INTO t (id, part, v) VALUES (8, 'a', 'eight')",
                "DELETE FROM t WHERE id = 8",
                "UPDATE t SET part = 'b', v = 'moved' WHERE id = 3")
        tail_without_merging()
        # More on top of the unmerged changes: a TRUNCATE, then rows after it (one with a
        # key the mirror still holds from before it).
        execute(services, db, "UPDATE t SET v = 'before truncate' WHERE id = 4",
                "TRUNCATE TABLE t", "INSERT INTO t (id, part, v) VALUES (4, 'a', 'after')",
                "INSERT INTO t (id, part, v) VALUES (9, 'a', 'nine')",
                "UPDATE t SET v = 'new', _dblog_rank = 0 WHERE id = 9")
        tail_without_merging()

        state = current_state(spark, rt.layout, table, key)
        rt.tailer().run(until_caught_up=True)  # merges: the mirror becomes the same rows
        assert verify_table(rt.dialect, rt.sink, table).ok
        mirror = spark.read.format("delta").load(rt.layout.mirror(table))
        assert sorted(state.collect()) == sorted(mirror.select(*state.columns).collect())
        assert sorted(r["id"] for r in state.collect()) == [4, 9]
        after = current_state(spark, rt.layout, table, key)
        assert sorted(after.collect()) == sorted(state.collect())

    with pytest.raises(DblogError, match="has no mirror"):
        current_state(spark, rt.layout, TableId(db, "absent"), ("id",))
    absent = rt.layout.mirror(TableId(db, "absent"))
    with pytest.raises(DblogError, match="no mirror at"):
        read_current_state(absent, absent)

