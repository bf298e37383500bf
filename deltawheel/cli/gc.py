"""``deltawheel gc``: garbage collection passes (dry run unless --apply)."""

from __future__ import annotations

import argparse
import math
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any, Callable, Iterator

from . import common

__all__ = ["register"]


def _amount(unit: str, *, finite: bool) -> Callable[[str], float]:
    """The argument type of a number of ``unit`` >= 0 (``finite``: 'inf' refused)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of {unit}: {text!r}") from None
        if not (v >= 0 and (v < math.inf or not finite)):
            raise argparse.ArgumentTypeError(f"must be >= 0 {unit}, got {text}")
        return v

    return parse


_hours = _amount("hours", finite=False)
_seconds = _amount("seconds", finite=True)


def register(sub: Any) -> None:
    """Add the ``gc`` subcommand to ``sub``."""
    p = sub.add_parser("gc", help="compact and vacuum the store's tables, apply stream retention (dry run by default)")
    common.add_store_arg(p)
    p.add_argument("--apply", action="store_true", help="do it (default: print the plan)")
    p.add_argument("--stream-retention-hours", type=_hours, default=None,
                   help="delete stream records older than this (event time); default or 'inf': keep all")
    p.add_argument("--metrics-retention-hours", type=_hours, default=720.0,
                   help="delete per-batch metrics rows recorded longer ago (default 720; 'inf' keeps all)")
    p.add_argument("--late-data-retention-hours", type=_hours, default=None,
                   help="delete rows of late_data recorded longer ago (by recorded_ms; default: keep all)")
    p.add_argument("--dead-letter-retention-hours", type=_hours, default=None,
                   help="delete rows of dead_letters recorded longer ago (by recorded_ms; default: keep all)")
    p.add_argument("--vacuum-retain-hours", type=float, default=168.0,
                   help="VACUUM keeps unreferenced files younger than this (default 168 = Delta's minimum)")
    p.add_argument("--force", action="store_true",
                   help="allow a retention below Delta's 168 h safety minimum (only when no job writes or "
                        "reads the store: a shorter one can delete files they still need)")
    p.add_argument("--log-retention-hours", type=_hours, default=None,
                   help="delete Delta log files before the newest checkpoint older than this (default or "
                        "'inf': Delta's own, 720 h); versions before it can no longer be read or replayed")
    p.add_argument("--keep-replay-hours", type=_hours, default=None,
                   help="refuse (ReplayHorizonError) a stream, VACUUM or log retention shorter than this")
    p.add_argument("--skip-zk", action="store_true",
                   help="leave ZooKeeper alone (default: delete the znodes of gone instances and finished "
                        "replays, prune the rescaling input-file sets under the leases)")
    p.add_argument("--lease-wait", type=_seconds, default=60.0, metavar="SECONDS",
                   help="how long the input_sets pass waits for running owners to hand their intervals over "
                        "(default 60); a computation not handed over is left as it is")
    common.add_log_store_zk_args(p, digest=True)
    common.add_spark_args(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import deltawheel.migrations as migrations
    from deltawheel.gc.tool import gc_store

    layout = common.layout_from(args)
    spark = common.spark_from(args)
    migrations.check_store(spark, layout)
    @contextmanager
    def zookeeper() -> Iterator[tuple[Any, Any, str]]:  # the pipelines': --zk, else a local store's own
        with common.store_zookeeper(args) as (_layout, cfg, client):
            root_cfg = replace(cfg, chroot="/")
            with common.connected(root_cfg, args.zk_timeout) if cfg.chroot != "/" else nullcontext() as root:
                yield client, root, cfg.chroot

    def ms(hours: float | None, *, inf_keeps_all: bool = True) -> int | None:
        """Milliseconds; 'inf' keeps all (None) except where it is a bound to hold (``--keep-replay-hours``)."""
        if hours is None or (inf_keeps_all and hours == math.inf):
            return None
        return int(min(hours * 3_600_000, 2**62))

    report = gc_store(spark, layout, apply=args.apply, zookeeper=None if args.skip_zk else zookeeper,
                      lease_wait_s=args.lease_wait, progress=common.Progress("gc").step,
                      stream_retention_ms=ms(args.stream_retention_hours), vacuum_retain_hours=args.vacuum_retain_hours,
                      force=args.force, metrics_retention_ms=ms(args.metrics_retention_hours),
                      log_retention_ms=ms(args.log_retention_hours),
                      keep_replay_ms=ms(args.keep_replay_hours, inf_keeps_all=False),
                      late_data_retention_ms=ms(args.late_data_retention_hours),
                      dead_letter_retention_ms=ms(args.dead_letter_retention_hours))
    for line in report.lines():
        print(line)
    if not args.apply:
        print("dry run: nothing changed (add --apply)")
    return 0
