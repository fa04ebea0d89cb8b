"""PostgreSQL tail speed: ``dblog tail --until-caught-up`` against bare psycopg2 decode loops
over the same WAL range.

Generates, on the server (a procedure committing in its loop), ``--events`` row events on one
table (ten columns of several types, ~150 bytes/row; half inserts of new rows, half updates
of existing ones) as single-row transactions (``single``) or 100-row transactions
(``batch100``). Then, on that range, in one process:

* baseline ``pgoutput``: a bare psycopg2 replication loop on a slot created just before the
  range, every message parsed down to column texts (dblog's own parser; nothing converted
  or written);
* ``wal2json`` (format 2): the same loop on a wal2json slot, every message ``json.loads``-ed:
  how the other plugin dblog could use decodes the same range (the plugin choice:
  docs/operations.md, "PostgreSQL sources");
* dblog: ``Tailer.run(until_caught_up=True, merge_at_end=False)`` from the position before
  the range, with the product's default tail settings, into Delta; then the mirror merged by
  another run (:func:`bench.bench_tail.dblog_tail`).

Prints row-events/s of each and the ratios, writes ``bench/results/pg-tail.json``.

    .venv/bin/python -m bench.bench_pg_tail [--events 100000] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extras

from bench.bench_tail import dblog_tail
from bench.common import (
    RESULTS_DIR,
    lake_dir,
    print_table,
    remove_lake,
    run_id,
    write_results,
)
from dblog.app.config import PipelineConfig, parse_config
from dblog.sources.postgres import pgoutput as po
from devtools import services
from devtools.services import Endpoints

SHAPES = ("single", "batch100")
ROWS_PER_BATCH = 100
DATABASE = "postgres"


def connect(ep: Endpoints, **kw: Any) -> Any:
    conn = psycopg2.connect(host=ep.host, port=ep.pg_port, user=ep.user,
                            password=ep.pg_password, dbname=DATABASE, **kw)
    if "connection_factory" not in kw:
        conn.autocommit = True
    return conn


def row_exprs(x: str) -> str:
    """The SELECT list of one generated row whose id is the SQL expression ``x``."""
    x = f"({x})::bigint"
    return (f"{x}, ({x} % 100000)::int,"
            f" 'customer-' || {x} || '-' || substr(md5({x}::text), 1, 12),"
            f" ({x} % 1000000) / 100.0, {x} * 0.37,"
            f" timestamptz '2020-01-01 00:00:00+00' + {x} * interval '1 second',"
            f" date '2020-01-01' + ({x} % 3650)::int,"
            f" (ARRAY['new', 'paid', 'shipped'])[1 + {x} % 3],"
            f" CASE WHEN {x} % 10 = 0 THEN NULL ELSE {x} * 2654435 END,"
            f" CASE WHEN {x} % 7 = 0 THEN NULL"
            f" ELSE md5({x}::text) || ' ' || repeat('x', ({x} % 20)::int) END")


def create(ep: Endpoints, schema: str, prefill: int) -> None:
    t = f'"{schema}".items'
    update = (f"UPDATE {t} SET amount = amount + 1, score = score * 1.01,"
              " status = (ARRAY['paid', 'shipped', 'new'])[1 + i % 3], note = 'u' || i")
    statements = [
        f'CREATE SCHEMA "{schema}"',
        f"CREATE TABLE {t} (id bigint PRIMARY KEY, account int NOT NULL,"
        " name varchar(64) NOT NULL, amount numeric(12,2) NOT NULL, score double precision,"
        " created timestamptz NOT NULL,"
        " day date, status text NOT NULL, flags bigint, note varchar(96))",
        f"ALTER TABLE {t} REPLICA IDENTITY FULL",
        f"INSERT INTO {t} SELECT {row_exprs('x')} FROM generate_series(1, {prefill}) x",
        f"""CREATE PROCEDURE "{schema}".gen_single(p_count int, p_first bigint, p_existing bigint)
        LANGUAGE plpgsql AS $$
        DECLARE i int := 0; x bigint;
        BEGIN
          WHILE i < p_count LOOP
            IF i % 2 = 0 THEN
              x := p_first + i / 2;
              INSERT INTO {t} SELECT {row_exprs('x')};
            ELSE
              {update} WHERE id = 1 + (i / 2) % p_existing;
            END IF;
            COMMIT;
            i := i + 1;
          END LOOP;
        END $$""",
        f"""CREATE PROCEDURE "{schema}".gen_batch(p_count int, p_first bigint, p_existing bigint)
        LANGUAGE plpgsql AS $$
        DECLARE i int := 0; lo bigint;
        BEGIN
          WHILE i < p_count LOOP
            IF i % 2 = 0 THEN
              INSERT INTO {t} SELECT {row_exprs('x')} FROM generate_series(
                p_first + (i / 2) * {ROWS_PER_BATCH}, p_first + (i / 2) * {ROWS_PER_BATCH}
                + {ROWS_PER_BATCH - 1}) x;
            ELSE
              lo := 1 + ((i / 2) * {ROWS_PER_BATCH}) % (p_existing - {ROWS_PER_BATCH});
              {update} WHERE id BETWEEN lo AND lo + {ROWS_PER_BATCH - 1};
            END IF;
            COMMIT;
            i := i + 1;
          END LOOP;
        END $$""",
    ]
    conn = connect(ep)
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
    conn.close()


def head(cur: Any) -> int:
    cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
    return int(cur.fetchone()[0])


def generate(ep: Endpoints, schema: str, shape: str, events: int, first_new: int,
             existing: int) -> dict[str, Any]:
    conn = connect(ep)
    with conn.cursor() as cur:
        start = head(cur)
        began = time.perf_counter()
        if shape == "single":
            cur.execute(f'CALL "{schema}".gen_single(%s, %s, %s)', (events, first_new, existing))
        else:
            cur.execute(f'CALL "{schema}".gen_batch(%s, %s, %s)',
                        (max(1, events // ROWS_PER_BATCH), first_new, existing))
        seconds = time.perf_counter() - began
        end = head(cur)
    conn.close()
    return {"start": start, "end": end, "generate_seconds": round(seconds, 1),
            "wal_bytes": end - start}


def bare_loop(ep: Endpoints, slot: str, plugin: str, options: dict[str, str],
              expected: int) -> dict[str, Any]:
    """Stream ``slot`` until ``expected`` row changes were decoded."""
    conn = connect(ep, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    began = time.perf_counter()
    cur.start_replication(slot_name=slot, decode=False, options=options)
    rows = 0
    idle_since = time.monotonic()
    while rows < expected:
        msg = cur.read_message()
        if msg is None:
            if time.monotonic() - idle_since > 30:
                raise RuntimeError(f"{plugin}: only {rows} of {expected} row changes arrived")
            select.select([cur], [], [], 0.01)
            continue
        idle_since = time.monotonic()
        if plugin == "pgoutput":
            parsed = po.parse(msg.payload)
            if isinstance(parsed, po.Insert | po.Update | po.Delete):
                rows += 1
        else:
            doc = json.loads(msg.payload, parse_float=Decimal)
            if doc["action"] in ("I", "U", "D"):
                rows += 1
    seconds = time.perf_counter() - began
    conn.close()
    return {"row_events": rows, "seconds": round(seconds, 3), "row_events_per_s": rows / seconds}


def config(ep: Endpoints, name: str, schema: str) -> PipelineConfig:
    os.environ.setdefault("DBLOG_PG_PASSWORD", ep.pg_password)
    return parse_config({
        "source": {"name": name, "kind": "postgres", "host": ep.host, "port": ep.pg_port,
                   "user": ep.user, "password_env": "DBLOG_PG_PASSWORD", "database": DATABASE},
        "tables": [f"{schema}.items"], "lake": str(lake_dir(name) / "lake"),
        "zookeeper": {"hosts": ep.zk_hosts, "root": f"dblog-bench-{name}"},
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--prefill", type=int, default=10_000)
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it works")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.events, args.prefill = 2000, 1000
    output = args.output or RESULTS_DIR / (
        "pg-tail-smoke.json" if args.smoke else "pg-tail.json")

    from dblog.app.runtime import open_runtime
    from dblog.app.spark import build_spark_session
    from dblog.sources.postgres.connection import default_slot

    services.up()
    ep = services.endpoints()
    rid = run_id()
    schema, name = f"bench_pgtail_{rid}", f"pgtail-{rid}"
    slots = {"pgoutput": f"bench_pgoutput_{rid}", "wal2json": f"bench_wal2json_{rid}"}
    print(f"pg tail bench {rid}: {schema}.items, {args.prefill:,} rows first", flush=True)
    create(ep, schema, args.prefill)
    conn = connect(ep)
    cur = conn.cursor()
    cur.execute(f'CREATE PUBLICATION "bench_{rid}" FOR TABLE "{schema}".items')
    spark = build_spark_session()
    cfg = config(ep, name, schema)
    results: list[dict[str, Any]] = []
    next_id = args.prefill + 1
    try:
        with open_runtime(cfg, spark=spark) as rt:
            try:
                rt.tailer().run(until_caught_up=True)
                cur.execute(f'INSERT INTO "{schema}".items SELECT {row_exprs("x")} FROM'  # noqa: S608
                            f" generate_series({next_id}, {next_id + 9}) x")
                next_id += 10
                rt.tailer().run(until_caught_up=True)
                for shape in args.shapes:
                    for plugin, slot in slots.items():
                        cur.execute("SELECT pg_create_logical_replication_slot(%s, %s)",
                                    (slot, plugin))
                    print(f"  {shape}: generating {args.events:,} row events ...", flush=True)
                    gen = generate(ep, schema, shape, args.events, next_id, args.prefill)
                    next_id += args.events + 1
                    print(f"    {gen}", flush=True)
                    base = bare_loop(ep, slots["pgoutput"], "pgoutput",
                                     {"proto_version": "1",
                                      "publication_names": f"bench_{rid}"}, args.events)
                    print(f"    pgoutput {base}", flush=True)
                    w2j = bare_loop(ep, slots["wal2json"], "wal2json",
                                    {"format-version": "2", "include-transaction": "1",
                                     "add-tables": f"{schema}.items"}, args.events)
                    print(f"    wal2json {w2j}", flush=True)
                    for slot in slots.values():
                        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    tail = dblog_tail(rt, schema, "items")
                    print(f"    dblog    {tail}", flush=True)
                    results.append({
                        "shape": shape, "range": gen, "baseline": base, "wal2json": w2j,
                        "dblog": tail,
                        "ratio": tail["row_events_per_s"] / base["row_events_per_s"],
                        "merged_ratio": (tail["merged_row_events_per_s"]
                                         / base["row_events_per_s"]),
                        "wal2json_ratio": w2j["row_events_per_s"] / base["row_events_per_s"],
                    })
            finally:
                rt.state.delete("", recursive=True)
    finally:
        for slot in [*slots.values(), default_slot(name)]:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                        " WHERE slot_name = %s AND NOT active", (slot,))
        cur.execute(f'DROP PUBLICATION IF EXISTS "bench_{rid}"')
        cur.execute(f'DROP PUBLICATION IF EXISTS "{default_slot(name)}"')
        cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()
        remove_lake(name)
    print()
    print_table(
        ["shape", "row events", "pgoutput ev/s", "wal2json ev/s", "dblog ev/s",
         "dblog / pgoutput", "wal2json / pgoutput", "dblog s", "of which Delta s", "batches",
         "merge after s", "merged / pgoutput"],
        [[r["shape"], r["baseline"]["row_events"], r["baseline"]["row_events_per_s"],
          r["wal2json"]["row_events_per_s"], r["dblog"]["row_events_per_s"], r["ratio"],
          r["wal2json_ratio"], r["dblog"]["seconds"], r["dblog"]["delta_write_seconds"],
          r["dblog"]["batches"], r["dblog"]["merge_after_seconds"], r["merged_ratio"]]
         for r in results],
    )
    parameters = {"events": args.events, "prefill": args.prefill, "shapes": args.shapes,
                  "rows_per_batch_transaction": ROWS_PER_BATCH, "smoke": args.smoke,
                  "spark_master": spark.conf.get("spark.master")}
    path = write_results(output, "pg-tail", parameters, results)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
