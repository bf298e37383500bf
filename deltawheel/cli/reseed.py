"""``deltawheel reseed``: a pipeline's lost ZooKeeper state from its store (docs/coordinator-recovery.md)."""

from __future__ import annotations

import argparse

from . import common

__all__ = ["injector_line", "register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``reseed`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "reseed", help="after ZooKeeper lost its data: re-seed its sequencers and injector watermarks from "
                       "the store (dry run unless --apply); stop the pipeline first")
    common.add_store_arg(p)
    common.add_pipeline_arg(p)
    p.add_argument("--apply", action="store_true", help="change ZooKeeper (default: print what would change)")
    common.add_json_arg(p)
    common.add_zk_spark_args(p, timeout=True)
    p.set_defaults(func=_run)


def injector_line(name: str, recorded_ms: int, zookeeper_ms: int | None) -> str:
    """The plan's line for one injector: the store's watermark, ZooKeeper's, whether it is restored."""
    from deltawheel.executor.protocol.reports import describe_watermark

    state = "ok" if zookeeper_ms is not None and zookeeper_ms >= recorded_ms else "restore"
    held = "none" if zookeeper_ms is None else describe_watermark(zookeeper_ms)  # ZooKeeper holds no watermark
    return (f"  injector {name}: watermark {describe_watermark(recorded_ms)} in the store's commits, ZooKeeper's "
            f"{held}  {state}")


def _run(args: argparse.Namespace) -> int:
    from deltawheel.executor.protocol.lateness import recorded_injector_watermarks
    from deltawheel.statestore.ownership.reseed import apply_reseed, plan_reseed, store_sequencers
    from deltawheel.statestore.zk.client import digest_acls

    with common.store_zookeeper(args) as (layout, cfg, client):
        spark = common.spark_from(args)
        held = store_sequencers(spark, layout)
        recorded = recorded_injector_watermarks(spark, layout, held)
        plan = plan_reseed(spark, layout, client, pipeline=args.pipeline, injectors=recorded, sequencers=held)
        after = apply_reseed(spark, layout, client, plan, acls=digest_acls(cfg)) if args.apply else None
    if args.json:
        after_json = None if after is None else {
            c: {str(i): s for i, s in per.items()} for c, per in after.items()}
        common.print_json({**plan.to_dict(), "applied": bool(args.apply), "zookeeper_next_after": after_json})
        return 0
    print(f"pipeline {plan.pipeline}, store {plan.root}: binding {'present' if plan.bound else 'MISSING'} in ZooKeeper")
    for comp, per in sorted(plan.store.items()):
        for iv, s in sorted(per.items()):
            nxt = plan.zookeeper[comp][iv]
            state = "ok" if nxt > s else f"BEHIND: raise to {s + 1}"
            print(f"  {comp} interval {iv}: store sequencer {s}, ZooKeeper's next {nxt}  {state}")
    for name, wm in sorted(plan.injectors.items()):
        print(injector_line(name, wm, plan.zookeeper_injectors.get(name)))
    if not plan.needed:
        print("nothing to re-seed: ZooKeeper is ahead of every sequencer in the store")
    elif not args.apply:
        print("dry run: nothing changed. Stop every copy of the pipeline, then run again with --apply")
    else:
        print("re-seeded: ZooKeeper's sequencers are above the store's, the binding is recorded and the injector "
              "watermarks are restored. Start the pipeline again; its first grants fence every interval, and each "
              "stage publishes its low watermark again at the end of its first batch.")
    return 0
