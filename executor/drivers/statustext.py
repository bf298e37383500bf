"""A store's status (:mod:`.status`) as text: ``deltawheel status`` prints it, ``report`` shows it."""

from __future__ import annotations

import time

from .status import StoreStatus

__all__ = ["render"]


def _ts(ms: int | None, now_ms: int) -> str:
    from deltawheel.executor.protocol.reports import UNKNOWN, watermark_known
    from deltawheel.statestore.zk.watermarks import END_OF_TIME

    if ms is None or not watermark_known(ms):  # none yet, or held at 0 for an upstream watermark not known yet
        return UNKNOWN
    if ms >= END_OF_TIME:
        return "end of time (input finished)"
    lag = (now_ms - ms) / 1000
    t = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))
    return f"{t} UTC, lag {_dur(lag)}" if lag >= 0 else f"{t} UTC, {_dur(-lag)} ahead of the clock"


def _dur(s: float) -> str:
    for below, per, unit in ((120, 1, "s"), (7200, 60, "min"), (172800, 3600, "h")):
        if s < below:
            return f"{s / per:.1f}{unit}"
    return f"{s / 86400:.1f}d"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def render(st: StoreStatus, *, batches: int = 3) -> str:
    """The status as text for a terminal."""
    lines = [f"store {st.store}  (at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(st.now_ms / 1000))} UTC)"]
    comps = st.computations()
    if not comps:
        lines.append("no pipeline has run on this store yet (no leases, watermarks or batch figures)")
        return "\n".join(lines)
    for pipeline, comp in comps:
        lines += ["", f"{pipeline} / {comp}"]
        ivs = [r for r in st.leases if r["pipeline"] == pipeline and r["computation"] == comp]
        held = [r for r in ivs if r["owner"] is not None]
        owners: dict[str, list[str]] = {}
        for r in held:
            owners.setdefault(str(r["owner"]), []).append(f"{r['interval']} (seq {r['sequencer']})")
        if ivs:
            lines.append(f"  intervals  {len(ivs)}, {len(held)} held" + ("" if held else " (no instance is running)"))
            lines += [f"    {who}: " + ", ".join(what) for who, what in sorted(owners.items())]
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
            lines.append("  batches           none recorded (its metrics table has no row yet)")
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
    """The pending-productions line: how many are checkpointed, landed, and what to do if nothing runs."""
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
