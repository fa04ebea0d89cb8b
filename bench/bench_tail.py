"""Tail speed: ``dblog tail --until-caught-up`` against the bare mysql-replication loop, on the
same binlog range.

Generates, on the server (stored procedures, autocommit), a binlog range of ``--events`` row
events on one table (ten columns of several types, ~150 bytes/row; half inserts of new rows,
half updates of existing ones) in two shapes:

* ``single``: single-row autocommit transactions (OLTP);
* ``batch100``: 100-row transactions (one INSERT ... SELECT or one UPDATE of 100 keys each).

Then, on that exact range, in one process:

* baseline: the bare ``BinLogStreamReader`` loop with its fastest honest settings (only rows
  events, ``only_tables``/``only_schemas``, ``freeze_schema``, no logging, ``end_log_pos``;
  every row decoded, nothing written);
* dblog's log reader alone (``reader alone``): the transactions and events the tailer gets,
  every row decoded and converted, nothing written;
* dblog: ``Tailer.run(until_caught_up=True, merge_at_end=False)`` (what ``dblog tail
  --until-caught-up --no-final-merge`` runs) from the position before the range, with the
  product's default tail settings, into Delta (the changelog appends, ZooKeeper commits, the
  mirror merged beside them when due): at its end the lake's current state (the mirror and
  the changelog rows it has not merged, :func:`dblog.lake.current.current_state`) is the
  source's, which the bench then checks (untimed); then a second run merges the mirror
  (``dblog tail --until-caught-up``), timed on its own. The tailer was started and wrote one
  small batch before, so the Delta tables exist.

Each shape is measured twice: ``cold``, in a JVM that has written only that small batch, and
``warm``, after ``--warmup-seconds`` of tailing generated traffic. A new JVM spends its first
minute or two compiling (measured: the JIT compiler threads took 0.9 of the two cores for the
first 30 s of a run of 7k-event batches, and a batch took a third of the time two minutes
later); a tailer runs for days, so ``warm`` is its speed, ``cold`` that of a fresh process
(``dblog tail --until-caught-up`` on a short range).

Prints row-events/s of each and dblog / baseline (the current state complete in the lake),
``merged / baseline`` (the run and the merge after it: the mirror table itself complete),
and writes ``bench/results/tail.json``. A tailer that runs on merges every
``tail.mirror_every_s`` beside its batches; a short range pays one MERGE at its end.

    .venv/bin/python -m bench.bench_tail [--events 100000] [--warmup-seconds 120] [--no-warm]
        [--smoke]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.common import (
    COLUMNS,
    RESULTS_DIR,
    TABLE,
    Profile,
    create_database,
    drop_database,
    fill,
    lake_dir,
    mariadb_version,
    pipeline_config,
    print_table,
    record_batches,
    remove_lake,
    row_exprs,
    run_id,
    server_id,
    table_facts,
    write_results,
)
from dblog.sources.mysql.binlog import binlog_file_index
from devtools import services
from devtools.sample import connect, q
from devtools.services import Endpoints

SHAPES = ("single", "batch100")
ROWS_PER_BATCH = 100


def procedures(db: str) -> list[str]:
    t = f"{q(db)}.{q(TABLE)}"
    update = (f"UPDATE {t} SET amount = amount + 1, score = score * 1.01, "  # noqa: S608
              "status = ELT(1 + i % 3, 'paid', 'shipped', 'new'), note = CONCAT('u', i) ")
    single = f"""CREATE PROCEDURE {q(db)}.gen_single(IN p_count INT, IN p_first BIGINT,
                                                    IN p_existing BIGINT)
    BEGIN
      DECLARE i INT DEFAULT 0;
      DECLARE x BIGINT;
      WHILE i < p_count DO
        IF i % 2 = 0 THEN
          SET x = p_first + i DIV 2;
          INSERT INTO {t} ({COLUMNS}) VALUES ({row_exprs('x')});
        ELSE
          {update} WHERE id = 1 + (i DIV 2) % p_existing;
        END IF;
        SET i = i + 1;
      END WHILE;
    END"""  # noqa: S608 - quoted identifiers and integers only
    batch = f"""CREATE PROCEDURE {q(db)}.gen_batch(IN p_count INT, IN p_first BIGINT,
                                                   IN p_existing BIGINT)
    BEGIN
      DECLARE i INT DEFAULT 0;
      DECLARE lo BIGINT;
      WHILE i < p_count DO
        IF i % 2 = 0 THEN
          INSERT INTO {t} ({COLUMNS}) SELECT {row_exprs('x')} FROM
            (SELECT p_first + (i DIV 2) * {ROWS_PER_BATCH} + k.n AS x
             FROM {q(db)}.k WHERE k.n < {ROWS_PER_BATCH}) s;
        ELSE
          SET lo = 1 + ((i DIV 2) * {ROWS_PER_BATCH}) % (p_existing - {ROWS_PER_BATCH});
          {update} WHERE id BETWEEN lo AND lo + {ROWS_PER_BATCH - 1};
        END IF;
        SET i = i + 1;
      END WHILE;
    END"""  # noqa: S608 - quoted identifiers and integers only
    return [single, batch]


def _gtid_seq(cur: Any) -> int | None:
    cur.execute("SELECT @@gtid_binlog_pos")
    pos = str(cur.fetchone()[0] or "")
    parts = [p for p in pos.split(",") if p]
    if len(parts) != 1:
        return None
    return int(parts[0].split("-")[-1])


def generate(ep: Endpoints, db: str, shape: str, events: int, first_new: int,
             existing: int) -> dict[str, Any]:
    """Write the range; returns its start and end binlog positions and what it holds."""
    conn = connect(ep, db)
    with conn.cursor() as cur:
        start, seq0 = _head(cur), _gtid_seq(cur)
        began = time.perf_counter()
        if shape == "single":
            cur.execute("CALL gen_single(%s, %s, %s)", (events, first_new, existing))
        else:
            cur.execute("CALL gen_batch(%s, %s, %s)",
                        (max(1, events // ROWS_PER_BATCH), first_new, existing))
        seconds = time.perf_counter() - began
        end, seq1 = _head(cur), _gtid_seq(cur)
    conn.close()
    return {"start": start, "end": end, "generate_seconds": round(seconds, 1),
            "transactions": (seq1 - seq0) if seq0 is not None and seq1 is not None else None,
            "binlog_bytes": end["pos"] - start["pos"] if end["file"] == start["file"] else None}


def _head(cur: Any) -> dict[str, Any]:
    cur.execute("SHOW MASTER STATUS")
    row = cur.fetchone()
    return {"file": str(row[0]), "pos": int(row[1])}


def bare_loop(ep: Endpoints, db: str, start: dict[str, Any], end: dict[str, Any]
              ) -> dict[str, Any]:
    """The bare mysql-replication loop over ``[start, end)``: every row decoded, nothing else."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    same_file = start["file"] == end["file"]
    end_at = (binlog_file_index(end["file"]), end["pos"])
    began = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings={"host": ep.host, "port": ep.mariadb_port, "user": ep.user,
                             "password": ep.mariadb_password, "charset": "utf8mb4"},
        server_id=server_id(7970, 7984),
        log_file=start["file"], log_pos=start["pos"], resume_stream=True,
        blocking=False,  # the server ends the dump at the end of the log
        end_log_pos=end["pos"] if same_file else None,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_tables=[TABLE], only_schemas=[db],
        freeze_schema=True, is_mariadb=False, enable_logging=False,
    )
    rows = events = 0
    try:
        for event in stream:
            rows += len(event.rows)  # decodes every row image
            events += 1
            if not same_file and (binlog_file_index(stream.log_file),
                                  stream.log_pos) >= end_at:
                break
    finally:
        stream.close()
    seconds = time.perf_counter() - began
    return {"row_events": rows, "binlog_rows_events": events, "seconds": round(seconds, 3),
            "row_events_per_s": rows / seconds}


