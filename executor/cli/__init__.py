"""``deltawheel`` command line: one subcommand module per tool.

Each module of this package has ``register(subparsers)`` which adds its subcommands
and sets ``func`` (taking the parsed args, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from deltawheel.statestore.exceptions import DeltaWheelError

__all__ = ["main", "build_parser"]

# Order is the order of --help.
_MODULES = (
    "demo",
    "quickstart",
    "zk",
    "migrate",
    "sql",
    "leases",
    "recover",
    "reseed",
    "gc",
    "bench",
    "scenario",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``deltawheel`` argument parser, with a subcommand from each CLI module present."""
    parser = argparse.ArgumentParser(
        prog="deltawheel",
        description="MillWheel-style exactly-once state engine on Spark, Delta Lake and ZooKeeper.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _MODULES:
        try:
            mod = importlib.import_module(f"deltawheel.executor.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"deltawheel.executor.cli.{name}":
                continue
            raise
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


if __name__ == "__main__":
    sys.exit(main())
