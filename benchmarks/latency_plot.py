"""The latency benchmark's figure: latency distribution per engine and latency over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["plot_latency", "scheduled_points"]

COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]
STAGE_STYLES = ["--", "-."]


def scheduled_points(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The over-time points of records the schedule generated (``t`` >= 0: not the primer)."""
    return [p for p in points if float(p["t"]) >= 0]


def plot_latency(report: Mapping[str, Any], path: Path) -> Path:
    """Two panels: each engine's steady-state latency CDF (log scale; earlier stages dashed), and per
    second of arrival the median and maximum latency. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (cdf, over) = plt.subplots(1, 2, figsize=(12, 4.8))
    st = report.get("settings", {})
    for i, (name, e) in enumerate(report["engines"].items()):
        color = COLORS[i % len(COLORS)]
        lat = e["latency_s"]
        label = f"{name}: p50 {lat['p50']} s, p99 {lat['p99']} s" if lat["n"] else f"{name}: no output"
        if not e["ok"]:
            label += " (FAILED)"
        q = e["stages"][-1].get("quantiles_s") or []
        if q:
            cdf.plot(q, [i / 100 for i in range(len(q))], color=color, label=label)
        for stage in e["stages"][:-1]:  # several stages: each earlier stage's output, dashed thinner
            sq, added = stage.get("quantiles_s") or [], stage.get("added_latency_s") or {}
            if sq:
                cdf.plot(sq, [i / 100 for i in range(len(sq))], color=color, linewidth=0.8,
                         linestyle=STAGE_STYLES[(stage["stage"] - 1) % len(STAGE_STYLES)],
                         label=f"  stage {stage['stage']}: p50 {stage['latency_s']['p50']} s, added p50 "
                               f"{added.get('p50')} / p99 {added.get('p99')} s")
        if len(e["stages"]) > 1:
            added = e["stages"][-1].get("added_latency_s") or {}
            cdf.plot([], [], color=color, label=f"  stage {e['stages'][-1]['stage']} (end to end, solid): added "
                                                f"p50 {added.get('p50')} / p99 {added.get('p99')} s")
        pts = scheduled_points(e["stages"][-1].get("over_time") or [])
        if pts:
            cdf_t = [p["t"] for p in pts]
            over.plot(cdf_t, [p["p50"] for p in pts], color=color, label=name)
            over.plot(cdf_t, [p["max"] for p in pts], color=color, linestyle=":", linewidth=1)
    cdf.set_xscale("log")
    cdf.set_xlabel("latency, arrival to visible Delta commit (s, log)")
    cdf.set_ylabel("share of steady-state records")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize=8, loc="lower right")
    over.set_yscale("log")
    over.set_xlabel("arrival, s after the schedule's start")
    over.set_ylabel("latency (s, log): median — / max ···")
    over.axvline(float(st.get("warmup_s", 0)), color="gray", linewidth=0.8)
    over.text(float(st.get("warmup_s", 0)), 0.02, " warm-up ends", transform=over.get_xaxis_transform(),
              fontsize=8, color="gray", va="bottom")
    over.grid(True, which="both", alpha=0.3)
    over.legend(fontsize=8, loc="upper left")
    m = report.get("machine", {})
    fig.suptitle(f"latency at {float(st.get('rate', 0)):,.0f} records/s, {int(st.get('keys', 0)):,} keys, "
                 f"{st.get('stages', 1)} stage(s), {float(st.get('seconds', 0)):g} s of input; "
                 f"{m.get('logical_cores', '?')} cores, load {m.get('loadavg_1m_at_start', '?')} at start "
                 f"({report.get('date', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
