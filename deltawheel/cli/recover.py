"""``deltawheel recover``: show undelivered checkpointed productions; ``--apply`` delivers them."""

from __future__ import annotations

import argparse
from typing import Any

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``recover`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "recover", help="show undelivered checkpointed productions; --apply delivers them (takes the leases)")
    common.add_store_arg(p)
    common.add_pipeline_arg(p)
    p.add_argument("--computation", action="append", default=None,
                   help="only this computation (repeatable; default: every one of the pipeline)")
    p.add_argument("--apply", action="store_true",
                   help="take the leases, deliver, give them back (default: print what is undelivered)")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for leases held by a running copy")
    common.add_json_arg(p)
    common.add_zk_spark_args(p, timeout=True)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.recover import computations_of, recover, scan

    with common.store_zookeeper(args) as (layout, _cfg, client):
        spark = common.spark_from(args)
        if not args.apply:
            return _show(scan(spark, layout, client, pipeline=args.pipeline, computations=args.computation),
                         as_json=args.json)
        found = computations_of(client, pipeline=args.pipeline, names=args.computation)
        results = []
        steps = common.Progress("recover", len(found))
        for name in sorted(found):
            if not args.json:
                steps.step(f"computation {name} ({found[name]} intervals)")
            r = recover(spark, layout, client, pipeline=args.pipeline, computation=name,
                        num_intervals=found[name], wait_s=args.wait,
                        progress=None if args.json else common.say)
            results.append(r)
            if not args.json:
                print(f"{name}: took intervals {', '.join(map(str, r.intervals))}; delivered "
                      f"{r.appended + r.merged} checkpointed productions ({r.appended} appended as their "
                      f"commit's delivery, {r.merged} insert-if-absent); leases given back")
        if args.json:
            common.print_json([{"computation": r.computation, "intervals": list(r.intervals),
                         "sequencers": {str(k): v for k, v in r.sequencers.items()},
                         "appended": r.appended, "merged": r.merged} for r in results])
        return 0


def _show(rows: list[Any], *, as_json: bool) -> int:
    if as_json:
        common.print_json([r.to_dict() for r in rows])
        return 0
    print(f"{'COMPUTATION':<20} {'INTERVAL':>8}  {'OWNER':<16} {'STREAM':<20} {'CHECKPOINTED':>12} {'UNDELIVERED':>11}")
    todo = 0
    for r in rows:
        owner = r.owner or "(free)"
        for s in sorted(r.checkpointed) or ["-"]:
            print(f"{r.computation:<20} {r.interval:>8}  {owner:<16} {s:<20} {r.checkpointed.get(s, 0):>12} "
                  f"{r.undelivered.get(s, 0):>11}")
        todo += sum(r.undelivered.values())
    if todo:
        print(f"{todo} checkpointed productions have not landed in their streams: run with --apply to deliver them")
    else:
        print("nothing to deliver: every checkpointed production has landed")
    return 0
