"""``deltawheel repair``: a SQL change of a live computation's decoded rows; ``deltawheel upgrade-state``:
every key of an older ``state_version`` upgraded at once; both fenced and audited (docs/operations.md)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``repair`` and ``upgrade-state`` subcommands to ``subparsers``."""
    p = subparsers.add_parser(
        "repair", help="UPDATE, DELETE or MERGE a live computation's decoded state (or its timers, pending productions), fenced, under its leases, audited "
                       "(docs/operations.md)")
    common.add_live_args(p, "the computation whose rows are repaired")
    p.add_argument("statement", help="UPDATE state SET state_json = <expr> [WHERE ...] | DELETE FROM state [WHERE ...] | "
                                      "MERGE INTO state USING parquet.`path` AS s ON state.key = s.col WHEN ... | "
                                      "DELETE FROM timers [WHERE ...] | UPDATE timers SET time_ms = <expr> [WHERE ...] "
                                      "| DELETE FROM pending_productions [WHERE ...]")
    p.add_argument("--codec", default=None,
                   help="codec of the keys a MERGE inserts, NAME[@STATE_VERSION] (default: the computation's rows')")
    common.add_handover_args(p)
    p.add_argument("--plan", action="store_true", help="print each key's state before and after, change nothing")
    common.add_zk_spark_args(p, timeout=True)
    p.set_defaults(func=_run)
    p = subparsers.add_parser(
        "upgrade-state", help="upgrade every key's state of an older state_version now (upgrade_state), fenced, "
                              "under the leases, audited, while the pipeline runs (docs/operations.md)",
        description="Runs the code's upgrade_state on every row of an older state_version, in one fenced, "
                    "audited commit under the intervals' leases; run it once the pipeline runs the new code. "
                    "A key whose upgrade raises refuses the whole upgrade (docs/operations.md).")
    common.add_live_args(p, "the computation whose state is upgraded")
    p.add_argument("--code", help="MODULE:CLASS of the computation's new code (its state_version and upgrade_state; "
                                  "default: the code a package registered for the pipeline, e.g. the demo's)")
    common.add_handover_args(p)
    p.add_argument("--plan", action="store_true",
                   help="print the rows per state version and a sample of upgrades (before and after), change nothing")
    common.add_zk_spark_args(p, timeout=True)
    p.set_defaults(func=_run_upgrade)


def _show(result: object) -> None:
    from deltawheel.statestore.inspection.sqlviews import decode_json_text
    from deltawheel.statestore.surgery.replace import SurgeryResult

    assert isinstance(result, SurgeryResult)
    for r in result.upserted:
        old = result.before.get(r.key)
        print(f"  {r.key!r} (interval {r.interval}): "
              f"{decode_json_text(old.codec, old.state) if old is not None else '(new)'} -> "
              f"{decode_json_text(r.codec, r.state)}" + (f" [{r.codec}]" if old is None else ""))
        if old is not None and old.timers != r.timers:
            print(f"    timers {[(t.tag, t.domain.value, t.time_ms) for t in old.timers]} -> "
                  f"{[(t.tag, t.domain.value, t.time_ms) for t in r.timers]}")
        if old is not None and old.pending != r.pending:
            gone = sorted({p.production_id for p in old.pending} - {p.production_id for p in r.pending})
            print(f"    checkpointed productions dropped: {gone}")
    for iv, k in result.deleted:
        old = result.before[k]
        print(f"  {k!r} (interval {iv}): {decode_json_text(old.codec, old.state)} -> (deleted, with its timers)")


def _run(args: argparse.Namespace) -> int:
    from deltawheel.statestore.surgery.repair import parse_repair, plan_repair, repair

    parse_repair(args.statement)  # before Spark and ZooKeeper: a bad statement is refused at once
    store = common.layout_from(args)
    spark = common.spark_from(args)
    with common.store_zookeeper(args) as (_, _cfg, client):
        if args.plan:
            plan = plan_repair(spark, store, client, pipeline=args.pipeline, computation=args.computation,
                               statement=args.statement, codec=args.codec)
            keys = common.plural(len(plan.upserted), "key")
            print(f"repair of {args.computation} would write {keys} and delete "
                  f"{len(plan.deleted)} (nothing changed):")
            _show(plan)
            return 0
        r = repair(spark, store, client, pipeline=args.pipeline, computation=args.computation,
                   statement=args.statement, wait_s=common.handover_wait_s(args), no_wait=args.no_wait,
                   codec=args.codec, progress=common.say)
    if not r.rows_changed:
        print(f"the statement changes no key of {args.computation}; nothing was written")
        return 0
    print(f"repaired {args.computation}: {len(r.upserted)} keys written, {len(r.deleted)} deleted at rows version "
          f"{r.version}; audit record {r.audit_id}")
    _show(r)
    return 0


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _run_upgrade(args: argparse.Namespace) -> int:
    import deltawheel.migrations as migrations
    from deltawheel.executor.drivers.upgrade import plan_upgrade, upgrade_all
    from deltawheel.statestore.exceptions import NotAStoreError

    code = common.computation_code(  # before Spark and ZooKeeper: a bad --code is refused at once
        args, args.code, f"give --code MODULE:CLASS: the computation {args.computation!r} of pipeline "
        f"{args.pipeline!r} with the new state_version and its upgrade_state (the store does not record code)")
    layout = common.layout_from(args)
    if layout.is_local and not os.path.isdir(layout.root):
        raise NotAStoreError(f"--store {args.store} does not exist: pass the folder of the pipeline's store")
    spark = common.spark_from(args)
    migrations.check_store(spark, layout)
    with common.store_zookeeper(args) as (_, _cfg, client):
        if args.plan:
            plan = plan_upgrade(spark, layout, client, pipeline=args.pipeline, code=code)
            counts = ", ".join(f"version {v}: {n}" for v, n in plan.versions.items()) or "none"
            print(f"rows of {plan.computation} holding state, per state_version: {counts}")
            print(f"upgrade-state would upgrade {plan.to_upgrade} rows to state_version {plan.to_version} in "
                  f"intervals {list(plan.intervals)} (nothing changed); a sample:")
            for key, version, old, new in plan.sample:
                print(f"  {key!r}: version {version} {_text(old)} -> {_text(new)}")
            return 0
        r = upgrade_all(spark, layout, client, pipeline=args.pipeline, code=code,
                        wait_s=common.handover_wait_s(args), no_wait=args.no_wait, source=args.code or "",
                        progress=common.say)
    if not r.rows_changed:
        print(f"every row of {args.computation} is of state_version {code.state_version} already; nothing was written")
        return 0
    print(f"upgraded {len(r.upserted)} rows of {args.computation} to state_version {code.state_version} at rows "
          f"version {r.version} (intervals {list(r.intervals)}); audit record {r.audit_id}")
    return 0
