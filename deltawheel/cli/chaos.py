"""``deltawheel chaos``: the bank pipeline as two instances under seeded faults, then an independent check."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

__all__ = ["register", "replay_command"]

MEAN_GAP_S = 5.0
TMPFS_MB = 128
TMPFS_MB_PER_HOUR = 1536  # an hour's store growth when gc runs seldom (10 minutes and their drain filled 298 MiB)


def tmpfs_mb(seconds: float) -> int:
    """The default tmpfs for a run of ``seconds``: 128 MiB and a third more than the store grows to.

    >>> tmpfs_mb(60), tmpfs_mb(600), tmpfs_mb(3600)
    (162, 469, 2176)
    """
    return TMPFS_MB + int(seconds / 3600 * TMPFS_MB_PER_HOUR * 4 / 3)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``chaos``."""
    p = subparsers.add_parser(
        "chaos", help="run a three-stage bank pipeline as two instances under random overlapping faults, "
                      "then check its streams (docs/reliability.md)")
    p.add_argument("--seed", type=int, default=None,
                   help="the input's and the fault schedule's seed (default: drawn, printed first)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the chaos phase (default 60)")
    p.add_argument("--data", default=str(Path("data") / "chaos"),
                   help="the run's folder (default data/chaos; emptied first if it holds an earlier run)")
    p.add_argument("--mean-gap", type=float, default=MEAN_GAP_S, help="mean seconds between fault starts (default 5)")
    p.add_argument("--bound", type=float, default=600.0,
                   help="seconds within which every stream must commit after a fault heals (default 600)")
    p.add_argument("--store-tmpfs-mb", type=int, default=None,
                   help="MiB of a tmpfs over the store for disk-full (root only; default 128 and 768 an hour "
                        "of --seconds, a third more: 298 for 10 minutes, 1152 for an hour; 0: none)")
    p.add_argument("--kinds", default="",
                   help="comma-separated fault kinds the schedule draws from (default: every kind)")
    p.add_argument("--object-store", action="store_true",
                   help="the store on s3a:// through a local S3Proxy (in --data), and s3proxy-kill faults")
    p.add_argument("--recheck", action="store_true", help="check the finished run in --data again, run nothing")
    p.set_defaults(func=_chaos)


def replay_command(args: argparse.Namespace, seed: int) -> str:
    """The command that replays this run's input and fault schedule."""
    line: str = f"deltawheel chaos --seed {seed} --seconds {args.seconds:g}"
    if args.mean_gap != MEAN_GAP_S:
        line += f" --mean-gap {args.mean_gap:g}"
    if args.store_tmpfs_mb is not None:  # 0: no disk-full among the kinds
        line += f" --store-tmpfs-mb {args.store_tmpfs_mb}"
    line += f" --kinds {args.kinds}" * bool(args.kinds)
    return line + " --object-store" * bool(args.object_store)


def _chaos(args: argparse.Namespace) -> int:
    from ..chaos.checker import recheck
    from ..chaos.harness import ChaosSettings, run_chaos
    from ..chaos.report import table

    data = Path(args.data)
    if args.recheck:
        saved, result = recheck(data, bound_s=args.bound)
        exits = [(e["driver"], int(e["code"]), e["error"]) for e in saved.get("exits", [])]
        skipped = [(f["kind"], f.get("reason", "the phase is over")) for f in saved.get("skipped", [])]
        left_out = saved.get("left_out") or {}  # an older faults.json holds disk-full's reason alone
        print(table(int(saved["seed"]), result, tools=saved.get("tools"), exits=exits,
                    drained=bool(saved.get("drained")), skipped=skipped,
                    left_out={"disk-full": left_out} if isinstance(left_out, str) else left_out))
        return 0 if result.ok else 1
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    print(f"chaos seed {seed} (replay: {replay_command(args, seed)})", flush=True)
    settings = ChaosSettings(seed=seed, seconds=args.seconds, data=data, mean_gap_s=args.mean_gap,
                             bound_s=args.bound, object_store=args.object_store,
                             store_tmpfs_mb=tmpfs_mb(args.seconds) if args.store_tmpfs_mb is None else args.store_tmpfs_mb,
                             kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()))
    run = run_chaos(settings, say=lambda line: print(line + "\n", end="", flush=True))  # one write: faults' threads print
    assert run.result is not None
    print(table(seed, run.result, tools=run.tools, exits=[(e.driver, e.code, e.error) for e in run.exits],
                drained=run.drained, skipped=[(f.kind, why) for f, why in run.skipped], left_out=run.left_out))
    return 0 if run.result.ok else 1
