"""From an engine's output rows to each record's latency, the exactly-once checks and the report.

An output is either ``records``, one row per input record (``record_id``, ``key``, ``count``: its
running count or null, ``version``), or ``key_counts``, one row per (micro-batch, key) whose count
changed (``batch_id``, ``key``, ``count``, ``version``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from .latency_input import InputLog, Schedule

__all__ = ["Check", "check_records", "check_key_counts", "record_times", "percentiles", "summarize",
           "version_times", "iso_seconds", "COMMIT_TIME_SOURCES", "engine_extras", "ratios", "format_table",
           "stage_lines"]

COMMIT_TIME_SOURCES = ("mtime", "commit_info")


@dataclass(frozen=True)
class Check:
    """One check of an engine's output: its name, whether it held, and what was found."""

    name: str
    ok: bool
    detail: str


def _col(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False))


def check_records(schedule: Schedule, rows: pa.Table | None, *, renamed: np.ndarray | None = None,
                  counted: bool = True) -> list[Check]:
    """Checks of a ``records`` output: every renamed record (``renamed``: per file, NaN if not)
    exactly once with its own key, and (``counted``) each key's running counts exactly 1..n."""
    expected = np.ones(schedule.total, bool) if renamed is None else ~np.isnan(renamed[schedule.file_of])
    rid = np.zeros(0, np.int64) if rows is None else _col(rows, "record_id").astype(np.int64)
    ok = (rid >= 0) & (rid < schedule.total)
    seen = np.bincount(rid[ok], minlength=schedule.total)
    missing = int(((seen == 0) & expected).sum())
    dup = int((seen > 1).sum())
    extra = int(((seen > 0) & ~expected).sum()) + int((~ok).sum())
    checks = [Check("exactly_once", missing == 0 and dup == 0 and extra == 0,
                    f"{int(expected.sum())} input records: {missing} missing, {dup} more than once"
                    f" ({int((seen[seen > 1] - 1).sum())} extra rows), {extra} unknown ids")]
    if rows is None or rows.num_rows == 0:
        return checks
    keys = _col(rows, "key").astype(np.int64)
    wrong_key = int((keys[ok] != schedule.key_ids[rid[ok]]).sum())
    checks.append(Check("keys", wrong_key == 0, f"{wrong_key} rows with another key than their record's"))
    if counted:
        counts = _col(rows, "count").astype(np.int64)
        order = np.lexsort((counts, keys))
        k, c = keys[order], counts[order]
        starts = np.r_[0, np.flatnonzero(np.diff(k)) + 1]
        rank = np.arange(k.size) - np.repeat(starts, np.diff(np.r_[starts, k.size])) + 1
        per_key_in = np.bincount(schedule.key_ids[expected], minlength=schedule.keys)
        per_key_out = np.bincount(k, minlength=schedule.keys) if k.size else np.zeros(schedule.keys, np.int64)
        bad_rank = int((c != rank).sum())
        bad_n = int((per_key_in != per_key_out[:schedule.keys]).sum())
        checks.append(Check("running_counts", bad_rank == 0 and bad_n == 0,
                            f"{bad_rank} rows whose count is not its rank among its key's rows; "
                            f"{bad_n} keys whose number of rows differs from their input records"))
    return checks


def check_key_counts(schedule: Schedule, rows: pa.Table | None, *, file_batch: np.ndarray,
                     renamed: np.ndarray | None = None, record_batch: np.ndarray | None = None) -> list[Check]:
    """Checks of a ``key_counts`` output: every record read by one batch (``file_batch``, or per record
    ``record_batch``), one row per (batch, key), and each key's counts adding up."""
    expected_files = np.ones(schedule.n_files, bool) if renamed is None else ~np.isnan(renamed)
    if record_batch is None:
        unread = int(((file_batch < 0) & expected_files).sum())
        checks = [Check("files_read", unread == 0,
                        f"{unread} of {int(expected_files.sum())} input files read by no batch")]
        rec_batch = file_batch[schedule.file_of]
    else:
        wanted = expected_files[schedule.file_of]
        unread = int(((record_batch < 0) & wanted).sum())
        checks = [Check("records_read", unread == 0,
                        f"{unread} of {int(wanted.sum())} input records read by no batch")]
        rec_batch = record_batch
    keep = (rec_batch >= 0) & expected_files[schedule.file_of]
    pairs, n = np.unique(np.stack([rec_batch[keep], schedule.key_ids[keep]]), axis=1, return_counts=True)
    want = dict(zip(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True), n.tolist(), strict=True))
    got: dict[tuple[int, int], int] = {}
    final: dict[int, int] = {}
    got_n = dup = 0
    if rows is not None and rows.num_rows:
        b, k, c = (_col(rows, x).astype(np.int64) for x in ("batch_id", "key", "count"))
        order = np.lexsort((b, k))
        b, k, c = b[order], k[order], c[order]
        same = (np.diff(k) == 0) & (np.diff(b) == 0)
        dup = int(same.sum())
        prev = np.r_[0, c[:-1]]
        prev[np.r_[True, np.diff(k) != 0]] = 0
        for bb, kk, inc in zip(b.tolist(), k.tolist(), (c - prev).tolist(), strict=True):
            got[(bb, kk)] = got.get((bb, kk), 0) + inc
        last = np.r_[np.flatnonzero(np.diff(k)), k.size - 1]
        final = dict(zip(k[last].tolist(), c[last].tolist(), strict=True))
        got_n = int(rows.num_rows)
    checks.append(Check("one_row_per_batch_and_key", dup == 0, f"{dup} (batch, key) rows more than once of {got_n}"))
    wrong = sum(1 for p in set(want) | set(got) if want.get(p, 0) != got.get(p, 0))
    checks.append(Check("batch_increments", wrong == 0,
                        f"{wrong} of {len(want)} (batch, key) pairs whose count increment differs from the "
                        "batch's input records of that key"))
    per_key = np.bincount(schedule.key_ids[expected_files[schedule.file_of]], minlength=schedule.keys)
    bad_final = sum(1 for key in range(schedule.keys) if final.get(key, 0) != int(per_key[key]))
    checks.append(Check("final_counts", bad_final == 0,
                        f"{bad_final} of {int((per_key > 0).sum())} keys whose last count differs from their "
                        "input records"))
    return checks


