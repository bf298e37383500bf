"""What ``deltawheel status`` and ``report`` show, per computation, from a store and its ZooKeeper."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deltawheel.statestore.inspection.figures import pending_productions, read_columns, state_sizes
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..protocol.metrics import read_batches

__all__ = ["StoreStatus", "gather"]


@dataclass(kw_only=True)
class StoreStatus:
    """What :func:`gather` found (plain values, JSON-ready)."""

    store: str
    now_ms: int
    leases: list[dict[str, Any]] = field(default_factory=list)
    watermarks: dict[str, dict[str, Any]] = field(default_factory=dict)  # pipeline -> WatermarkAuthority.snapshot()
    batches: list[dict[str, Any]] = field(default_factory=list)  # metrics rows, oldest first
    dead_letters: list[dict[str, Any]] = field(default_factory=list)  # computation, recorded_ms
    late: list[dict[str, Any]] = field(default_factory=list)  # computation, recorded_ms
    # computation -> keys (user keys with a row), rows (physical: with fence and record-id rows), bytes, files
    state: dict[str, dict[str, int]] = field(default_factory=dict)
    # computation -> productions checkpointed in its rows, and those not in their stream (None: unknown)
    pending: dict[str, dict[str, int]] | None = field(default_factory=dict)

    def computations(self) -> list[tuple[str, str]]:
        """Every (pipeline, computation) seen anywhere, sorted."""
        seen = {(r["pipeline"], r["computation"]) for r in self.leases}
        seen |= {(p, c) for p, snap in self.watermarks.items() for c in snap["computations"]}
        seen |= {(r["pipeline"] or "-", r["computation"]) for r in self.batches}
        return sorted(seen)

    def input_watermark(self, pipeline: str, computation: str) -> int | None:
        """min over the computation's declared upstream watermarks (None: one is not known)."""
        snap = self.watermarks.get(pipeline)
        comp = None if snap is None else snap["computations"].get(computation)
        if snap is None or comp is None or not comp["upstream"]:
            return None
        marks = []
        for kind, _, name in (up.partition(":") for up in comp["upstream"]):
            src = snap["injectors" if kind == "injector" else "computations"].get(name)
            wm = None if src is None else src.get("watermark_ms") if kind == "injector" else _output(src)
            if wm is None:
                return None
            marks.append(int(wm))
        return min(marks)

    def output_watermark(self, pipeline: str, computation: str) -> int | None:
        """The computation's low watermark (computed from ZooKeeper; else the last published)."""
        comp = self.watermarks.get(pipeline, {}).get("computations", {}).get(computation)
        return None if comp is None else _output(comp)


def _output(comp: dict[str, Any]) -> int | None:
    low, pub = comp.get("low_watermark_ms"), comp.get("published_low_watermark_ms")
    return pub if low is None else (low if pub is None else max(low, pub))


def gather(layout: StoreLayout, client: Any, *, pipeline: str | None = None, spark: Any = None,
           now_ms: int | None = None) -> StoreStatus:
    """Everything ``status`` and ``report`` show, from the store (``spark`` is needed only for a
    store that is not local) and the ZooKeeper ``client`` (None: the store's figures only)."""
    st = StoreStatus(store=layout.root, now_ms=int(time.time() * 1000) if now_ms is None else now_ms)
    if client is not None:
        st.leases = list_leases(client, pipeline=pipeline)
        names = [pipeline] if pipeline else (sorted(client.get_children("/pipelines"))
                                             if client.exists("/pipelines") else [])
        for p in names:
            authority = WatermarkAuthority(client, pipeline=p)
            try:
                st.watermarks[p] = authority.snapshot()
            finally:
                authority.close()  # a watching caller polls on one client: leave no listener behind
    st.batches = read_batches(layout, spark=spark, pipeline=pipeline)
    st.dead_letters = read_columns(layout.dead_letters, ["computation", "recorded_ms"], spark=spark)
    st.late = read_columns(layout.late_data, ["computation", "recorded_ms"], spark=spark)
    st.state = state_sizes(layout, spark)
    st.pending = pending_productions(layout, spark)
    return st
