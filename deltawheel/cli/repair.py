"""``deltawheel repair``: a SQL change of a live computation's decoded rows, fenced and audited
(``statestore/surgery/repair.py``; docs/operations.md, "Repair")."""

from __future__ import annotations

import argparse

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``repair`` subcommand to ``subparsers``."""
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
