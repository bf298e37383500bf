"""``deltawheel leases show|break``: inspect and break key-interval leases; ``deltawheel rebalance``: who
holds a computation's intervals, who should, and a move request the instances apply between batches."""

from __future__ import annotations

import argparse
from dataclasses import replace

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk import members
from deltawheel.statestore.zk.lease_tools import break_lease, list_leases, pipeline_chroots

from .common import add_json_arg, add_optional_store, add_pipeline_arg, connected, print_json, zk_client

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``leases show``, ``leases break`` and ``rebalance``."""
    leases = subparsers.add_parser("leases", help="show key-interval leases, break a stuck one")
    sub = leases.add_subparsers(dest="leases_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="every interval with its owner and sequencer")
    add_pipeline_arg(show, required=False)
    add_json_arg(show)
    add_optional_store(show)
    show.set_defaults(func=_show)
    brk = sub.add_parser("break", help="delete an interval's owner znode (dry run unless --apply)")
    add_pipeline_arg(brk)
    brk.add_argument("--computation", required=True)
    brk.add_argument("--interval", type=int, required=True)
    brk.add_argument("--apply", action="store_true", help="really break it (default: print the plan)")
    add_optional_store(brk)
    brk.set_defaults(func=_break)
    p = subparsers.add_parser("rebalance", help="show interval owners vs the target; request a move of intervals")
    add_pipeline_arg(p)
    p.add_argument("--computation", help="only this computation (required with --assign / --clear)")
    p.add_argument("--assign", action="append", default=[], metavar="INSTANCE=I,J-K",
                   help="the intervals an instance should hold (repeat per instance); writes a move request")
    p.add_argument("--clear", action="store_true", help="delete the move request: back to the members' split")
    p.add_argument("--plan", action="store_true", help="print what would change, write nothing")
    add_optional_store(p)
    p.set_defaults(func=_rebalance)


def _show(args: argparse.Namespace) -> int:
    with zk_client(args) as (cfg, client):
        rows = list_leases(client, pipeline=args.pipeline)
        others = []
        if not rows:
            with connected(replace(cfg, chroot="/"), args.zk_timeout) as root:
                others = pipeline_chroots(root, cfg.chroot, args.pipeline)
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        what = f"pipeline {args.pipeline!r}" if args.pipeline else "pipelines"
        print(f"no leases (no {what} under ZooKeeper chroot {cfg.chroot} at {cfg.hosts})")
        if others:
            found = ", ".join(f"{chroot} ({', '.join(names)})" for chroot, names in others)
            print(f"{what} found under other chroots: {found}; pass --zk-chroot {others[0][0]}")
        return 0
    print(f"{'PIPELINE':<16} {'COMPUTATION':<20} {'INTERVAL':>8} {'SEQ':>10} {'LAST_SEQ':>10}  OWNER")
    for r in rows:
        seq, last = ("-" if r[k] is None else r[k] for k in ("sequencer", "last_sequencer"))
        owner = "(free)" if r["owner"] is None else f"{r['owner']} session {r['session']}"
        print(f"{r['pipeline']:<16} {r['computation']:<20} {r['interval']:>8} {seq:>10} {last:>10}  {owner}")
    return 0


def _break(args: argparse.Namespace) -> int:
    with zk_client(args) as (_, client):
        plan = break_lease(client, pipeline=args.pipeline, computation=args.computation,
                           interval=args.interval, apply=args.apply)
    where = f"{args.pipeline}/{args.computation} interval {args.interval}"
    if not plan["held"]:
        print(f"{where}: no owner, nothing to break")
    elif plan["applied"]:
        print(f"{where}: broke the lease of {plan['owner']!r} (sequencer {plan['sequencer']}, "
              f"session {plan['session']})")
    elif args.apply:
        print(f"{where}: {plan['action']}")
        return 1
    else:
        print(f"{where}: held by {plan['owner']!r} (sequencer {plan['sequencer']}, session {plan['session']})")
        print(f"dry run: would {plan['action']}; re-run with --apply to do it")
    return 0


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
