"""``deltawheel scenario FILE``: replay a windowing scenario, print its panes (SCENARIO_FORMAT.md)."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def _scenario(args: argparse.Namespace) -> int:
    from deltawheel.executor.windowing.harness import run_scenario

    out = run_scenario(args.file, backend=args.backend)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``scenario`` subcommand to ``subparsers``."""
    p = subparsers.add_parser("scenario", help="replay a windowing scenario file and print its panes as JSON")
    p.add_argument("file", help="scenario JSON file (SCENARIO_FORMAT.md)")
    p.add_argument("--backend", default="memory", choices=["memory", "delta"],
                   help="store backend of the key rows (default memory)")
    p.set_defaults(func=_scenario)
