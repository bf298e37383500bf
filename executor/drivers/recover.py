"""Recovery without the pipeline (``deltawheel recover``): deliver undelivered checkpointed productions
(idempotent: after a lost session the next owner delivers what this one did not)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.rowtable.tables import ensure_rows_table
from deltawheel.statestore.writepath.streams import list_streams
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.leases import LeaseManager

from ..computation import RECORD_KEY, Computation
from ..protocol.executor import ComputationExecutor

__all__ = ["IntervalStatus", "RecoverResult", "computations_of", "scan", "recover"]


@dataclass(frozen=True)
class IntervalStatus:
    """One interval as :func:`scan` found it: ``checkpointed`` and ``undelivered`` productions per stream."""

    computation: str
    interval: int
    owner: str | None  # the live lease holder, None: free
    checkpointed: Mapping[str, int]
    undelivered: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """The status as JSON-ready plain types."""
        return {"computation": self.computation, "interval": self.interval, "owner": self.owner,
                "checkpointed": dict(self.checkpointed), "undelivered": dict(self.undelivered)}


@dataclass(frozen=True, kw_only=True)
class RecoverResult:
    """What :func:`recover` did for one computation."""

    computation: str
    intervals: tuple[int, ...]
    sequencers: Mapping[int, int]  # the leases it took (every earlier owner is fenced below these)
    appended: int  # checkpointed productions delivered as their commit's own delivery
    merged: int  # given to insert-if-absent MERGE (commit unknown, or a MERGE-path store; landed: skipped)
    log: list[str] = field(default_factory=list)


def computations_of(client: Any, *, pipeline: str, names: Sequence[str] | None = None,
                    leases: Sequence[Mapping[str, Any]] | None = None) -> dict[str, int]:
    """The pipeline's computations (or ``names``) with their number of intervals; else ConfigError."""
    found: dict[str, int] = {}
    for r in list_leases(client, pipeline=pipeline) if leases is None else leases:
        found[r["computation"]] = max(found.get(r["computation"], 0), int(r["interval"]) + 1)
    if not found:
        raise ConfigError(f"pipeline {pipeline!r} has no computation in ZooKeeper (no lease znodes): check "
                          "--pipeline and the ZooKeeper address / chroot the pipeline ran with")
    if not names:
        return dict(found)
    missing = [n for n in names if n not in found]
    if missing:
        raise ConfigError(f"pipeline {pipeline!r} has no computation {', '.join(map(repr, missing))} "
                          f"(it has: {', '.join(sorted(found))})")
    return {n: found[n] for n in names}


def _stand_in(name: str, num_intervals: int, outputs: Sequence[str]) -> Computation:
    """A computation of that name and shape without user code: recovery only reads rows."""
    cls = type(f"Recover_{name}", (Computation,), {
        "name": name, "num_intervals": num_intervals, "outputs": tuple(outputs),
        "inputs": {"recovery_has_no_input": RECORD_KEY}, "__module__": __name__})
    comp: Computation = cls()
    return comp


def scan(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str,
         computations: Sequence[str] | None = None) -> list[IntervalStatus]:
    """The dry run: per interval, its lease holder and checkpointed and undelivered productions."""
    from pyspark.sql import functions as F

    leases = list_leases(client, pipeline=pipeline)
    found = computations_of(client, pipeline=pipeline, names=computations, leases=leases)
    owners = {(r["computation"], int(r["interval"])): r["owner"] for r in leases}
    out: list[IntervalStatus] = []
    for name, n in sorted(found.items()):
        rows = spark.read.format("delta").load(ensure_rows_table(spark, layout, name))
        held = (rows.where(F.col("computation") == name).select("interval", F.explode("pending").alias("p"))
                .select("interval", F.col("p.stream").alias("stream"), F.col("p.production_id").alias("id"))
                .localCheckpoint())
        counts: dict[int, tuple[dict[str, int], dict[str, int]]] = {iv: ({}, {}) for iv in range(n)}
        for stream in sorted(r["stream"] for r in held.select("stream").distinct().collect()):
            landed = (spark.read.format("delta").load(layout.stream(stream))
                      .select(F.col("record_id").alias("id"), F.lit(True).alias("landed")).distinct())
            per = (held.where(F.col("stream") == stream).join(landed, "id", "left").groupBy("interval")
                   .agg(F.count(F.lit(1)).alias("n"), F.count_if(F.col("landed").isNull()).alias("todo")))
            for r in per.collect():
                checkpointed, undelivered = counts.setdefault(int(r["interval"]), ({}, {}))
                checkpointed[stream] = int(r["n"])
                if r["todo"]:
                    undelivered[stream] = int(r["todo"])
        for iv, (checkpointed, undelivered) in sorted(counts.items()):
            out.append(IntervalStatus(name, iv, owners.get((name, iv)), checkpointed, undelivered))
    return out


def recover(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, computation: str, num_intervals: int,
            writer: str = "deltawheel-recover", wait_s: float = 0.0,
            progress: Callable[[str], None] | None = None) -> RecoverResult:
    """Take the intervals, deliver their undelivered productions, give them back (held: LeaseHeldError)."""
    log: list[str] = []

    def note(line: str) -> None:
        log.append(line)
        if progress is not None:
            progress(line)

    comp = _stand_in(computation, num_intervals, list_streams(spark, layout))
    # leases with the open ACL, rows written as ``writer``
    owner = IntervalOwner(RowStore(spark, layout, writer=writer), LeaseManager(client, pipeline=pipeline, owner=writer),
                          comp.name, num_intervals=num_intervals)
    ex = ComputationExecutor(spark, layout, comp, owner=owner, authority=None, progress=note)
    ex.start(wait_s=wait_s)
    try:
        seqs = dict(owner.sequencers)
    finally:
        ex.stop()
    return RecoverResult(computation=computation, intervals=tuple(sorted(seqs)), sequencers=seqs,
                         appended=ex.recovered.get("appended", 0), merged=ex.recovered.get("merged", 0),
                         log=log)
