"""``deltawheel status``: how a store's pipelines are doing, as text or JSON in the terminal
(what it shows: ``executor/drivers/status.py``)."""

from __future__ import annotations

import argparse
import json

from .common import add_store_arg, add_zk_args, store_status
from .statustext import render

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``status``."""
    p = subparsers.add_parser("status", help="owners, watermarks and lag, last batches, dead letters per computation")
    add_store_arg(p)
    p.add_argument("--pipeline", help="only this pipeline")
    p.add_argument("--batches", type=int, default=3, metavar="N", help="last batches shown per computation (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_zk_args(p, timeout=True)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    st = store_status(args)
    if args.json:
        print(json.dumps(st.__dict__, indent=2, default=str))
    else:
        print(render(st, batches=args.batches))
    return 0
