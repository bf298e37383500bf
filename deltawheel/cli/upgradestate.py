"""``deltawheel upgrade-state``: every key of an older ``state_version`` upgraded at once, fenced and
audited (``drivers/upgrade.py``; docs/operations.md, "State versions")."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from . import common

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``upgrade-state`` subcommand to ``subparsers``."""
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
    p.set_defaults(func=_run)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def _run(args: argparse.Namespace) -> int:
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