def reader_alone(rt: Any, db: str, start: dict[str, Any], end: dict[str, Any]
                 ) -> dict[str, Any]:
    """dblog's log reader alone over ``[start, end)``: transactions and events built as the
    tailer gets them (every row decoded and converted), nothing written."""
    from dblog.core.events import ChangeEvent, TableId

    end_at = (binlog_file_index(end["file"]), end["pos"])
    began = time.perf_counter()
    reader = rt.dialect.open_log(start, [TableId(db, TABLE)])
    rows = transactions = 0
    try:
        while True:
            txs = reader.read(max_transactions=2000, max_wait_s=1.0)
            transactions += len(txs)
            rows += sum(isinstance(i, ChangeEvent) for t in txs for i in t.items)
            here = reader.resume
            if not txs or (binlog_file_index(here["file"]), here["pos"]) >= end_at:
                break
    finally:
        reader.close()
    seconds = time.perf_counter() - began
    return {"row_events": rows, "transactions": transactions, "seconds": round(seconds, 3),
            "row_events_per_s": rows / seconds}


def dblog_tail(rt: Any, db: str, table: str = TABLE) -> dict[str, Any]:
    """One ``tail --until-caught-up --no-final-merge`` from the committed position (just
    before the range); then the current state of ``db.table`` checked against the source
    (untimed), and
    the mirror merged by a ``tail --until-caught-up`` (timed on its own)."""
    from dblog.app.verify import verify_table
    from dblog.core.events import TableId

    batches: list[tuple[int, float]] = []
    profile = Profile()
    for part, method in ((rt.sink.changelog, "_events_df"),
                         (rt.sink.changelog, "_commit_changelog"),
                         (rt.sink.merger, "_merge_mirror")):
        profile.wrap(part, method, f"sink.{method}")
    record = record_batches(batches)
    last_batch_at = 0.0

    def on_batch(report: Any) -> None:
        nonlocal last_batch_at
        record(report)
        if not report.mirror_only:
            last_batch_at = time.perf_counter()

    tailer = rt.tailer(on_batch=on_batch)
    began = time.perf_counter()
    try:
        summary = tailer.run(until_caught_up=True, merge_at_end=False)
    finally:
        profile.unwrap()
    seconds = time.perf_counter() - began
    write = sum(s for _, s in batches)
    changelog = (last_batch_at - began) if last_batch_at else seconds
    check = verify_table(rt.dialect, rt.sink, TableId(db, table), current=True)
    if not check.ok:
        raise SystemExit(f"the lake's current state differs from the source: {check.summary()}")
    merge_began = time.perf_counter()
    rt.tailer().run(until_caught_up=True)
    merge = time.perf_counter() - merge_began
    return {"row_events": summary.events, "batches": summary.batches,
            "seconds": round(seconds, 2), "row_events_per_s": summary.events / seconds,
            "changelog_seconds": round(changelog, 2),
            "changelog_row_events_per_s": summary.events / changelog,
            "current_state_rows": check.mirror_rows,
            "merge_after_seconds": round(merge, 2),
            "merged_row_events_per_s": summary.events / (seconds + merge),
            "delta_write_seconds": round(write, 2),
            "read_decode_seconds": round(seconds - write, 2),
            "max_batch_events": max((e for e, _ in batches), default=0),
            "profile": profile.summary()}


