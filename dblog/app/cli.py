"""The ``dblog`` command: tail, capture, pause/resume/cancel, status, verify,
repair, maintain."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from dblog.core.errors import ConfigError, DblogError

DEFAULT_CONFIG = "dblog.yaml"
TAIL_OUTAGE_PATIENCE_S = 300.0
"""How long a continuous ``dblog tail`` keeps trying while the source or ZooKeeper cannot
be reached (then it stops with the error)."""


def _config(args: argparse.Namespace) -> Any:
    from dblog.app.config import load_config

    return load_config(args.config)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _tail(args: argparse.Namespace) -> int:
    from dblog.app.runtime import open_runtime
    from dblog.core.errors import LeadershipLost, LockHeld
    from dblog.core.outage import unreachable

    if args.no_final_merge and not args.until_caught_up:
        raise DblogError("--no-final-merge goes with --until-caught-up (a continuous tail "
                         "merges the mirrors every tail.mirror_every_s)")
    config = _config(args)
    stop = _stop_on_signals()
    with open_runtime(config, patience_s=args.wait_for_services) as rt:

        def report(b: Any) -> None:
            if b.mirror_only:
                merged = ", ".join(f"{t} ({n} rows)" for t, n in b.mirrors.items())
                print(f"mirrors merged through batch {b.batch}: {merged}", flush=True)
                return
            print(f"batch {b.batch}: {b.events} events, {len(b.emitted_windows)} chunks "
                  f"({b.rows_emitted} rows) emitted, lsn {b.position.lsn}", flush=True)

        # A continuous tail stands by while another one runs (active-passive); a one-off
        # run gives up after --lock-wait seconds (5 by default).
        wait = args.lock_wait
        if wait is None and (args.until_caught_up or args.from_head):
            wait = 5.0
        # Spark is set up before standing by, so a take-over starts writing at once.
        tailer = rt.tailer(on_batch=report)

        def standing_by(holder: str | None) -> None:
            # Said each time the wait begins, also when it begins after a ZooKeeper outage.
            print(f"tail: standing by, the tailer lock is held by "
                  f"{holder or 'a tailer that just left'}", flush=True)

        outage_began: float | None = None
        while True:
            began = time.monotonic()
            try:
                summary = tailer.run(stop=stop, until_caught_up=args.until_caught_up,
                                     merge_at_end=not args.no_final_merge,
                                     reset_to_head=args.from_head, lock_timeout=wait,
                                     on_standby=standing_by)
                break
            except LockHeld:
                if wait is None and stop.is_set():
                    print("tail: stopped while standing by")
                    return 0
                raise
            except LeadershipLost as exc:
                # A ZooKeeper session interrupted (a node of the ensemble lost, a pause):
                # nothing more was written; stand by again, and go on if the lock is still
                # free (the session survived), or follow whoever took over.
                if wait is not None or stop.is_set():
                    raise
                print(f"tail: {exc}; standing by again", flush=True)
                tailer = rt.tailer(on_batch=report)
            except Exception as exc:
                # The source or ZooKeeper restarting: a continuous tail tries again (from
                # its committed position) for TAIL_OUTAGE_PATIENCE_S in a row.
                reason = unreachable(exc)
                now = time.monotonic()
                if outage_began is None or now - began > 10.0:
                    outage_began = now
                if (reason is None or wait is not None or stop.is_set()
                        or now - outage_began > TAIL_OUTAGE_PATIENCE_S):
                    raise
                print(f"tail: {reason}; trying again", flush=True)
                stop.wait(2.0)
                tailer = rt.tailer(on_batch=report)
        if args.from_head:
            print("tail: position reset to the head of the log; run `dblog capture` next")
    print(f"tailed {summary.events} events in {summary.batches} batches")
    return 0


def _capture(args: argparse.Namespace) -> int:
    from dblog.app.runtime import open_runtime
    from dblog.capture import plan_request

    config = _config(args)
    tables = args.tables or [str(t) for t in config.table_ids]
    for t in tables:
        config.table(t)
    request = plan_request(tables, args.keys, args.where)
    stop = _stop_on_signals()
    with open_runtime(config, patience_s=args.wait_for_services) as rt:
        capturer = rt.capturer()
        capture_id = capturer.plan(request)
        print(f"capture {capture_id}: {', '.join(tables)}", flush=True)
        return _run_captures(rt, [capture_id], stop)


def _run_captures(rt: Any, capture_ids: Sequence[str], stop: threading.Event) -> int:
    """Run captures to the end with an in-process (standby) tailer; 0 if all are done."""
    from dblog.tail.background import BackgroundTailer

    def progress(r: Any) -> None:
        print(f"  {r.table} range {r.range_id}: {r.chunks} chunks, "
              f"{r.rows_selected} rows selected, {r.status}", flush=True)

    reports = []
    with BackgroundTailer(rt.tailer()) as bg:
        capturer = rt.capturer()
        capturer.health_check = bg.check
        for capture_id in capture_ids:
            reports += capturer.run(capture_id, stop=stop, on_progress=progress)
    for r in reports:
        print(f"{r.table} [{r.range_id}] {r.status}: {r.rows_emitted} rows emitted, "
              f"{r.rows_dropped} dropped by windows, {r.chunks} chunks, {r.seconds:.1f}s")
    return 0 if all(r.status == "done" for r in reports) else 3


def _set_status(args: argparse.Namespace) -> int:
    from dblog.app.runtime import open_runtime

    config = _config(args)
    table = config.table(args.table).table
    target = {"pause": "paused", "resume": "running", "cancel": "cancelled"}[args.command]
    with open_runtime(config, validate=args.command == "resume",
                      patience_s=args.wait_for_services) as rt:
        for found in rt.state.list_captures():
            cap = found.value
            if table not in cap.tables or cap.status in ("done", "cancelled", target):
                continue
            rt.state.set_capture_status(cap.capture_id, target, found.version)  # type: ignore[arg-type]
            print(f"capture {cap.capture_id}: {cap.status} -> {target}")
            if target == "cancelled":
                # Its open windows would otherwise pin the tailer's restart position.
                aborted = rt.state.abort_open_windows(cap.capture_id, "the capture was cancelled")
                if aborted:
                    print(f"capture {cap.capture_id}: {len(aborted)} open windows aborted")
        if target != "running":
            return 0
        runnable = [f.value.capture_id for f in rt.state.list_captures()
                    if f.value.status == "running" and table in f.value.tables]
        if not runnable:
            print(f"no unfinished capture of {table}")
            return 1
        return _run_captures(rt, runnable, _stop_on_signals())


def _status(args: argparse.Namespace) -> int:
    from dblog.app.runtime import open_runtime
    from dblog.app.status import render_status

    config = _config(args)
    with open_runtime(config, validate=False, patience_s=args.wait_for_services) as rt:
        render_status(rt)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from dblog.app.runtime import open_runtime
    from dblog.app.verify import verify_table

    config = _config(args)
    tables = [config.table(t).table for t in args.tables] if args.tables else config.table_ids
    with open_runtime(config, patience_s=args.wait_for_services) as rt:
        reports = [verify_table(rt.dialect, rt.sink, t, current=args.current) for t in tables]
    for r in reports:
        print(r.summary())
    bad = [r for r in reports if not r.ok]
    print("verify: OK" if not bad else f"verify: {len(bad)} table(s) differ")
    return 0 if not bad else 1


_ROW = "{:<28} {:<26} {:>12} {:>12}  {:<10} {:>8}"


def _repair(args: argparse.Namespace) -> int:
    """One paced pass over the tables (or a continuous walk): compare range by range,
    capture the ranges that still differ. 0: all equal or repaired; 1: a dry run found
    differences; 2: an error, or a capture that did not finish."""
    from dblog.app.repair import Repairer, repair_table
    from dblog.app.runtime import open_runtime
    from dblog.tail.background import BackgroundTailer

    if args.all and (args.dry_run or args.continuous):
        raise DblogError("--all captures every range without comparing: not with "
                         "--dry-run or --continuous")
    config = _config(args)
    tables = [config.table(t).table for t in args.tables] if args.tables else config.table_ids
    stop = _stop_on_signals()
    seen: dict[str, int] = {"ranges": 0, "rows": 0, "differing": 0, "repaired": 0,
                            "unrepaired": 0}

    def row(r: Any) -> None:
        seen["ranges"] += 1
        seen["rows"] += r.first.source_rows
        if r.outcome != "equal":
            seen["differing"] += 1
        if r.outcome in ("repaired", "unrepaired"):
            seen[r.outcome] += 1
        print(_ROW.format(str(r.table), r.name, r.first.source_rows, r.first.mirror_rows,
                          r.outcome, f"{r.seconds:.1f}"), flush=True)

    def differs(table: Any, step: Any, c: Any) -> None:
        doing = "" if args.dry_run else "; capturing it"
        print(f"  {table} {step.name}: differs (source {c.source_rows} rows, mirror "
              f"{c.mirror_rows} rows){doing}", flush=True)

    def passed(table: Any, summary: Any) -> None:
        print(f"pass {summary['pass']} of {table}: {summary['ranges']} ranges, "
              f"{summary['rows']} source rows, {summary['differing']} differing, "
              f"{summary['repaired']} repaired in {summary['seconds']:.1f}s", flush=True)

    began = time.monotonic()
    with (open_runtime(config, patience_s=args.wait_for_services) as rt,
          BackgroundTailer(rt.tailer()) as bg):
        # Every comparison waits for the tailer to pass the database's snapshot: wait for
        # it once here, so a range's seconds are its own.
        rt.wait_caught_up(bg.check, timeout=600)
        if args.all:
            for table in tables:
                report = repair_table(rt, table, capture_all=True, stop=stop,
                                      health_check=bg.check)
                for name, c in report.captures.items():
                    print(f"{table} {name}: {c.status}, {c.rows_emitted} rows emitted, "
                          f"{c.rows_deleted} deleted", flush=True)
                seen["repaired"] += len(report.repaired)
                seen["unrepaired"] += len(report.unrepaired)
        else:
            repairer = Repairer(rt, dry_run=args.dry_run, stop=stop, health_check=bg.check,
                                on_differs=differs, on_result=row)
            print(_ROW.format("TABLE", "RANGE", "SOURCE ROWS", "MIRROR ROWS", "RESULT",
                              "SECONDS"), flush=True)
            if args.continuous:
                repairer.continuously(tables, on_pass=passed)
            else:
                for table in tables:
                    if not stop.is_set():
                        repairer.one_pass(table)
    dry = " (dry run)" if args.dry_run else ""
    stopped = " (stopped)" if stop.is_set() else ""
    print(f"repair{dry}{stopped}: {seen['ranges']} ranges of {len(tables)} table(s), "
          f"{seen['rows']} source rows, {seen['differing']} differing, {seen['repaired']} "
          f"repaired, {seen['unrepaired']} unrepaired in {time.monotonic() - began:.1f}s",
          flush=True)
    if seen["unrepaired"]:
        print("dblog: error: the captures of some differing ranges did not finish (see "
              "above); run the repair again", file=sys.stderr)
        return 2
    return 1 if args.dry_run and seen["differing"] else 0


def _maintain(args: argparse.Namespace) -> int:
    import socket

    from dblog.app.runtime import open_runtime
    from dblog.core.errors import LockHeld
    from dblog.state.handoff import pending_chunk_tables

    config = _config(args)
    tables = [config.table(t).table for t in args.tables] if args.tables else config.table_ids
    with open_runtime(config, patience_s=args.wait_for_services) as rt:
        try:
            with rt.state.tailer_lock(f"maintain@{socket.gethostname()}", timeout=5.0):
                pending = pending_chunk_tables(rt.state) if args.vacuum else set()
                for table in tables:
                    keep = pending is None or table in pending
                    print(rt.sink.maintain(table, vacuum=args.vacuum,
                                           keep_uncommitted=keep).summary(), flush=True)
        except LockHeld as exc:
            raise DblogError(
                f"{exc}: a running tailer compacts its tables itself every "
                "tail.maintain_every_s; run `dblog maintain` while no tailer runs") from exc
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dblog", description=__doc__)
    parser.add_argument("--config", "-c", default=DEFAULT_CONFIG,
                        help=f"YAML configuration (default: {DEFAULT_CONFIG})")
    parser.add_argument("--verbose", "-v", action="store_true")
    parser.add_argument("--wait-for-services", type=float, default=0.0, metavar="SECONDS",
                        help="at start, try the source and ZooKeeper again for up to SECONDS "
                             "while they cannot be reached (services still starting, as "
                             "under a supervisor that restarts everything); default: fail "
                             "at once")
    sub = parser.add_subparsers(dest="command", required=True)

    tail = sub.add_parser("tail", help="tail the source log into Delta (the one ordered writer)")
    tail.add_argument("--until-caught-up", action="store_true",
                      help="stop once the log has no more events")
    tail.add_argument("--no-final-merge", action="store_true",
                      help="with --until-caught-up: stop as soon as the changelog holds the "
                           "log, without merging the mirrors first (the next tail merges "
                           "them; `dblog verify --current` and current_state() read the "
                           "current state meanwhile)")
    tail.add_argument("--from-head", action="store_true",
                      help="forget the stored position and start at the head of the log "
                           "(after the log was purged; then run a capture)")
    tail.add_argument("--lock-wait", type=float, metavar="SECONDS", default=None,
                      help="how long to wait for a running tailer of the source to stop "
                           "(default: stand by as long as it runs and take over when it "
                           "stops or dies; 5 with --until-caught-up or --from-head)")
    tail.set_defaults(func=_tail)

    cap = sub.add_parser("capture", help="full-state capture of tables (DBLog chunks)")
    cap.add_argument("tables", nargs="*", metavar="TABLE", help="DATABASE.TABLE (default: all)")
    cap.add_argument("--keys", nargs="+", metavar="KEY",
                     help="only these primary keys (composite: comma-separated values)")
    cap.add_argument("--where", help="only rows matching this SQL filter")
    cap.set_defaults(func=_capture)

    for name, text in (("pause", "pause captures of a table"),
                       ("resume", "resume paused captures of a table (and run them)"),
                       ("cancel", "cancel captures of a table")):
        p = sub.add_parser(name, help=text)
        p.add_argument("table", metavar="TABLE")
        p.set_defaults(func=_set_status)

    st = sub.add_parser("status", help="capture progress, log position and lag")
    st.set_defaults(func=_status)

    ver = sub.add_parser("verify", help="compare mirror with the source (exit 1 on mismatch)")
    ver.add_argument("tables", nargs="*", metavar="TABLE")
    ver.add_argument("--current", action="store_true",
                     help="compare the current state (the mirror with the changelog rows "
                          "it has not merged yet applied) instead of the mirror")
    ver.set_defaults(func=_verify)

    rep = sub.add_parser("repair", help="compare mirror and source range by range, paced "
                         "(repair.max_rows_per_s), and capture the ranges that differ")
    rep.add_argument("tables", nargs="*", metavar="TABLE", help="DATABASE.TABLE (default: all)")
    rep.add_argument("--dry-run", action="store_true",
                     help="compare and report only (exit 1 when a range differs)")
    rep.add_argument("--all", action="store_true",
                     help="capture every range without comparing")
    rep.add_argument("--continuous", action="store_true",
                     help="walk the tables for ever, one range at a time, from the place "
                          "kept in ZooKeeper (SIGINT/SIGTERM stop it at a range boundary)")
    rep.set_defaults(func=_repair)

    mnt = sub.add_parser("maintain", help="compact the changelog and mirror files (takes the "
                         "tailer lock: a running tailer does it itself)")
    mnt.add_argument("tables", nargs="*", metavar="TABLE")
    mnt.add_argument("--vacuum", action="store_true",
                     help="also delete files older than Delta's retention (7 days) that no "
                          "version within it needs")
    mnt.set_defaults(func=_maintain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run one ``dblog`` command; errors print one line and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"dblog: config error: {exc}", file=sys.stderr)
        return 2
    except DblogError as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
