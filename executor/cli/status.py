"""``deltawheel status``: how a store's pipelines are doing, in the terminal.

Per computation: the owners and sequencers of its intervals (ZooKeeper leases), its input and
output low watermarks and their lag behind the wall clock (the watermark authority), the last
batches' sizes and step times (the store's ``_metrics/batches`` table,
``executor/protocol/metrics.py``), the productions checkpointed in its rows and how many of them
have not landed in their streams (by record id, as ``deltawheel recover`` counts them), and the
dead letters and late records it has set aside. :func:`gather` collects it all (``deltawheel
report`` plots the same); a local store is read without starting Spark.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any

from deltawheel.statestore.layout import StoreLayout

from ..protocol.metrics import read_batches
from .common import add_store_arg, add_zk_args, store_zookeeper

__all__ = ["register", "StoreStatus", "gather", "render", "read_columns"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``status``."""
    p = subparsers.add_parser("status", help="owners, watermarks and lag, last batches, dead letters per computation")
    add_store_arg(p)
    p.add_argument("--pipeline", help="only this pipeline")
    p.add_argument("--batches", type=int, default=3, metavar="N", help="last batches shown per computation (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_zk_args(p)
    p.add_argument("--zk-timeout", type=float, default=10.0, help="seconds to wait for ZooKeeper")
    p.set_defaults(func=_run)


@dataclass
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
    # computation -> productions checkpointed in its rows, and those of them not in their stream;
    # None: not known (a rows table Python cannot read, and no Spark)
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
        for up in comp["upstream"]:
            kind, _, name = up.partition(":")
            src = snap["injectors"].get(name) if kind == "injector" else snap["computations"].get(name)
            wm = None if src is None else (src.get("watermark_ms") if kind == "injector"
                                           else _output(src))
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


def read_columns(path: str, columns: list[str], *, spark: Any = None) -> list[dict[str, Any]]:
    """``columns`` of every row of the Delta table at ``path`` ([] if there is none): a local
    table read from its log and Parquet files, another one through ``spark``."""
    from deltawheel.statestore.delta.log import local_table_exists, read_snapshot
    from deltawheel.statestore.delta.storefs import local_path

    local = local_path(path)
    if local is not None:
        if not local_table_exists(path):
            return []
        snap = read_snapshot(path)
        if snap is not None:
            from deltawheel.statestore.delta.deletionvectors import live_table
            from deltawheel.statestore.delta.storefs import TableFiles
            from deltawheel.statestore.delta.txn import decode_path

            root = TableFiles(local)
            out: list[dict[str, Any]] = []
            for a in snap.adds:  # (the rows a file's deletion vector leaves live)
                out += live_table(root, decode_path(a["path"]), a.get("deletionVector"), columns=columns).to_pylist()
            return out
    if spark is None:
        raise ValueError(f"reading {path} needs a SparkSession")
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [r.asDict() for r in spark.read.format("delta").load(path).select(*columns).collect()]


def _state_sizes(layout: StoreLayout, spark: Any) -> dict[str, dict[str, int]]:
    """Per computation in the rows table: ``keys`` (the user keys holding a row), ``rows`` (every
    physical row: the keys', the fence rows and the image path's record-ids rows), ``bytes`` and
    ``files``. A local table: the key column read with pyarrow, the rest from its log; another one:
    keys and rows counted by Spark (bytes and files 0: not read)."""
    import pyarrow.compute as pc
    from deltawheel.statestore.delta.log import read_snapshot
    from deltawheel.statestore.delta.storefs import local_path
    from deltawheel.statestore.rowtable.rows import RESERVED_PREFIX

    out: dict[str, dict[str, int]] = {}
    local = local_path(layout.rows)
    snap = read_snapshot(layout.rows) if local is not None else None
    if snap is not None and local is not None:
        from deltawheel.statestore.delta.deletionvectors import live_table
        from deltawheel.statestore.delta.storefs import TableFiles
        from deltawheel.statestore.delta.txn import decode_path

        root = TableFiles(local)
        for a in snap.adds:
            comp = (a.get("partitionValues") or {}).get("computation") or "-"
            s = out.setdefault(comp, {"keys": 0, "rows": 0, "bytes": 0, "files": 0})
            keys = live_table(root, decode_path(a["path"]), a.get("deletionVector"), columns=["key"]).column(0)
            s["rows"] += len(keys)
            if len(keys):
                s["keys"] += len(keys) - int(pc.sum(pc.starts_with(keys, RESERVED_PREFIX)).as_py())
            s["bytes"] += int(a.get("size", 0))
            s["files"] += 1
    elif spark is not None:
        from pyspark.sql import functions as F

        user = (~F.col("key").startswith(RESERVED_PREFIX)).cast("int")
        for r in (spark.read.format("delta").load(layout.rows).groupBy("computation")
                  .agg(F.count("*").alias("rows"), F.sum(user).alias("keys")).collect()):
            out[r["computation"]] = {"keys": int(r["keys"] or 0), "rows": int(r["rows"]), "bytes": 0, "files": 0}
    return out


def pending_productions(layout: StoreLayout, spark: Any) -> dict[str, dict[str, int]] | None:
    """Per computation, the productions checkpointed in its rows (``checkpointed``) and how many of
    them are not in their stream table (``undelivered``, by record id); None when the table is
    not a local one and ``spark`` is None."""
    from deltawheel.statestore.delta.log import local_table_exists, read_snapshot
    from deltawheel.statestore.delta.storefs import local_path

    held: list[tuple[str, str, str]] = []  # computation, stream, production id
    local = local_path(layout.rows)
    snap = read_snapshot(layout.rows) if local is not None and local_table_exists(layout.rows) else None
    if snap is not None and local is not None:
        from deltawheel.statestore.delta.deletionvectors import live_table
        from deltawheel.statestore.delta.storefs import TableFiles
        from deltawheel.statestore.delta.txn import decode_path

        root = TableFiles(local)
        for a in snap.adds:  # (the rows a file's deletion vector leaves live)
            comp = (a.get("partitionValues") or {}).get("computation") or "-"
            for lst in live_table(root, decode_path(a["path"]), a.get("deletionVector"),
                                  columns=["pending"]).column(0).to_pylist():
                held += [(comp, p["stream"], p["production_id"]) for p in lst or ()]
    elif local is not None and not local_table_exists(layout.rows):
        return {}
    elif spark is None:
        return None
    else:
        from pyspark.sql import functions as F

        for r in (spark.read.format("delta").load(layout.rows).select("computation", F.explode("pending").alias("p"))
                  .select("computation", "p.stream", "p.production_id").collect()):
            held.append((r[0], r[1], r[2]))
    landed: set[str] = set()
    for stream in sorted({st for _, st, _ in held}):
        try:
            landed |= {r["record_id"] for r in read_columns(layout.stream(stream), ["record_id"], spark=spark)}
        except ValueError:  # a local stream table only Spark reads
            return None
    out: dict[str, dict[str, int]] = {}
    for comp, _stream, pid in held:
        c = out.setdefault(comp, {"checkpointed": 0, "undelivered": 0})
        c["checkpointed"] += 1
        c["undelivered"] += pid not in landed
    return out


def gather(layout: StoreLayout, client: Any, *, pipeline: str | None = None, spark: Any = None,
           now_ms: int | None = None) -> StoreStatus:
    """Everything ``status`` and ``report`` show, from the store (``spark`` is needed only for a
    store that is not local) and the ZooKeeper ``client`` (None: the store's figures only)."""
    from deltawheel.statestore.zk.lease_tools import list_leases

    from ..drivers.wiring import watermark_reader

    st = StoreStatus(store=layout.root, now_ms=int(time.time() * 1000) if now_ms is None else now_ms)
    if client is not None:
        st.leases = list_leases(client, pipeline=pipeline)
        names = [pipeline] if pipeline else (sorted(client.get_children("/pipelines"))
                                             if client.exists("/pipelines") else [])
        for p in names:
            authority = watermark_reader(client, pipeline=p)
            try:
                st.watermarks[p] = authority.snapshot()
            finally:
                authority.close()  # a watching caller polls on one client: leave no listener behind
    st.batches = read_batches(layout, spark=spark, pipeline=pipeline)
    st.dead_letters = read_columns(layout.dead_letters, ["computation", "recorded_ms"], spark=spark)
    st.late = read_columns(layout.late_data, ["computation", "recorded_ms"], spark=spark)
    st.state = _state_sizes(layout, spark)
    st.pending = pending_productions(layout, spark)
    return st


def _ts(ms: int | None, now_ms: int) -> str:
    from deltawheel.statestore.zk.watermarks import END_OF_TIME

    from ..protocol.reports import UNKNOWN, watermark_known

    if ms is None or not watermark_known(ms):  # none yet, or held at 0 for an upstream watermark not known yet
        return UNKNOWN
    if ms >= END_OF_TIME:
        return "end of time (input finished)"
    lag = (now_ms - ms) / 1000
    t = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))
    return f"{t} UTC, lag {_dur(lag)}" if lag >= 0 else f"{t} UTC, {_dur(-lag)} ahead of the clock"


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}min"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n} B"


