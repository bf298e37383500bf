"""``deltawheel leases show|break``: inspect key-interval leases and break them."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.zk.lease_tools import break_lease, list_leases

from .common import add_optional_store, add_zk_args, connected, zk_client

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``leases show`` and ``leases break``."""
    leases = subparsers.add_parser("leases", help="show key-interval leases, break a stuck one")
    sub = leases.add_subparsers(dest="leases_command", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="every interval with its owner and sequencer")
    show.add_argument("--pipeline", help="only this pipeline")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_optional_store(show)
    add_zk_args(show, timeout=True)
    show.set_defaults(func=_show)
    brk = sub.add_parser("break", help="delete an interval's owner znode (dry run unless --apply)")
    brk.add_argument("--pipeline", required=True)
    brk.add_argument("--computation", required=True)
    brk.add_argument("--interval", type=int, required=True)
    brk.add_argument("--apply", action="store_true", help="really break it (default: print the plan)")
    add_optional_store(brk)
    add_zk_args(brk, timeout=True)
    brk.set_defaults(func=_break)


def _show(args: argparse.Namespace) -> int:
    with zk_client(args) as (cfg, client):
        rows = list_leases(client, pipeline=args.pipeline)
        others = [] if rows else _pipeline_chroots(cfg, args.pipeline, timeout_s=args.zk_timeout)
    if args.json:
        print(json.dumps(rows, indent=2))
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
        seq = "-" if r["sequencer"] is None else r["sequencer"]
        last = "-" if r["last_sequencer"] is None else r["last_sequencer"]
        owner = "(free)" if r["owner"] is None else f"{r['owner']} session {r['session']}"
        print(f"{r['pipeline']:<16} {r['computation']:<20} {r['interval']:>8} {seq:>10} {last:>10}  {owner}")
    return 0


def _pipeline_chroots(cfg: ZkConfig, pipeline: str | None, *, timeout_s: float,
                      max_depth: int = 3, max_nodes: int = 500) -> list[tuple[str, list[str]]]:
    """The other chroots holding deltawheel pipelines (only ``pipeline`` when given), by a bounded walk."""
    found: list[tuple[str, list[str]]] = []
    with connected(replace(cfg, chroot="/"), timeout_s) as root:
        level, seen = [""], 0
        for _ in range(max_depth):
            below = []
            for path in level:
                for child in sorted(root.get_children(path or "/")):
                    node = f"{path}/{child}"
                    seen += 1
                    if node == "/zookeeper" or seen > max_nodes:
                        continue
                    if child == "pipelines" and path and path != cfg.chroot:
                        names = sorted(root.get_children(node))
                        names = [n for n in names if pipeline is None or n == pipeline]
                        if names:
                            found.append((path, names))
                    else:
                        below.append(node)
            level = below
    return found


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
