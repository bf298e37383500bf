"""``deltawheel run MODULE:PIPELINE``: a user's own pipeline, every stage live (docs/continuous.md)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from deltawheel.executor.drivers.pipeline import load_pipeline

from .common import add_run_args, add_store_arg, engine_from, layout_from, timed_say

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``run`` subcommand to ``sub``."""
    p = sub.add_parser("run", help="run your own pipeline (MODULE:PIPELINE) unbounded, every stage live, until "
                                   "Ctrl-C or SIGTERM")
    p.add_argument("target", metavar="MODULE:PIPELINE",
                   help="an importable module (or a .py file) and the name in it of a Pipeline, or of a function "
                        "returning one (e.g. myjob:pipeline)")
    add_store_arg(p)
    p.add_argument("--trigger", action="append", default=[], metavar="[COMPUTATION=]INTERVAL",
                   help="a processing-time interval between micro-batches, e.g. '2s' (default: as fast as "
                        "possible); COMPUTATION=INTERVAL for one computation (repeatable)")
    p.add_argument("--computation", action="append", default=None,
                   help="run only this computation here (repeatable; default: all)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds (default: run until stopped)")
    p.add_argument("--drain", action="store_true",
                   help="the stop (--seconds, SIGTERM, Ctrl-C) is the end of the input: read every source to "
                        "its end, fire and deliver everything, then exit")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for leases another process holds")
    p.add_argument("--instance", default=None,
                   help="this job instance's name (letters, digits, _): processes with different names share the "
                        "intervals; a restart under the same name takes its killed predecessor's leases at once")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)")
    add_run_args(p)
    p.set_defaults(func=_run)


def _triggers(specs: list[str]) -> tuple[str | None, dict[str, str]]:
    default: str | None = None
    per: dict[str, str] = {}
    for spec in specs:
        name, sep, interval = spec.partition("=")
        if sep:
            per[name.strip()] = interval.strip()
        else:
            default = spec
    return default, per


def _run(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.target)
    trigger, per = _triggers(args.trigger)
    say = timed_say(time.monotonic())
    with engine_from(args, layout_from(args), pipeline.name) as (_spark, engine):
        engine.progress = say
        run = engine.start_pipeline(pipeline, trigger=trigger, triggers=per, computations=args.computation,
                                    gc_every=args.gc_every, metrics_port=args.metrics_port)
        run.run_until_stopped(seconds=args.seconds, drain=args.drain)
    return 0
