"""A whole ``deltawheel gc`` run: the Delta passes, the missing audit rows, the ZooKeeper passes."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Callable

from deltawheel.statestore.layout import StoreLayout

from .passes import GcReport, run_gc

__all__ = ["gc_store"]


def gc_store(spark: Any, layout: StoreLayout, *, apply: bool,
             zookeeper: Callable[[], AbstractContextManager[tuple[Any, Any, str]]] | None = None,
             lease_wait_s: float = 60.0, **passes: Any) -> GcReport:
    """Plan (default) or run every gc pass over ``layout``; ``passes``: :func:`.passes.run_gc`'s settings.

    ``zookeeper``: None leaves ZooKeeper alone; else it opens (client in the chroot, client at ``/`` or
    None, chroot) for the znode and input-set passes. Raises what :func:`.passes.run_gc` raises.
    """
    from deltawheel.statestore.delta.txn import TableLog
    from deltawheel.statestore.rowtable.tables import list_computations

    from .background import audit_gaps, audit_recovery
    from .inputsets import prune_input_sets
    from .ranlog import read_ran, save_checked
    from .zknodes import bound_pipelines, collect_zk_nodes

    # read before a log clean-up drops them, in every rows table: the tool commits since the last check,
    # what each interval ran
    gap, checked = audit_gaps(spark, layout)
    ran = ({c: read_ran(layout, computation=c) for c in (None, *list_computations(spark, layout))}
           if apply and zookeeper is not None and passes.get("log_retention_ms") is not None else None)
    report = run_gc(spark, layout, now_ms=int(time.time() * 1000), apply=apply, **passes)
    report = replace(report, actions=audit_recovery(spark, layout, gap, apply=apply) + report.actions)
    if apply:  # every tool commit read has its audit row now
        for table, upto in checked.items():
            save_checked(layout, upto, table)
    if zookeeper is None:
        return report
    with zookeeper() as (client, root, chroot):
        table_id = TableLog(spark, layout.rows).table_id()
        sets = prune_input_sets(spark, layout, client, pipelines=bound_pipelines(client, rows_table_id=table_id),
                                apply=apply, wait_s=lease_wait_s, ran=ran)
        zk = sets + collect_zk_nodes(client, root, rows_table_id=table_id, chroot=chroot, apply=apply)
    return replace(report, actions=report.actions + tuple(zk))
