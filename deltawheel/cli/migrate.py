"""``deltawheel migrate``: show or run the store's pending schema migrations."""

from __future__ import annotations

import argparse
from typing import Any

from . import common

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``migrate`` subcommand."""
    p = subparsers.add_parser(
        "migrate", help="show (or with --apply run) the pending schema migrations of a store",
        description="Without --apply only prints the plan (a dry run). Creates the store if it doesn't exist "
        "yet. Safe to re-run; an interrupted run resumes where it stopped.")
    common.add_store_arg(p)
    p.add_argument("--apply", action="store_true", help="run the pending migrations (refused while a pipeline "
                   "of the store runs, as the pipelines' ZooKeeper shows: --zk, or a local store's own)")
    common.add_log_store_zk_args(p)
    common.add_spark_args(p)
    p.set_defaults(func=_run)


def _refuse_while_running(args: argparse.Namespace, spark: Any, layout: Any) -> None:
    from deltawheel.migrations.live import refuse_while_running_on
    from deltawheel.statestore.config import ZkConfig

    hosts = args.zk if args.zk is not None else common.running_store_zk(layout)
    if hosts is not None:
        cfg = ZkConfig(hosts=hosts, chroot=args.zk_chroot)
        refuse_while_running_on(spark, layout, lambda: common.connected(cfg, 10.0))


def _run(args: argparse.Namespace) -> int:
    import deltawheel.migrations as migrations

    layout = common.layout_from(args)
    spark = common.spark_from(args)
    progress = common.Progress("migrate")

    def on_step(step: migrations.PlannedMigration, total: int) -> None:
        progress.step(f"migration {step.version} ({step.name})", total)

    if args.apply:
        _refuse_while_running(args, spark, layout)
    steps = migrations.apply(spark, layout, dry_run=not args.apply, on_step=on_step)
    if not steps:
        version = migrations.applied_version(spark, layout)
        print(f"store {layout.root} is up to date (schema version {version})")
        return 0
    print(("applied" if args.apply else "pending") + f" migrations of {layout.root}:")
    for step in steps:
        print(f"  {step.version:4d}  {step.name}: {step.description}")
    if args.apply:
        print(f"store is now at schema version {migrations.applied_version(spark, layout)}")
    else:
        print(f"dry run: nothing changed; run 'deltawheel migrate --store {layout.root} --apply'")
    return 0