def warm_up(rt: Any, ep: Endpoints, db: str, seconds: float, next_id: int, prefill: int,
            per_round: int) -> int:
    """Tail generated single-row traffic (``per_round`` transactions a round) for
    ``seconds``; returns the next free id."""
    began = time.perf_counter()
    rounds = 0
    while rounds == 0 or time.perf_counter() - began < seconds:
        generate(ep, db, "single", per_round, next_id, prefill)
        next_id += per_round + 1
        rt.tailer().run(until_caught_up=True)
        rounds += 1
    print(f"  warm-up: {rounds} rounds of {per_round:,} transactions tailed in "
          f"{time.perf_counter() - began:.0f} s", flush=True)
    return next_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000,
                        help="row events per shape (single: that many transactions; "
                             "batch100: a hundredth as many)")
    parser.add_argument("--prefill", type=int, default=10_000,
                        help="rows in the table before the ranges (the updates' targets)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None,
                        help="result file (default bench/results/tail[-smoke].json)")
    parser.add_argument("--keep", action="store_true", help="keep the database and lake")
    parser.add_argument("--no-warm", action="store_true",
                        help="skip the warm measurements (they repeat the cold ones' code)")
    parser.add_argument("--warmup-seconds", type=float, default=120.0,
                        help="tail generated traffic this long between the cold and the warm "
                             "measurements")
    args = parser.parse_args(argv)
    if args.smoke:
        args.events, args.prefill, args.warmup_seconds = 2000, 1000, 1.0
    output = args.output or RESULTS_DIR / ("tail-smoke.json" if args.smoke else "tail.json")

    from dblog.app.runtime import open_runtime
    from dblog.app.spark import build_spark_session

    services.up()
    ep = services.endpoints()
    rid = run_id()
    db = f"bench_tail_{rid}"
    name = f"tail-{rid}"
    print(f"tail bench {rid}: {db}.{TABLE}, {args.prefill:,} rows first", flush=True)
    create_database(ep, db)
    fill(ep, db, args.prefill)
    conn = connect(ep, db)
    with conn.cursor() as cur:
        for ddl in procedures(db):
            cur.execute(ddl)
    conn.close()
    facts = table_facts(ep, db)
    spark = build_spark_session()
    config = pipeline_config(ep, name=name, tables=[f"{db}.{TABLE}"],
                             lake=lake_dir(name) / "lake", server_id=server_id(7985, 7999))
    results: list[dict[str, Any]] = []
    next_id = args.prefill + 1
    try:
        with open_runtime(config, spark=spark) as rt:
            try:
                # Warm-up: the first run stores the head as the position; a few rows then
                # create the Delta tables, so the measured runs only tail.
                rt.tailer().run(until_caught_up=True)
                fill(ep, db, 10, first=next_id)
                next_id += 10
                rt.tailer().run(until_caught_up=True)
                for jvm in ("cold",) if args.no_warm else ("cold", "warm"):
                    if jvm == "warm":
                        next_id = warm_up(rt, ep, db, args.warmup_seconds, next_id,
                                          args.prefill, min(20_000, args.events))
                    for shape in args.shapes:
                        print(f"  {shape} ({jvm}): generating {args.events:,} row events ...",
                              flush=True)
                        gen = generate(ep, db, shape, args.events, next_id, args.prefill)
                        next_id += args.events + 1
                        print(f"    {gen}", flush=True)
                        load = round(os.getloadavg()[0], 2)
                        base = bare_loop(ep, db, gen["start"], gen["end"])
                        base["loadavg_1m_before"] = load
                        print(f"    baseline {base}", flush=True)
                        alone = reader_alone(rt, db, gen["start"], gen["end"])
                        print(f"    reader   {alone}", flush=True)
                        load = round(os.getloadavg()[0], 2)
                        tail = dblog_tail(rt, db)
                        tail["loadavg_1m_before"] = load
                        print(f"    dblog    {tail}", flush=True)
                        results.append({
                            "shape": shape, "jvm": jvm, "range": gen, "baseline": base,
                            "dblog": tail, "reader_alone": alone,
                            "ratio": tail["row_events_per_s"] / base["row_events_per_s"],
                            "merged_ratio": (tail["merged_row_events_per_s"]
                                             / base["row_events_per_s"]),
                            "changelog_ratio": (tail["changelog_row_events_per_s"]
                                                / base["row_events_per_s"]),
                            "reader_ratio": (alone["row_events_per_s"]
                                             / base["row_events_per_s"]),
                        })
            finally:
                rt.state.delete("", recursive=True)
    finally:
        if not args.keep:
            drop_database(ep, db)
            remove_lake(name)
    print()
    print_table(
        ["shape", "JVM", "row events", "transactions", "baseline ev/s", "reader alone ev/s",
         "reader / baseline", "dblog ev/s", "dblog / baseline", "dblog s", "of which Delta s",
         "batches", "merge after s", "merged / baseline"],
        [[r["shape"], r["jvm"], r["baseline"]["row_events"], r["range"]["transactions"] or "?",
          r["baseline"]["row_events_per_s"], r["reader_alone"]["row_events_per_s"],
          r["reader_ratio"], r["dblog"]["row_events_per_s"], r["ratio"],
          r["dblog"]["seconds"], r["dblog"]["delta_write_seconds"], r["dblog"]["batches"],
          r["dblog"]["merge_after_seconds"], r["merged_ratio"]]
         for r in results],
    )
    parameters = {
        "events": args.events, "prefill": args.prefill, "shapes": args.shapes,
        "rows_per_batch_transaction": ROWS_PER_BATCH, "smoke": args.smoke,
        "warm": not args.no_warm,
        "warmup_seconds": args.warmup_seconds,
        "tail": {"batch_max_events": config.tail.batch_max_events,
                 "batch_max_seconds": config.tail.batch_max_seconds,
                 "poll_seconds": config.tail.poll_seconds},
        "spark_master": spark.conf.get("spark.master"),
    }
    path = write_results(output, "tail", parameters, results, {
        "table": {**facts, "columns": 10}, "mariadb": mariadb_version(ep),
    })
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
