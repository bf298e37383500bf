"""``deltawheel promote``: a replay's state replaces the live one's, fenced and audited (docs/replay.md)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``promote`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "promote", help="replace a live computation's state with a replay's (caught up first, under the leases; "
                        "docs/replay.md)")
    p.add_argument("--from", dest="source_folder", required=True, help="the replay's folder (`deltawheel replay --into`)")
    common.add_live_args(p, "the computation the replay replayed")
    p.add_argument("--code", help="MODULE:CLASS the catch-up runs (default: the code the replay ran)")
    p.add_argument("--source", metavar="MODULE:PIPELINE",
                   help="the live pipeline: its injectors feed the catch-up (default: the one `deltawheel "
                        "replay --source` recorded)")
    p.add_argument("--intervals", help="I,J: promote only these intervals (default: all, or those a partial "
                                       "replay replayed)")
    common.add_handover_args(p)
    p.add_argument("--no-catch-up", action="store_true",
                   help="refuse a replay behind the live input position instead of continuing it")
    p.add_argument("--plan", action="store_true", help="print what it would do, change nothing")
    common.add_json_arg(p)
    common.add_zk_spark_args(p, timeout=True)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.pipeline import load_pipeline
    from deltawheel.executor.drivers.promote import check_replay, plan_promote, promote, promote_intervals
    from deltawheel.executor.drivers.replay import shadow_chroot
    from deltawheel.statestore.surgery.timeline import Timeline

    timeline = Timeline(say=common.say if args.verbose and not args.json else None)
    with timeline.phase("the tool's start: the replay's marker, its code, Spark"):
        store = common.layout_from(args)
        into = common.layout_from(argparse.Namespace(store=args.source_folder))
        # an s3a:// replay is read with the session's settings
        spark = None if into.is_local else common.spark_from(args)
        marker = check_replay(store, into, pipeline=args.pipeline, computation=args.computation, spark=spark)
        spec = args.source or marker.get("source")  # else the live pipeline the replay recorded
        # before Spark and ZooKeeper: a --source that does not import is refused at once, and so is a bad
        # --code (else the replay's, the live class)
        source = load_pipeline(spec) if spec else None
        code = common.computation_code(
            args, args.code or marker.get("code"), "the replay does not record its code: give --code "
            f"MODULE:CLASS, or --source MODULE:PIPELINE (the live pipeline), for computation {args.computation!r}",
            source=source)
        injectors = () if source is None else tuple(source.injectors)
        intervals = promote_intervals(marker, common.int_list(args.intervals, "--intervals"),
                                      type(code).num_intervals, into=into.root)
        spark = spark or common.spark_from(args)
    if args.plan:
        plan = plan_promote(spark, store=store, into=into, pipeline=args.pipeline, computation=args.computation,
                            num_intervals=type(code).num_intervals, intervals=intervals)
        print(plan.describe())
        return 0
    with common.store_zookeeper(args) as (_, cfg, client):
        shadow = None if args.zk is None else replace(cfg, chroot=shadow_chroot(cfg.chroot, into))
        r = promote(spark, store=store, into=into, client=client, pipeline=args.pipeline, code=code,
                    injectors=injectors, shadow_zk=shadow, wait_s=common.handover_wait_s(args),
                    no_wait=args.no_wait, catch_up=not args.no_catch_up, intervals=intervals,
                    timeline=timeline, progress=None if args.json else common.say)
    if args.json:
        phases = [{"phase": p.name, "start_s": p.start_ms / 1000, "seconds": (p.end_ms - p.start_ms) / 1000,
                   "paused": p.paused} for p in timeline.phases]
        common.print_json({"computation": r.computation, "intervals": list(r.intervals),
                           "rows_written": len(r.upserted), "rows_deleted": len(r.deleted),
                           "version": r.version, "audit_id": r.audit_id, "paused_s": timeline.pause_s(),
                           "phases": phases})
    else:
        where = (f"at rows version {r.version}; audit record {r.audit_id} (deltawheel sql --store {store.root} "
                 "\"SELECT * FROM audit\")") if r.version is not None else \
            f"(no commit: the replay's rows equal the live ones); audit record {r.audit_id}"
        print(f"promoted {into.root} to {r.computation}: {len(r.upserted)} keys written, {len(r.deleted)} deleted "
              f"{where}; the leases are given back, the pipeline goes on from the promoted state")
        if args.verbose and timeline.pause_line():  # (each phase was printed as it ended)
            print(timeline.pause_line())
    return 0
