"""``deltawheel cluster fault cut|heal|kill|restart|show``: faults between the hosts of the test bed."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["register_fault"]


def register_fault(sub: Any, default_data: str) -> None:
    """Add ``cluster fault ...`` to the ``cluster`` subcommands ``sub`` (the test bed's folder: ``default_data``)."""
    fault = sub.add_parser("fault", help="inject a fault between hosts of the --hosts test bed: cut a host off "
                           "(whole or from some hosts), heal it, kill it whole, start what was killed")
    acts = fault.add_subparsers(dest="fault_command", metavar="FAULT")
    acts.required = True
    for name, help_text in (
        ("cut", "cut HOST off the bridge, or with --from only from those hosts (both ways; packets vanish)"),
        ("heal", "undo cuts of HOST: every one, or with --from only those"),
        ("kill", "SIGKILL every process of HOST (its network namespace's)"),
        ("restart", "start again every service of the test bed that does not run"),
        ("show", "list the cuts in place"),
    ):
        p = acts.add_parser(name, help=help_text)
        p.add_argument("--data", default=default_data,
                       help=f"the test bed's folder (default {default_data})")
        p.add_argument("--hosts", action="store_true", default=True, help="the --hosts test bed (the only choice)")
        if name in ("cut", "heal", "kill"):
            p.add_argument("host", help="s3, zk1, zk2, zk3, master, worker1, worker2 or client")
        if name in ("cut", "heal"):
            p.add_argument("--from", dest="peers", action="append", default=[], metavar="HOST",
                           help="a host to cut HOST off from (repeat, or separate with commas)")
        p.set_defaults(func=_fault)


def _fault(args: argparse.Namespace) -> int:
    from ..servers.hostfaults import HostFaults
    from ..servers.hosts import HostsCluster

    faults = HostFaults(HostsCluster(os.path.abspath(args.data)))
    what = args.fault_command
    peers = [p for word in getattr(args, "peers", []) for p in word.split(",") if p]
    if what == "cut":
        faults.cut(args.host, peers)
        print(f"{args.host} cut off " + (f"from {', '.join(peers)}" if peers else "whole"))
    elif what == "heal":
        faults.heal(args.host, peers)
        print(f"{args.host} healed" + (f" (from {', '.join(peers)})" if peers else ""))
    elif what == "kill":
        pids = faults.kill(args.host)
        print(f"killed {len(pids)} process{'es' if len(pids) != 1 else ''} on {args.host}"
              + (f": {' '.join(map(str, pids))}" if pids else ""))
    elif what == "restart":
        faults.restart()
        print("every service of the test bed runs")
    else:
        cuts = faults.cuts()
        print("\n".join(str(c) for c in cuts) if cuts else "no cut in place")
    return 0
