"""Re-seeding ZooKeeper from the store after ZooKeeper lost a pipeline's state, with every copy of the
pipeline stopped; it only raises values, so a repeat changes nothing (docs/coordinator-recovery.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kazoo.client import KazooClient
from kazoo.security import ACL

from ..layout import StoreLayout
from ..rowtable.tables import rows_frame
from ..zk.binding import bind_store, store_path
from ..zk.lease_tools import next_sequencers, raise_sequencers
from ..zk.watermarks import WatermarkAuthority, read_injector_watermark

__all__ = ["ReseedPlan", "plan_reseed", "apply_reseed", "store_sequencers"]


@dataclass(frozen=True, kw_only=True)
class ReseedPlan:
    """What :func:`plan_reseed` found (per computation, interval -> sequencer; per injector, watermark);
    ``zookeeper``: the sequencers it would grant next; ``behind``: the floors they must reach."""

    pipeline: str
    root: str
    bound: bool
    store: dict[str, dict[int, int]] = field(default_factory=dict)
    zookeeper: dict[str, dict[int, int]] = field(default_factory=dict)
    behind: dict[str, dict[int, int]] = field(default_factory=dict)
    injectors: dict[str, int] = field(default_factory=dict)
    zookeeper_injectors: dict[str, int | None] = field(default_factory=dict)

    @property
    def needed(self) -> bool:
        """ZooKeeper is behind the store (or has no binding while the store has data)."""
        return any(self.behind.values()) or (not self.bound and any(self.store.values()))

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (interval numbers as strings)."""
        def keyed(d: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
            return {c: {str(i): s for i, s in sorted(per.items())} for c, per in sorted(d.items())}

        return {"pipeline": self.pipeline, "store": self.root, "bound": self.bound, "needed": self.needed,
                "store_sequencers": keyed(self.store), "zookeeper_next": keyed(self.zookeeper),
                "raise_to": keyed(self.behind), "injector_watermarks": dict(sorted(self.injectors.items())),
                "zookeeper_injector_watermarks": dict(sorted(self.zookeeper_injectors.items()))}


def store_sequencers(spark: Any, layout: StoreLayout) -> dict[str, dict[int, int]]:
    """Per computation, interval -> the highest sequencer of any row (fence rows included)."""
    from pyspark.sql import functions as F

    df = rows_frame(spark, layout)
    out: dict[str, dict[int, int]] = {}
    if df is None:
        return out
    for r in (df.where(F.col("sequencer").isNotNull()).groupBy("computation", "interval")
              .agg(F.max("sequencer").alias("s")).collect()):
        out.setdefault(str(r["computation"]), {})[int(r["interval"])] = int(r["s"])
    return out


def plan_reseed(spark: Any, layout: StoreLayout, client: KazooClient, *, pipeline: str,
                injectors: Mapping[str, int] | None = None,
                sequencers: dict[str, dict[int, int]] | None = None) -> ReseedPlan:
    """Compare the store's sequencers (``sequencers``, if already read) with ZooKeeper's; reads only."""
    bound = client.exists(store_path(pipeline)) is not None
    held = store_sequencers(spark, layout) if sequencers is None else sequencers
    zk: dict[str, dict[int, int]] = {}
    behind: dict[str, dict[int, int]] = {}
    for comp, per in sorted(held.items()):
        zk[comp] = next_sequencers(client, pipeline=pipeline, computation=comp, intervals=per)
        low = {iv: s + 1 for iv, s in per.items() if zk[comp][iv] <= s}
        if low:
            behind[comp] = low
    wanted = dict(injectors or {})
    current = {name: read_injector_watermark(client, pipeline=pipeline, injector=name) for name in sorted(wanted)}
    return ReseedPlan(pipeline=pipeline, root=layout.root, bound=bound, store=held, zookeeper=zk,
                      behind=behind, injectors=wanted, zookeeper_injectors=current)


def apply_reseed(spark: Any, layout: StoreLayout, client: KazooClient, plan: ReseedPlan, *,
                 acls: list[ACL] | None = None) -> dict[str, dict[int, int]]:
    """Raise ZooKeeper's sequencers, bind the store, publish ``plan``'s injector watermarks; returns
    the next sequencer per computation and interval.
    Raises StoreMismatchError: ZooKeeper's binding names another store (nothing is changed)."""
    from ..rowtable.store import RowStore

    bind_store(client, plan.pipeline, table_id=RowStore(spark, layout, writer="reseed").table_id(), root=layout.root)
    out = {comp: raise_sequencers(client, pipeline=plan.pipeline, computation=comp, floors=floors, acls=acls)
           for comp, floors in sorted(plan.behind.items())}
    authority = WatermarkAuthority(client, pipeline=plan.pipeline, acls=acls)
    try:
        for name, watermark_ms in sorted(plan.injectors.items()):
            authority.publish_injector(name, watermark_ms)
    finally:
        authority.close()
    return out