def render(st: StoreStatus, *, batches: int = 3) -> str:
    """The status as text for a terminal."""
    lines = [f"store {st.store}  (at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(st.now_ms / 1000))} UTC)"]
    comps = st.computations()
    if not comps:
        lines.append("no pipeline has run on this store yet (no leases, watermarks or batch figures)")
        return "\n".join(lines)
    for pipeline, comp in comps:
        lines.append("")
        lines.append(f"{pipeline} / {comp}")
        ivs = [r for r in st.leases if r["pipeline"] == pipeline and r["computation"] == comp]
        held = [r for r in ivs if r["owner"] is not None]
        owners: dict[str, list[str]] = {}
        for r in held:
            owners.setdefault(str(r["owner"]), []).append(f"{r['interval']} (seq {r['sequencer']})")
        if ivs:
            lines.append(f"  intervals  {len(ivs)}, {len(held)} held" + ("" if held else " (no instance is running)"))
            for who, what in sorted(owners.items()):
                lines.append(f"    {who}: " + ", ".join(what))
        lines.append(f"  input watermark   {_ts(st.input_watermark(pipeline, comp), st.now_ms)}")
        lines.append(f"  output watermark  {_ts(st.output_watermark(pipeline, comp), st.now_ms)}")
        rows = [r for r in st.batches if r["computation"] == comp and (r["pipeline"] or "-") == pipeline]
        dead = sum(1 for r in st.dead_letters if r["computation"] == comp)
        late = sum(1 for r in st.late if r["computation"] == comp)
        late_flagged = sum(int(r["late"] or 0) for r in rows)
        size = st.state.get(comp)
        if size:
            lines.append(f"  state             {_plural(size['keys'], 'key')} ({_plural(size['rows'], 'physical row')} "
                         f"with the fence and record-id rows, {_size(size['bytes'])} in "
                         f"{_plural(size['files'], 'file')})")
        lines.append(f"  dead letters      {dead}    late records {late} routed to late_data, "
                     f"{late_flagged} flagged late by the batches recorded")
        lines.append(f"  pending productions {_pending(st, pipeline, comp, running=bool(held))}")
        if not rows:
            lines.append("  batches           none recorded (the store's _metrics/batches table has no row for it)")
            continue
        total_in = sum(int(r["records_in"] or 0) for r in rows)
        lines.append(f"  batches           {len(rows)} recorded, {total_in} records in")
        for r in rows[-batches:]:
            steps = ", ".join(f"{k} {v:.2f}" for k, v in sorted((r["steps_s"] or {}).items(), key=lambda kv: -kv[1]))
            at = time.strftime("%H:%M:%S", time.gmtime(r["recorded_ms"] / 1000))
            lines.append(f"    batch {r['batch_id']:>5} at {at}  {r['records_in']} in, {r['processed']} processed, "
                         f"{r['duplicates']} dup, {r['late']} late, {r['dead_letters']} dead, "
                         f"{r['productions']} produced; {r['wall_s']:.2f}s ({steps})  [{r['instance']}]")
    return "\n".join(lines)


