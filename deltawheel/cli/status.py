"""``deltawheel status`` (text or JSON) and ``deltawheel report`` (HTML plots): how a store's pipelines do."""

from __future__ import annotations

import argparse
from typing import Any

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``status`` and ``report``."""
    p = subparsers.add_parser("status", help="owners, watermarks and lag, last batches, dead letters per computation")
    common.add_store_arg(p)
    common.add_pipeline_arg(p, required=False)
    p.add_argument("--batches", type=int, default=3, metavar="N", help="last batches shown per computation (default 3)")
    common.add_json_arg(p)
    common.add_zk_args(p, timeout=True)
    p.set_defaults(func=_status)
    p = subparsers.add_parser("report", help="write a self-contained HTML page with plots of the store's pipelines")
    common.add_store_arg(p)
    p.add_argument("--out", required=True, help="the HTML file to write")
    common.add_pipeline_arg(p, required=False)
    common.add_zk_args(p, timeout=True)
    p.set_defaults(func=_report)


def _gather(args: argparse.Namespace) -> Any:
    from deltawheel.executor.drivers.status import gather

    layout = common.existing_layout_from(args)
    spark = None if layout.is_local else common.spark_from(args)
    with common.store_zookeeper(args) as (layout, _cfg, client):
        return gather(layout, client, pipeline=args.pipeline, spark=spark)


def _status(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.statustext import render

    st = _gather(args)
    if args.json:
        common.print_json(st.__dict__)
    else:
        print(render(st, batches=args.batches))
    return 0


def _report(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.report import write_report

    st = _gather(args)
    path = write_report(st, args.out)
    print(f"wrote {path} ({len(st.batches)} batches, {len(st.computations())} computations)")
    return 0
