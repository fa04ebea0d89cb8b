"""The ``dblog`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pipeline.errors import DblogError


def _services(args: argparse.Namespace) -> int:
    from pipeline import services

    action = {
        "up": services.up,
        "down": services.down,
        "status": services.status,
        "env": services.env_lines,
    }[args.action]
    for line in action():
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dblog", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    svc = sub.add_parser("services", help="local MariaDB, PostgreSQL and ZooKeeper on loopback")
    svc.add_argument("action", choices=["up", "down", "status", "env"])
    svc.set_defaults(func=_services)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run one ``dblog`` command; errors print one line and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except DblogError as exc:
        print(f"dblog: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
