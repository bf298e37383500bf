"""Cache benchmark: the window-aware row cache against LRU on the same access trace.

The trace is the throughput benchmark's row accesses, batch by batch, replayed at several capacities
and through Belady's optimum; a miss is a storage read. ``--trace DIR``: instead the image cache's
lookups recorded with ``DELTAWHEEL_IMAGE_CACHE_TRACE=DIR``, at shares of its peak live bytes."""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from deltawheel.statestore.exceptions import ConfigError

from .args import DEFAULT_CAPACITIES
from .rowcache import MISS, RowCache
from .workload import DELAY_MS, WIN_MS, WorkloadParams, ensure_workload

__all__ = ["Batch", "Trace", "build_trace", "replay", "replay_opt", "run_cache_bench", "format_table",
           "run_from_args", "DEFAULT_CAPACITIES", "read_trace", "replay_trace", "replay_trace_opt", "run_trace_bench",
           "format_trace_table", "peak_live_bytes"]

BATCH_MS = 1_000  # processing time between batches in the replay (no processing-time timers here)


@dataclass(frozen=True)
class Batch:
    """One batch of the trace: the rows it reads, and the next timer it writes back for each."""
    watermark_ms: int | None
    now_ms: int
    keys: tuple[str, ...]  # the rows read, in first-access order
    next_timer: dict[str, int | None]  # what the batch writes back: key -> next event-time timer


@dataclass(frozen=True)
class Trace:
    """The access trace of a workload, batch by batch, with its totals."""
    batches: tuple[Batch, ...]
    distinct_keys: int
    lookups: int
    fired: int  # windows emitted by timers (the workload's emitted rows)
    late: int  # records behind the watermark (the workload's late_dropped)


def build_trace(files: Sequence[Path]) -> Trace:
    """The window count's row accesses over ``files`` (one per batch), then the final timers-only batch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    open_ends: dict[str, set[int]] = {}  # key -> ends of its open windows
    due_at: dict[int, set[str]] = {}  # window end -> keys with that window open
    batches = []
    wm: int | None = None
    seen_max: int | None = None
    fired = late = 0
    for k, f in enumerate([*files, None]):
        if f is None:
            if seen_max is None:
                break
            wm = seen_max - DELAY_MS
            keys_in: list[str] = []
            ts: list[int] = []
        else:
            t = pq.read_table(f, columns=["key", "event_time"])
            keys_in = t.column("key").to_pylist()
            ts = pc.cast(pc.cast(t.column("event_time"), pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()
        touched: dict[str, None] = {}
        for key, e in zip(keys_in, ts, strict=True):
            touched[key] = None
            end = e - e % WIN_MS + WIN_MS
            if wm is not None and end <= wm:
                late += 1  # read, dropped
                continue
            ends = open_ends.setdefault(key, set())
            if end not in ends:
                ends.add(end)
                due_at.setdefault(end, set()).add(key)
        if wm is not None:
            for end in sorted(e for e in due_at if e <= wm):
                for key in due_at.pop(end):
                    fired += 1
                    touched[key] = None
                    open_ends[key].discard(end)
        nxt = {key: (min(open_ends[key]) - 1 if open_ends.get(key) else None) for key in touched}
        batches.append(Batch(wm, k * BATCH_MS, tuple(touched), nxt))
        if ts:
            mx = max(ts)
            seen_max = mx if seen_max is None else max(seen_max, mx)
            wm = seen_max - DELAY_MS
    distinct = len({k for b in batches for k in b.keys})
    return Trace(tuple(batches), distinct, sum(len(b.keys) for b in batches), fired, late)


def replay(trace: Trace, policy: str, capacity: int) -> dict[str, Any]:
    """The trace through a :class:`RowCache`."""
    cache = RowCache(capacity, policy=policy)
    t0 = time.process_time()
    for b in trace.batches:
        cache.begin_batch(watermark_ms=b.watermark_ms, now_ms=b.now_ms)
        for key in b.keys:
            if cache.lookup(key) is MISS:
                cache.put(key, None, next_event_ms=None, next_processing_ms=None)
        for key, nxt in b.next_timer.items():
            cache.put(key, None, next_event_ms=nxt, next_processing_ms=None)
        cache.end_batch()
    cpu = time.process_time() - t0
    return _figures(trace, policy, capacity, cache.stats.hits, cache.stats.misses, cache.stats.evictions, cpu)


def replay_opt(trace: Trace, capacity: int) -> dict[str, Any]:
    """Belady's MIN at batch granularity: after each batch keep the rows needed soonest."""
    uses: dict[str, list[int]] = {}
    for i, b in enumerate(trace.batches):
        for key in b.keys:
            uses.setdefault(key, []).append(i)
    cached: set[str] = set()
    hits = misses = evictions = 0
    t0 = time.process_time()
    for i, b in enumerate(trace.batches):
        for key in b.keys:
            if key in cached:
                hits += 1
            else:
                misses += 1
                cached.add(key)
        over = len(cached) - capacity
        if over > 0:
            def next_use(key: str, i: int = i) -> float:
                u = uses[key]
                j = bisect.bisect_right(u, i)
                return u[j] if j < len(u) else float("inf")
            for key in heapq.nlargest(over, cached, key=next_use):
                cached.discard(key)
            evictions += over
    return _figures(trace, "opt", capacity, hits, misses, evictions, time.process_time() - t0)