def version_times(versions: Mapping[int, Any], source: str) -> dict[int, float]:
    """version -> commit time: its ``<v>.json`` mtime, or (``commit_info``) commitInfo.timestamp if set."""
    if source not in COMMIT_TIME_SOURCES:
        raise ValueError(f"commit time source must be one of {COMMIT_TIME_SOURCES}, not {source!r}")
    ci = source == "commit_info"
    return {v: float(i.commit_info_s if ci and i.commit_info_s is not None else i.mtime_s)
            for v, i in versions.items()}


def record_times(schedule: Schedule, rows: pa.Table | None, *, kind: str, vtime: Mapping[int, float],
                 file_batch: np.ndarray, record_batch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(commit time of each record's output, the earliest or NaN, and its batch or -1);
    ``record_batch``: each record's batch where not its file's (Kafka)."""
    commit = np.full(schedule.total, np.nan)
    batch = file_batch[schedule.file_of] if record_batch is None else record_batch
    if rows is None or rows.num_rows == 0:
        return commit, batch
    version = _col(rows, "version").astype(np.int64)
    t = np.array([vtime[int(v)] for v in version]) if version.size else np.zeros(0)
    if kind == "records":
        rid = _col(rows, "record_id").astype(np.int64)
        ok = (rid >= 0) & (rid < schedule.total)
        rid, t = rid[ok], t[ok]
        order = np.argsort(-t)  # earliest last: it wins the assignment
        commit[rid[order]] = t[order]
    elif kind == "key_counts":
        b = _col(rows, "batch_id").astype(np.int64)
        first: dict[int, float] = {}
        for bb, tt in zip(b.tolist(), t.tolist(), strict=True):
            first[bb] = min(tt, first.get(bb, tt))
        commit = np.array([first.get(int(x), np.nan) for x in batch]) if batch.size else commit
    else:
        raise ValueError(f"unknown output kind {kind!r}")
    return commit, batch


def percentiles(values: np.ndarray) -> dict[str, float | int | None]:
    """n, p50, p95, p99, max and mean of ``values`` (seconds, rounded to ms)."""
    v = values[~np.isnan(values)]
    if v.size == 0:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    p50, p95, p99 = np.percentile(v, [50, 95, 99])
    return {"n": int(v.size), "p50": round(float(p50), 3), "p95": round(float(p95), 3), "p99": round(float(p99), 3),
            "max": round(float(v.max()), 3), "mean": round(float(v.mean()), 3)}


def _batch_durations(progress: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    keys = sorted({k for p in progress for k in p.get("durationMs", {})})
    return {k: percentiles(np.array([p["durationMs"].get(k, np.nan) / 1000 for p in progress], float)) for k in keys}


_BEFORE_BATCH = ("latestOffset", "walCommit", "getBatch", "queryPlanning")


def summarize(schedule: Schedule, log: InputLog, *, t0: float, warmup_s: float, commit: np.ndarray,
              batch: np.ndarray, progress: Sequence[Mapping[str, Any]], work_s: Mapping[int, float] | None = None,
              bucket_s: float = 1.0) -> dict[str, Any]:
    """The figures of one output: steady-state latency percentiles, throughput, latency over time and
    where the time went; ``work_s``: the engine's own time inside each batch."""
    arrival = log.arrivals(schedule)
    latency = commit - arrival
    steady = (arrival >= t0 + warmup_s) & ~np.isnan(arrival)
    lat = latency[steady]
    out: dict[str, Any] = {"latency_s": percentiles(lat)}
    done_lat = lat[~np.isnan(lat)]
    out["quantiles_s"] = [round(float(q), 4) for q in np.percentile(done_lat, np.arange(101))] if done_lat.size else []
    arrived = steady.sum()
    span = (np.nanmax(arrival[steady]) - np.nanmin(arrival[steady])) if arrived else 0.0
    done = commit[steady]
    done = done[~np.isnan(done)]
    out["throughput"] = {
        "input_records_per_s": round(float(arrived / span), 1) if span > 0 else None,
        "output_records_per_s": round(float(done.size / (done.max() - done.min())), 1) if done.size > 1 and
        done.max() > done.min() else None,
        "steady_records": int(arrived), "steady_records_out": int(done.size)}
    rel = arrival - t0
    buckets: list[dict[str, Any]] = []
    if np.any(~np.isnan(rel)):
        edges = np.arange(np.floor(np.nanmin(rel)), np.nanmax(rel) + bucket_s, bucket_s)
        idx = np.digitize(rel, edges) - 1
        for i in range(len(edges)):
            sel = (idx == i) & ~np.isnan(latency)
            if sel.any():
                v = latency[sel]
                buckets.append({"t": round(float(edges[i]), 3), "n": int(sel.sum()),
                                "p50": round(float(np.median(v)), 3), "max": round(float(v.max()), 3)})
    out["over_time"] = buckets
    prog = sorted({int(p["batchId"]): p for p in progress}.values(), key=lambda p: int(p["batchId"]))
    out["batches"] = {"count": len(prog), "duration_s": _batch_durations(prog)}
    # where a record's time went: to its batch's trigger start, Spark's steps before the data is
    # written (listing, offset log, getBatch, planning), then to the visible commit
    start = {int(p["batchId"]): iso_seconds(p["timestamp"]) for p in prog}
    before = {int(p["batchId"]): sum(p.get("durationMs", {}).get(k, 0) for k in _BEFORE_BATCH) / 1000 for p in prog}
    ts = np.array([start.get(int(b), np.nan) for b in batch]) if batch.size else np.zeros(0)
    pre = np.array([before.get(int(b), np.nan) for b in batch]) if batch.size else np.zeros(0)
    sel = steady & ~np.isnan(latency) & ~np.isnan(ts)
    out["breakdown_s"] = {
        "records": int(sel.sum()),
        "waiting_for_trigger": percentiles((ts - arrival)[sel]),
        "spark_before_write": percentiles(pre[sel]),
        "write_to_visible_commit": percentiles((commit - ts - pre)[sel]),
    }
    if work_s:
        work = np.array([work_s.get(int(b), np.nan) for b in batch]) if batch.size else np.zeros(0)
        out["breakdown_s"]["batch_work"] = percentiles(work[sel])
        out["breakdown_s"]["after_batch_work_to_visible"] = percentiles((commit - ts - pre - work)[sel])
    return out


def iso_seconds(ts: str) -> float:
    """A progress report's ISO timestamp as seconds since the epoch."""
    import datetime as dt

    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


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
            row["engine"] = {k: d[k] for k in _ENGINE_KEYS if k in d}
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
    if not progress:  # a stage without a query (fused): its executor's batches, without Spark's timings
        per_batch, steps = _executor_rows(details)
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


_ENGINE_KEYS = ("records_in", "wall_s", "commit_s", "steps_s", "low_watermark_ms", "input_watermark_ms", "direct")


def _executor_rows(details: Mapping[int, Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Per batch of an executor's reports: its figures (no start time: it has no query); the steps' times."""
    rows: list[dict[str, Any]] = []
    steps: dict[str, list[float]] = {}
    for b, d in sorted(details.items()):
        rows.append({"batch": b, "records": int(d.get("records_in", 0)),
                     "engine": {k: d[k] for k in _ENGINE_KEYS if k in d}})
        for k, v in (d.get("steps_s") or {}).items():
            steps.setdefault(k, []).append(float(v))
    return rows, steps


def ratios(engines: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``a/b`` -> the ratio of a's p50, p99 and max latency to b's, for every pair of engines."""
    def ratio(x: float | None, y: float | None) -> float | None:
        return round(x / y, 3) if x is not None and y else None

    return {f"{a}/{b}": {q: ratio(ra["latency_s"].get(q), rb["latency_s"].get(q))
                         for q in ("p50", "p99", "max")}
            for a, ra in engines.items() for b, rb in engines.items() if a != b}


def stage_lines(stages: list[Mapping[str, Any]]) -> list[str]:
    """With several stages, a line per stage: its latency, what it added and its low watermark's lag."""
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
