"""``deltawheel replay`` (a computation re-run into a shadow store) and ``diff``; docs/replay.md."""

from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import replace
from typing import Any

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``replay`` and ``diff`` subcommands to ``subparsers``."""
    p = subparsers.add_parser(
        "replay", help="re-run a computation from a past rows version into a shadow store, then diff it against "
                       "the live store (docs/replay.md)")
    common.add_live_args(p, "the computation to replay", store="the live store (only read)")
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-version", type=int, help="the rows-table version whose state the replay starts from")
    start.add_argument("--from-timestamp", help="the newest rows version at or before this time (ISO 8601 or epoch ms)")
    start.add_argument("--from-start", action="store_true", help="from empty state and the first input")
    end = p.add_mutually_exclusive_group()
    end.add_argument("--to-version", type=int, help="replay the live commits up to this rows version")
    end.add_argument("--to-now", action="store_true", help="up to the newest commit (the default)")
    p.add_argument("--intervals", help="I,J: replay only these key intervals (promote then promotes only them)")
    p.add_argument("--keys", help="K1,K2: replay only the intervals of these keys, diff only these keys")
    p.add_argument("--code", help="MODULE:CLASS of the code to run (default: the live class: the --source "
                                  "pipeline's, or the demo pipeline's)")
    p.add_argument("--source", metavar="MODULE:PIPELINE",
                   help="the live pipeline: its injectors feed the replay, its class is the default --code")
    p.add_argument("--into", required=True, help="the shadow store's folder or s3a:// URI (with --zk): empty, or an earlier "
                   "replay's to continue it")
    p.add_argument("--plan", action="store_true", help="print what it would read and write, and stop")
    p.add_argument("--diff-out", help="write the diff as JSON to this file")
    p.add_argument("--write-path", default="auto", choices=("auto", "image", "merge"),
                   help="the shadow store's write path")
    common.add_zk_spark_args(p)
    p.set_defaults(func=_run_replay)

    d = subparsers.add_parser("diff", help="the difference of one computation's state and productions between "
                                           "two stores (docs/replay.md)")
    d.add_argument("--store", action="append", required=True, help="store A, then store B (give it twice)")
    d.add_argument("--computation", required=True)
    d.add_argument("--as-of", type=int, help="store A's rows version (default: its newest)")
    d.add_argument("--as-of-b", type=int, help="store B's rows version (default: its newest)")
    d.add_argument("--stream", action="append", default=[], help="a stream the computation produces to (repeatable)")
    d.add_argument("--diff-out", help="write the diff as JSON to this file")
    d.add_argument("--plain", action="store_true",
                   help="compare the stores as they are, also when store B is a replay of A (docs/replay.md)")
    common.add_spark_args(d)
    d.set_defaults(func=_run_diff)


def _timestamp_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        from deltawheel.statestore.exceptions import ConfigError

        raise ConfigError(f"--from-timestamp {text!r}: give ISO 8601 (2026-01-31T12:00:00+00:00) or epoch "
                          "milliseconds") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def _run_replay(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.pipeline import load_pipeline
    from deltawheel.executor.drivers.replay import plan_replay, replay, replay_scope, shadow_chroot
    from deltawheel.statestore.exceptions import ConfigError

    store = common.layout_from(args)
    into = common.layout_from(argparse.Namespace(store=args.into))
    source = load_pipeline(args.source) if args.source else None
    code = common.computation_code(  # before Spark: a bad --code is refused at once
        args, args.code, "the store does not record code: give --source MODULE:PIPELINE (the live pipeline) or "
        f"--code MODULE:CLASS for computation {args.computation!r} of pipeline {args.pipeline!r}", source=source,
        strict=True)
    intervals = common.int_list(args.intervals, "--intervals")
    keys = None if args.keys is None else [k.strip() for k in args.keys.split(",")]
    replay_scope(type(code).num_intervals, intervals=intervals, keys=keys)  # so is a bad selection
    if not into.is_local and not args.zk:
        raise ConfigError(f"--into {args.into} is on an object store: commits to it are arbitrated by ZooKeeper; "
                          "pass --zk host:port[,host:port] (the one its pipelines use) or set DELTAWHEEL_ZK")
    spark = common.spark_from(args)
    if not into.is_local and store.is_local:  # the live store's session does not arbitrate s3a:// commits yet
        from deltawheel.statestore.objectstore.logstore import configure_log_store

        configure_log_store(spark, args.zk, chroot=args.zk_chroot, digest=args.zk_digest)
    plan = plan_replay(spark, store=store, into=into, pipeline=args.pipeline, computation=args.computation,
                       from_version=args.from_version,
                       from_timestamp_ms=None if args.from_timestamp is None else _timestamp_ms(args.from_timestamp),
                       from_start=args.from_start, to_version=args.to_version, intervals=intervals, keys=keys,
                       num_intervals=type(code).num_intervals, code=code,
                       injectors=() if source is None else source.injectors)
    print(plan.describe(), flush=True)
    if args.plan:
        return 0
    shadow = shadow_chroot(args.zk_chroot, into)
    zk = None if args.zk is None else replace(common.zk_config_from(args), chroot=shadow)
    result = replay(spark, plan, code=code, zk=zk, write_path=args.write_path,
                    injectors=() if source is None else source.injectors, progress=common.say,
                    source=args.source, code_spec=args.code)
    assert result.diff is not None
    _show_diff(args, result.diff)
    return 0


def _run_diff(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.replay_diff import diff_replay, replay_of
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.inspection.diff import diff_stores

    if len(args.store) != 2:
        raise ConfigError(f"give --store exactly twice (store A, then store B); got {len(args.store)}")
    a, b = (common.layout_from(argparse.Namespace(store=s)) for s in args.store)
    spark = common.spark_from(argparse.Namespace(store=args.store[0], master=args.master,
                                                 driver_memory=args.driver_memory))
    of = None if args.plain else replay_of(spark, a, b, args.computation)
    if of is None:
        if not args.plain and replay_of(spark, b, a, args.computation) is not None:
            print("store A is a replay of store B: compared as they are (give the live store first, --store LIVE "
                  "--store SHADOW, for the replay's comparison)")
        d = diff_stores(spark, a, b, args.computation, version_a=args.as_of, version_b=args.as_of_b,
                        streams=args.stream)
    else:
        print(f"store B is {of.describe()} of store A: compared as the replay compares (--plain: as they are)")
        d = diff_replay(spark, a, b, of, computation=args.computation, version_a=args.as_of,
                        version_b=args.as_of_b, streams=args.stream)
    _show_diff(args, d)
    return 0 if d.empty else 1


def _show_diff(args: argparse.Namespace, d: Any) -> None:
    """Print the diff; write it as JSON to ``--diff-out`` when given."""
    from deltawheel.statestore.inspection.diff import format_diff

    print(format_diff(d))
    if args.diff_out:
        with open(args.diff_out, "w", encoding="utf-8") as fh:
            fh.write(d.to_json())
