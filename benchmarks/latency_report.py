"""The latency report's per-batch figures, commit-time study, ratios and printed table."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .latency_input import InputLog, Schedule
from .latency_measure import iso_seconds, percentiles

__all__ = ["engine_extras", "ratios", "format_table", "stage_lines"]


def engine_extras(schedule: Schedule, log: InputLog, *, t0: float, warmup_s: float, commit: np.ndarray,
                  batch: np.ndarray, progress: list[dict[str, Any]], details: Mapping[int, Mapping[str, Any]],
                  versions: Mapping[int, Any], seen: Mapping[int, float] | None) -> dict[str, Any]:
    """Per batch and over the steady state: timings, records, the engine's figures, watermark lag."""
    arrival = log.arrivals(schedule)
    per_batch: list[dict[str, Any]] = []
    lags: list[float] = []
    steps: dict[str, list[float]] = {}
    recs = np.bincount(batch[batch >= 0], minlength=1) if (batch >= 0).any() else np.zeros(1, np.int64)
    for p in progress:
        b = int(p["batchId"])
        start = iso_seconds(p["timestamp"])
        dur = p.get("durationMs", {})
        sel = batch == b
        vis = commit[sel]
        vis = vis[~np.isnan(vis)]
        row: dict[str, Any] = {"batch": b, "start_s": round(start - t0, 3), "records": int(recs[b]) if b < recs.size else 0,
                               "duration_ms": dict(dur),
                               "visible_after_start_s": round(float(vis.min() - start), 3) if vis.size else None,
                               "max_latency_s": round(float(np.nanmax(vis - arrival[sel][~np.isnan(commit[sel])])), 3)
                               if vis.size else None}
        d = details.get(b)
        steady = start >= t0 + warmup_s
        if d is not None:
            row["engine"] = {k: d[k] for k in ("records_in", "wall_s", "commit_s", "steps_s", "low_watermark_ms",
                                               "input_watermark_ms", "direct") if k in d}
            end = start + dur.get("triggerExecution", 0) / 1000
            if d.get("low_watermark_ms") is not None and d["low_watermark_ms"] > 0:  # 0: held, upstream unknown
                lag = end - d["low_watermark_ms"] / 1000
                row["low_watermark_lag_s"] = round(lag, 3)
                if steady:
                    lags.append(lag)
            if steady:
                for k, v in (d.get("steps_s") or {}).items():
                    steps.setdefault(k, []).append(float(v))
        per_batch.append(row)
    out: dict[str, Any] = {"per_batch": per_batch}
    if details:
        out["watermark_lag_s"] = percentiles(np.array(lags, float))
        out["engine_steps_s"] = {k: percentiles(np.array(v)) for k, v in steps.items()}
    mt = np.array([v.mtime_s - v.commit_info_s for v in versions.values() if v.commit_info_s is not None])
    times: dict[str, Any] = {"versions": len(versions), "mtime_minus_commit_info_s": percentiles(mt)}
    if seen:
        common = [v for v in versions if v in seen]
        times["seen_minus_mtime_s"] = percentiles(np.array([seen[v] - versions[v].mtime_s for v in common]))
        times["seen_minus_commit_info_s"] = percentiles(np.array(
            [seen[v] - versions[v].commit_info_s for v in common if versions[v].commit_info_s is not None]))
    out["commit_times"] = times
    return out


def ratios(engines: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``a/b`` -> the ratio of a's p50, p99 and max latency to b's, for every pair of engines."""
    out: dict[str, dict[str, float | None]] = {}
    for a, ra in engines.items():
        for b, rb in engines.items():
            if a == b:
                continue
            r: dict[str, float | None] = {}
            for q in ("p50", "p99", "max"):
                x, y = ra["latency_s"].get(q), rb["latency_s"].get(q)
                r[q] = round(x / y, 3) if x is not None and y else None
            out[f"{a}/{b}"] = r
    return out


def stage_lines(stages: list[Mapping[str, Any]]) -> list[str]:
    """For several stages, a line per stage: its latency from arrival, what it added to the stage
    before it and its low watermark's lag."""
    if len(stages) < 2:
        return []
    out = []
    for s in stages:
        lat, added = s["latency_s"], s.get("added_latency_s") or {}
        line = (f"  stage {s['stage']} ({s['output']}): p50 {_f(lat['p50'])} p99 {_f(lat['p99'])}, added p50 "
                f"{_f(added.get('p50'))} p99 {_f(added.get('p99'))}")
        lag = s.get("watermark_lag_s")
        if lag and lag.get("n"):
            line += f", watermark lag p50 {_f(lag['p50'])} p99 {_f(lag['p99'])}"
        out.append(line)
    return out


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_table(report: Mapping[str, Any]) -> str:
    """The printed summary: a line per engine, then every failed check, loudly."""
    hdr = (f"{'engine':<12}{'result':>8}{'p50 s':>9}{'p95 s':>9}{'p99 s':>9}{'max s':>9}{'in/s':>9}{'out/s':>9}"
           f"{'batches':>9}{'batch p50':>10}{'records':>10}")
    lines = [hdr, "-" * len(hdr)]
    failed: list[str] = []
    for name, e in report["engines"].items():
        lat, thr = e["latency_s"], e["throughput"]
        trig = e["batches"]["duration_s"].get("triggerExecution", {})
        lines.append(f"{name:<12}{'ok' if e['ok'] else 'FAILED':>8}{_f(lat['p50']):>9}{_f(lat['p95']):>9}"
                     f"{_f(lat['p99']):>9}{_f(lat['max']):>9}{thr['input_records_per_s'] or 0:>9,.0f}"
                     f"{thr['output_records_per_s'] or 0:>9,.0f}{e['batches']['count']:>9}"
                     f"{_f(trig.get('p50')):>10}{lat['n']:>10,}")
        lines += stage_lines(e.get("stages") or [])
        if not e["ok"]:
            if e.get("error"):
                failed.append(f"!!! {name} FAILED: {e['error']}")
            failed += [f"!!! {name} FAILED check {c['name']} (stage {c['stage']}): {c['detail']}"
                       for c in e["checks"] if not c["ok"]]
    return "\n".join(lines + failed)
