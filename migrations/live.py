"""Migrations on a live store: refused while a pipeline of the store has an interval owner (a migration's
metadata commits fail a running job's commits, whose code was written for the schema it started on)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Sequence

from deltawheel.gc.zknodes import bound_pipelines
from deltawheel.statestore.exceptions import StoreInUseError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.lease_tools import list_leases

__all__ = ["running_pipelines", "refuse_while_running", "refuse_while_running_on"]


def running_pipelines(client: Any, *, rows_table_id: str) -> dict[str, list[str]]:
    """Pipeline -> owners of its held leases, for the store's pipelines that hold at least one."""
    held = {p: {str(r["owner"]) for r in list_leases(client, pipeline=p) if r["owner"] is not None}
            for p in bound_pipelines(client, rows_table_id=rows_table_id)}
    return {p: sorted(owners) for p, owners in held.items() if owners}


def refuse_while_running(client: Any, layout: StoreLayout, *, rows_table_id: str, pending: Sequence[Any]) -> None:
    """Refuse ``pending`` migrations (StoreInUseError) while a pipeline of the store runs; changes nothing."""
    if not pending:
        return
    if not (running := running_pipelines(client, rows_table_id=rows_table_id)):
        return
    who = "; ".join(f"pipeline {p!r} (lease owners: {', '.join(owners)})" for p, owners in running.items())
    steps = ", ".join(f"{m.version} ({m.name})" for m in pending)
    raise StoreInUseError(
        f"store {layout.root} is in use: {who}. Migrations {steps} change its tables, which a running job "
        "must not see change under it; nothing was changed. Stop the pipeline (it stops at a batch boundary, "
        f"every batch committed or not at all), run 'deltawheel migrate --store {layout.root} --apply', then "
        "start it again with this deltawheel: it resumes from its last commit. A killed job's leases go with "
        "its ZooKeeper session: wait for the session timeout, or `deltawheel leases break`")


def refuse_while_running_on(spark: Any, layout: StoreLayout, zookeeper: Callable[[], AbstractContextManager[Any]]) -> None:
    """:func:`refuse_while_running` for ``layout``'s pending migrations (StoreInUseError); ``zookeeper()``
    opens a kazoo client, only when a migration is pending on an existing rows table."""
    import deltawheel.migrations as migrations

    pending = migrations.plan(spark, layout)
    table_id = migrations.rows_table_id(spark, layout) if pending else None
    if table_id is None:
        return
    with zookeeper() as client:
        refuse_while_running(client, layout, rows_table_id=table_id, pending=pending)