def _pending(st: StoreStatus, pipeline: str, comp: str, *, running: bool) -> str:
    """What the pending-productions line says: what is checkpointed in the rows, whether it
    landed, and what to do when it did not and nothing runs."""
    if st.pending is None:
        return (f"not known without Spark (the rows table has deletion vectors): `deltawheel recover --store "
                f"{st.store} --pipeline {pipeline}` lists them")
    c = st.pending.get(comp, {"checkpointed": 0, "undelivered": 0})
    todo, n = c["undelivered"], c["checkpointed"]
    if not n:
        return "none"
    if not todo:
        return f"none: the {n} still checkpointed in the rows are in their streams (the next batch's commit clears them)"
    if running:
        return (f"{todo} checkpointed have not landed in their streams yet: the running instance delivers them "
                "(its next batch waits for them)")
    return (f"{todo} checkpointed have not landed in their streams, and no instance holds an interval: deliver "
            f"them with `deltawheel recover --store {st.store} --pipeline {pipeline} --apply` (or run the pipeline "
            "again: its start delivers them)")


def _run(args: argparse.Namespace) -> int:
    from .common import existing_layout_from, spark_from

    layout = existing_layout_from(args)
    spark = None if layout.is_local else spark_from(args)
    with store_zookeeper(args) as (layout, _cfg, client):
        st = gather(layout, client, pipeline=args.pipeline, spark=spark)
    if args.json:
        print(json.dumps(st.__dict__, indent=2, default=str))
    else:
        print(render(st, batches=args.batches))
    return 0
