"""``deltawheel leases show|break``: inspect key-interval leases and break them."""

from __future__ import annotations

import argparse
from dataclasses import replace

from deltawheel.statestore.zk.lease_tools import break_lease, list_leases, pipeline_chroots

from .common import add_json_arg, add_optional_store, add_pipeline_arg, connected, print_json, zk_client

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``leases show`` and ``leases break``."""
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
