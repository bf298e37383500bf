"""``deltawheel`` command line: one subcommand module per tool.

Each module of this package has ``register(subparsers)`` which adds its subcommands
and sets ``func`` (taking the parsed args, returning an exit code).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from deltawheel.statestore.exceptions import DeltaWheelError

__all__ = ["main", "build_parser"]



def build_parser() -> argparse.ArgumentParser:
    """The ``deltawheel`` argument parser: the subcommands of every module of this package."""
    parser = argparse.ArgumentParser(
        prog="deltawheel",
        description="MillWheel-style exactly-once state engine on Spark, Delta Lake and ZooKeeper.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from . import (
        bench,
        cluster,
        demo,
        gc,
        leases,
        migrate,
        objectstore,
        quickstart,
        rebalance,
        recover,
        report,
        reseed,
        scenario,
        sql,
        status,
        zk,
    )

    for mod in (demo, quickstart, zk, objectstore, cluster, migrate, sql, leases, rebalance, recover, reseed, gc, bench,
                scenario):  # --help order
        mod.register(sub)
    for mod in (status, report):
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``deltawheel`` command line ``argv`` (default: the process's); returns the exit status.

    A :class:`DeltaWheelError` is printed as one line and returns 2; Ctrl-C returns 130.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except DeltaWheelError as exc:
        print(f"deltawheel {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"deltawheel {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)

