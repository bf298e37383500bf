"""``deltawheel status``: how a store's pipelines are doing, as text or JSON in the terminal
(what it shows: ``executor/drivers/status.py``)."""

from __future__ import annotations

import argparse
import json

from ..drivers.status import gather
from .common import add_store_arg, add_zk_args, store_zookeeper
from .statustext import render

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``status``."""
    p = subparsers.add_parser("status", help="owners, watermarks and lag, last batches, dead letters per computation")
    add_store_arg(p)
    p.add_argument("--pipeline", help="only this pipeline")
    p.add_argument("--batches", type=int, default=3, metavar="N", help="last batches shown per computation (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_zk_args(p)
    p.add_argument("--zk-timeout", type=float, default=10.0, help="seconds to wait for ZooKeeper")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from .common import existing_layout_from, spark_from

    layout = existing_layout_from(args)
    spark = None if layout.is_local else spark_from(args)
    with store_zookeeper(args) as (layout, _cfg, client):
        st = gather(layout, client, pipeline=args.pipeline, spark=spark)
    if args.json:
        print(json.dumps(st.__dict__, indent=2, default=str))
    else:
        print(render(st, batches=args.batches))
    return 0
