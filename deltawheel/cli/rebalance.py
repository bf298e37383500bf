"""``deltawheel rebalance``: who holds a computation's intervals, who should (``statestore/zk/members.py``),
and a move request that overrides it, applied by the instances between batches."""

from __future__ import annotations

import argparse

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk import members
from deltawheel.statestore.zk.lease_tools import list_leases

from .common import add_optional_store, add_pipeline_arg, zk_client

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``rebalance``."""
    p = subparsers.add_parser("rebalance", help="show interval owners vs the target; request a move of intervals")
    add_pipeline_arg(p)
    p.add_argument("--computation", help="only this computation (required with --assign / --clear)")
    p.add_argument("--assign", action="append", default=[], metavar="INSTANCE=I,J-K",
                   help="the intervals an instance should hold (repeat per instance); writes a move request")
    p.add_argument("--clear", action="store_true", help="delete the move request: back to the members' split")
    p.add_argument("--plan", action="store_true", help="print what would change, write nothing")
    add_optional_store(p)
    p.set_defaults(func=_rebalance)


def _rebalance(args: argparse.Namespace) -> int:
    if (args.assign or args.clear) and not args.computation:
        raise ConfigError("--assign and --clear need --computation (a move request is per computation)")
    assignment = members.parse_assign(args.assign)
    with zk_client(args) as (_, client):
        live = members.live_members(client, args.pipeline)
        print(f"live instances of {args.pipeline}: {', '.join(live) or '(none)'}")
        rows = [r for r in list_leases(client, pipeline=args.pipeline)
                if args.computation is None or r["computation"] == args.computation]
        comps = sorted({r["computation"] for r in rows} | ({args.computation} if args.computation else set()))
        for comp in comps:
            mine = [r for r in rows if r["computation"] == comp]
            n = max((r["interval"] for r in mine), default=-1) + 1
            want = {iv: m for m, ivs in members.target(client, args.pipeline, comp, n).items() for iv in ivs}
            move = members.read_move(client, args.pipeline, comp)
            print(f"{comp}: {n} intervals" + (f"; move request {move}" if move else "; no move request"))
            for r in mine:
                held = "(free)" if r["owner"] is None else r["owner"]
                print(f"  interval {r['interval']:>5}: held by {held:<28} target {want.get(r['interval'], '-')}")
            if assignment and comp == args.computation:
                if args.plan:
                    print(f"plan: would request {assignment} (instances apply it between batches)")
                else:
                    members.request_move(client, args.pipeline, comp, assignment)
                    print(f"requested {assignment}; instances apply it between batches while all named are live")
            elif args.clear and comp == args.computation:
                if args.plan:
                    print("plan: would delete the move request (back to the members' split)")
                else:
                    cleared = members.clear_move(client, args.pipeline, comp)
                    print("move request deleted" if cleared else "no move request")
    return 0