def _figures(trace: Trace, policy: str, capacity: int, hits: int, misses: int, evictions: int,
             cpu_s: float) -> dict[str, Any]:
    lookups = hits + misses
    return {"policy": policy, "capacity": capacity, "lookups": lookups, "hits": hits, "misses": misses,
            "cold_misses": trace.distinct_keys, "avoidable_misses": misses - trace.distinct_keys,
            "hit_rate": round(hits / lookups, 4) if lookups else 0.0, "evictions": evictions,
            "cpu_s": round(cpu_s, 3), "us_per_lookup": round(1e6 * cpu_s / lookups, 2) if lookups else 0.0}


def run_cache_bench(size: str, *, out: Path, capacities: Sequence[float] = DEFAULT_CAPACITIES,
                    data_root: Path | None = None, params: WorkloadParams | None = None,
                    progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Replay the trace of the workload ``size`` (a named size, or a custom one with ``params``)."""
    data = ensure_workload(size, root=data_root, params=params)
    t0 = time.monotonic()
    trace = build_trace(data.files)
    progress(f"trace: {len(trace.batches)} batches, {trace.lookups:,} row reads of {trace.distinct_keys:,} keys "
             f"({time.monotonic() - t0:.1f} s)")
    runs = []
    for frac in capacities:
        cap = max(1, int(round(frac * trace.distinct_keys)))
        row: dict[str, Any] = {"capacity_share": frac, "capacity": cap}
        for policy in ("lru", "window"):
            row[policy] = replay(trace, policy, cap)
        row["opt"] = replay_opt(trace, cap)
        lru, win, opt = row["lru"]["misses"], row["window"]["misses"], row["opt"]["misses"]
        row["window_vs_lru_misses"] = round(win / lru, 3) if lru else None
        row["gap_closed"] = round((lru - win) / (lru - opt), 3) if lru > opt else None
        runs.append(row)
        progress(f"capacity {cap:,} rows ({frac:.0%}): hit rate lru {row['lru']['hit_rate']:.3f}, "
                 f"window {row['window']['hit_rate']:.3f}, opt {row['opt']['hit_rate']:.3f}; "
                 f"storage reads window/lru {row['window_vs_lru_misses']}")
    report = {"benchmark": "cache", "workload": "zeitgeist-window-count", "size": size,
              "content_sha256": data.content_sha256, "batches": len(trace.batches), "lookups": trace.lookups,
              "distinct_keys": trace.distinct_keys, "runs": runs,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache.json").write_text(json.dumps(report, indent=1))
    from .plot import plot_cache

    plot_cache(report, out / "cache.png")
    return report


def format_table(report: dict[str, Any]) -> str:
    """The report's runs as a text table: hit rates per policy, reads saved against LRU, time per lookup."""
    head = f"{'capacity':>10} {'share':>6} {'lru':>7} {'window':>7} {'opt':>7} {'reads w/lru':>11} {'gap closed':>10} " \
           f"{'us/lookup lru':>13} {'window':>7}"
    lines = [head, "-" * len(head)]
    for r in report["runs"]:
        gap = "-" if r["gap_closed"] is None else f"{r['gap_closed']:.2f}"
        lines.append(f"{r['capacity']:>10,} {r['capacity_share']:>6.0%} {r['lru']['hit_rate']:>7.3f} "
                     f"{r['window']['hit_rate']:>7.3f} {r['opt']['hit_rate']:>7.3f} "
                     f"{r['window_vs_lru_misses']:>11} {gap:>10} {r['lru']['us_per_lookup']:>13} "
                     f"{r['window']['us_per_lookup']:>7}")
    return "\n".join(lines)


def read_trace(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each worker's events in order (``images-<pid>.jsonl`` -> its lines).

    Raises:
        ConfigError: the folder holds no trace file.
    """
    if not (files := sorted(Path(folder).glob("images-*.jsonl"))):
        raise ConfigError(f"{folder}: no image cache trace (images-*.jsonl); run a pipeline with "
                          f"DELTAWHEEL_IMAGE_CACHE_TRACE={folder} first")
    return {f.stem: [json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files}


def _key(e: dict[str, Any]) -> tuple[str, ...]:
    return tuple(e["paths"])


def replay_trace(events: list[dict[str, Any]], policy: str, max_bytes: int) -> dict[str, int]:
    """One worker's events through an :class:`ImageCache` bounded to ``max_bytes``."""
    from deltawheel.executor.tasks.image.cache import ImageCache

    cache = ImageCache(max_bytes, policy=policy)
    for e in events:
        slot = (e["comp"], e["iv"])
        if e["op"] == "get":
            cache.observe(e["comp"], e.get("wm"))
        if e["op"] != "get" or cache.get(_key(e), slot=slot, count=bool(e["paths"])) is None:
            cache.put(_key(e), None, nbytes=e["bytes"], next_ev=e.get("next_ev"), slot=slot, group=e["comp"])
    return {"lookups": cache.lookups, "hits": cache.hits, "evictions": cache.evictions}


def replay_trace_opt(events: list[dict[str, Any]], max_bytes: int) -> dict[str, int]:
    """Belady's optimum on one worker's events: over the bound, drop the image next looked up last."""
    nxt: list[float] = [float("inf")] * len(events)
    seen: dict[tuple[str, ...], int] = {}
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        k = _key(e)
        nxt[i] = seen.get(k, float("inf"))
        if e["op"] == "get":
            seen[k] = i
    held: dict[tuple[str, ...], tuple[int, float]] = {}  # key -> (bytes, its next lookup)
    lookups = hits = evictions = 0
    for i, e in enumerate(events):
        k = _key(e)
        if e["op"] == "get" and e["paths"]:
            lookups += 1
            if k in held:
                hits += 1
                held[k] = (held[k][0], nxt[i])
                continue
        held[k] = (e["bytes"], nxt[i])
        while sum(b for b, _ in held.values()) > max_bytes and held:
            victim = max(held, key=lambda x: held[x][1])
            del held[victim]
            evictions += 1
    return {"lookups": lookups, "hits": hits, "evictions": evictions}


def peak_live_bytes(events: list[dict[str, Any]]) -> int:
    """The most bytes of live images (each interval's current one) the worker held at once."""
    live: dict[tuple[str, int], int] = {}
    peak = 0
    for e in events:
        live[(e["comp"], e["iv"])] = e["bytes"]
        peak = max(peak, sum(live.values()))
    return peak


def run_trace_bench(folder: Path, *, out: Path, shares: Sequence[float]) -> dict[str, Any]:
    """Replay the trace in ``folder`` at each bound (a share of each worker's peak live bytes)."""
    workers = read_trace(folder)
    runs = []
    for share in shares:
        row: dict[str, Any] = {"capacity_share": share}
        for policy in ("lru", "window", "opt"):
            tot = {"lookups": 0, "hits": 0, "evictions": 0}
            for events in workers.values():
                cap = max(1, int(share * peak_live_bytes(events)))
                got = replay_trace_opt(events, cap) if policy == "opt" else replay_trace(events, policy, cap)
                for c in tot:
                    tot[c] += got[c]
            tot["hit_rate"] = round(tot["hits"] / tot["lookups"], 4) if tot["lookups"] else 0.0  # type: ignore[assignment]
            row[policy] = tot
        runs.append(row)
    gets = [e for v in workers.values() for e in v if e["op"] == "get" and e["paths"]]
    report = {"benchmark": "cache_trace", "trace": str(folder), "workers": len(workers),
              "events": sum(len(v) for v in workers.values()), "lookups": len(gets),
              "recorded_hit_rate": round(sum(bool(e["hit"]) for e in gets) / len(gets), 4) if gets else None,
              "runs": runs}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache_trace.json").write_text(json.dumps(report, indent=1))
    return report


def format_trace_table(report: dict[str, Any]) -> str:
    """The runs as a text table: hit rate per policy at each bound."""
    head = f"{'bound (share of peak bytes)':>28} {'lru':>7} {'window':>7} {'opt':>7}"
    lines = [f"{report['workers']} workers, {report['lookups']} image lookups (recorded hit rate "
             f"{report['recorded_hit_rate']})", head, "-" * len(head)]
    lines += [f"{r['capacity_share']:>28.0%} {r['lru']['hit_rate']:>7.3f} {r['window']['hit_rate']:>7.3f} "
              f"{r['opt']['hit_rate']:>7.3f}" for r in report["runs"]]
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    """``deltawheel bench cache``: print the table, write the JSON (and PNG); returns 0.

    Raises:
        ConfigError: ``--capacities`` are not shares in (0, 1].
    """
    try:
        caps = [float(c) for c in str(args.capacities).split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"--capacities must be numbers like 0.05,0.1, got {args.capacities!r}") from None
    if not caps or any(not 0 < c <= 1 for c in caps):
        raise ConfigError(f"--capacities must be shares in (0, 1], got {args.capacities!r}")
    out = Path(args.out)
    if getattr(args, "trace", None):
        print(format_trace_table(run_trace_bench(Path(args.trace), out=out, shares=caps)))
        print(f"wrote {out / 'cache_trace.json'}")
    else:
        print(format_table(run_cache_bench(args.size, out=out, capacities=caps, data_root=args.data_root)))
        print(f"wrote {out / 'cache.json'} and {out / 'cache.png'}")
    return 0
