"""Injector watermark estimates side by side: watermark lag against late records.

Runs the workload's window count once per estimate (``bound``: max seen minus 10 s; ``exact``: oldest
pending event time; ``p=<share>``: that percentile) into ``watermarks.json`` (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .engine_deltawheel import pipeline_runner, window_count
from .workload import WorkloadData, ensure_workload

__all__ = ["ESTIMATES", "run_watermarks", "format_table", "run_from_args"]

ESTIMATES: tuple[tuple[str, float | None], ...] = (("bound", None), ("exact", 0.0), ("p=0.1%", 0.001),
                                                     ("p=1%", 0.01))
BOUND_MS = 10_000


def _file_max_ms(path: Path) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    col = pq.read_table(path, columns=["event_time"]).column(0)
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("ms", tz=col.type.tz)), pa.int64())
    return int(pc.max(col).as_py())


def _run_one(spark: Any, data: WorkloadData, percentile: float | None, out_dir: Path) -> dict[str, Any]:
    with pipeline_runner(spark, data, window_count(), out_dir, pipeline="wmbench", watermark_percentile=percentile,
                         progress=lambda _s: None) as (layout, runner):
        t0 = time.monotonic()
        summary = runner.run()
        wall = time.monotonic() - t0
        rows = spark.read.format("delta").load(layout.stream("windows")).count()
    reports = [r for r in summary.reports["window_count"] if r.records_in]
    # the files in the order the query read them (modification time, then name: one per batch)
    files = sorted(data.files, key=lambda p: (p.stat().st_mtime_ns, p.name))
    lags: list[int] = []
    newest: int | None = None
    for i, r in enumerate(reports):
        if newest is not None and r.input_watermark_ms is not None:
            lags.append(max(0, newest - r.input_watermark_ms))
        if i < len(files):
            m = _file_max_ms(files[i])
            newest = m if newest is None else max(newest, m)
    late = sum(r.late + r.late_routed for r in reports)
    return {"batches": len(reports), "late": late, "late_share": late / data.n, "rows": rows,
            "lag_mean_s": round(sum(lags) / len(lags) / 1000, 3) if lags else None,
            "lag_max_s": round(max(lags) / 1000, 3) if lags else None, "wall_s": round(wall, 2)}


def run_watermarks(size: str, *, out_dir: Path, data_root: Path | None = None,
                   estimates: Sequence[tuple[str, float | None]] = ESTIMATES,
                   progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run every estimate on the workload; returns (and writes ``watermarks.json``) the figures."""
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    say = progress or (lambda _s: None)
    data = ensure_workload(size, root=data_root)
    say(f"workload {size}: N={data.n:,} in {len(data.files)} files")
    spark = build_spark(SparkSettings(app_name="deltawheel-watermarks", log_level="ERROR"))
    results: dict[str, Any] = {}
    for i, (name, percentile) in enumerate(estimates):
        say(f"estimate {name} ({i + 1} of {len(estimates)}): running")
        got = _run_one(spark, data, percentile, out_dir / "runs" / name)
        r = results[name] = {"percentile": percentile, **got}
        say(f"estimate {name}: lag mean {r['lag_mean_s']} s, max {r['lag_max_s']} s; late {r['late']:,} "
            f"({100 * r['late_share']:.3f} %); {r['rows']:,} rows; {r['wall_s']} s")
    report = {"size": size, "n": data.n, "bound_ms": BOUND_MS, "estimates": results}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "watermarks.json").write_text(json.dumps(report, indent=1))
    say(format_table(report))
    return report


def format_table(report: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    rows = [f"| {name} | {r['lag_mean_s']} / {r['lag_max_s']} | {r['late']:,} | "
            f"{100 * r['late_share']:.3f} % | {r['rows']:,} |" for name, r in report["estimates"].items()]
    head = "| estimate | watermark lag mean / max (s) | late records | late share | rows emitted |"
    return "\n".join([head, "|---|---|---|---|---|", *rows])


def run_from_args(args: argparse.Namespace) -> int:
    """``deltawheel bench watermarks``."""
    from deltawheel.statestore.exceptions import ConfigError

    try:
        shares = [float(x) for x in args.percentiles.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--percentiles takes comma-separated numbers in (0, 1), got {args.percentiles!r}") from exc
    estimates = [("bound", None), ("exact", 0.0)] + [(f"p={100 * p:g}%", p) for p in shares]
    run_watermarks(args.size, out_dir=args.out, data_root=args.data_root, estimates=estimates)
    return 0
