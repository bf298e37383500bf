"""Cache benchmark on the image cache's real access trace: its policies and the offline optimum.

``deltawheel bench cache --trace DIR`` replays each worker's image lookups recorded by a run with
``DELTAWHEEL_IMAGE_CACHE_TRACE=DIR``, bounded to shares of the trace's peak bytes of live images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from deltawheel.executor.tasks.image.cache import ImageCache
from deltawheel.statestore.exceptions import ConfigError

__all__ = ["read_trace", "replay_trace", "replay_trace_opt", "run_trace_bench", "format_trace_table"]


def read_trace(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each worker's events in order (``images-<pid>.jsonl`` -> its lines).

    Raises:
        ConfigError: the folder holds no trace file.
    """
    files = sorted(Path(folder).glob("images-*.jsonl"))
    if not files:
        raise ConfigError(f"{folder}: no image cache trace (images-*.jsonl); run a pipeline with "
                          f"DELTAWHEEL_IMAGE_CACHE_TRACE={folder} first")
    return {f.stem: [json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files}


def _key(e: dict[str, Any]) -> tuple[str, ...]:
    return tuple(e["paths"])


def replay_trace(events: list[dict[str, Any]], policy: str, max_bytes: int) -> dict[str, int]:
    """One worker's events through an :class:`ImageCache` bounded to ``max_bytes``."""
    cache = ImageCache(max_bytes, policy=policy)
    for e in events:
        slot = (e["comp"], e["iv"])
        if e["op"] == "get":
            cache.observe(e["comp"], e.get("wm"))
            if cache.get(_key(e), slot=slot, count=bool(e["paths"])) is None:
                cache.put(_key(e), None, nbytes=e["bytes"], next_ev=e.get("next_ev"), slot=slot, group=e["comp"])
        else:
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


def _peak_live_bytes(events: list[dict[str, Any]]) -> int:
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
                cap = max(1, int(share * _peak_live_bytes(events)))
                got = replay_trace_opt(events, cap) if policy == "opt" else replay_trace(events, policy, cap)
                for c in tot:
                    tot[c] += got[c]
            tot["hit_rate"] = round(tot["hits"] / tot["lookups"], 4) if tot["lookups"] else 0.0  # type: ignore[assignment]
            row[policy] = tot
        runs.append(row)
    report = {"benchmark": "cache_trace", "trace": str(folder), "workers": len(workers),
              "events": sum(len(v) for v in workers.values()),
              "lookups": sum(1 for v in workers.values() for e in v if e["op"] == "get" and e["paths"]),
              "recorded_hit_rate": _recorded_hit_rate(workers), "runs": runs}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache_trace.json").write_text(json.dumps(report, indent=1))
    return report


def _recorded_hit_rate(workers: dict[str, list[dict[str, Any]]]) -> float | None:
    gets = [e for v in workers.values() for e in v if e["op"] == "get" and e["paths"]]
    return round(sum(bool(e["hit"]) for e in gets) / len(gets), 4) if gets else None


def format_trace_table(report: dict[str, Any]) -> str:
    """The runs as a text table: hit rate per policy at each bound."""
    head = f"{'bound (share of peak bytes)':>28} {'lru':>7} {'window':>7} {'opt':>7}"
    lines = [f"{report['workers']} workers, {report['lookups']} image lookups (recorded hit rate "
             f"{report['recorded_hit_rate']})", head, "-" * len(head)]
    for r in report["runs"]:
        lines.append(f"{r['capacity_share']:>28.0%} {r['lru']['hit_rate']:>7.3f} {r['window']['hit_rate']:>7.3f} "
                     f"{r['opt']['hit_rate']:>7.3f}")
    return "\n".join(lines)
