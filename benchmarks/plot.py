"""The benchmarks' figures from their JSON reports (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

__all__ = ["figure", "plot_throughput", "plot_latency", "scheduled_points", "plot_cache", "plot_commits"]

COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]
STAGE_STYLES = ["--", "-."]


@contextmanager
def figure(path: Path, *, dpi: int = 120, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``plt.subplots(**subplots)``'s (figure, axes); on leaving, laid out, saved to ``path`` and closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def plot_throughput(report: Mapping[str, Any], path: Path, *, log_scale: bool | None = None) -> Path:
    """Records/s per engine, with ratios to the slowest; log scale beyond 20x, wrong ones hatched."""
    engines = report["engines"]
    names = list(engines)
    rates = [float(engines[n]["records_per_s"]) for n in names]
    with figure(path, figsize=(max(5.0, 1.6 * len(names) + 2), 4.5)) as (_fig, ax):
        if names:
            _throughput_bars(ax, report, names, rates, log_scale)
        else:
            ax.text(0.5, 0.5, "no engine ran", ha="center", va="center", transform=ax.transAxes)
    return Path(path)


def _throughput_bars(ax: Any, report: Mapping[str, Any], names: list[str], rates: list[float],
                     log_scale: bool | None) -> None:
    engines = report["engines"]
    slowest = min(r for r in rates if r > 0) if any(r > 0 for r in rates) else 1.0
    if log_scale is None:
        log_scale = max(rates) / slowest > 20
    bars = ax.bar(names, rates, color=[COLORS[i % len(COLORS)] for i in range(len(names))])
    for bar, n, r in zip(bars, names, rates, strict=True):
        ok = engines[n].get("correct", False)
        if not ok:
            bar.set_hatch("//")
        label = f"{r:,.0f}/s\n×{r / slowest:.1f}" + ("" if ok else "\nWRONG")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, r), ha="center", va="bottom",
                    fontsize=9, xytext=(0, 2), textcoords="offset points")
    if log_scale:
        ax.set_yscale("log")
    ax.set_ylim(top=max(rates) * (6 if log_scale else 1.25))
    ax.set_ylabel("records / s" + (" (log)" if log_scale else ""))
    machine = report.get("machine", {})
    ax.set_title(f"zeitgeist-window-count, size {report.get('size')} (N={report.get('n'):,}), "
                 f"{machine.get('logical_cores', '?')} cores", fontsize=10)
    ax.text(0.99, 0.98, "× = ratio to the slowest engine", ha="right", va="top", fontsize=8,
            transform=ax.transAxes, color="gray")


def scheduled_points(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The over-time points of records the schedule generated (``t`` >= 0: not the primer)."""
    return [p for p in points if float(p["t"]) >= 0]


def plot_latency(report: Mapping[str, Any], path: Path) -> Path:
    """Each engine's steady-state latency CDF (earlier stages dashed) and per second its median and max."""
    with figure(path, nrows=1, ncols=2, figsize=(12, 4.8)) as (fig, (cdf, over)):
        st = report.get("settings", {})
        for i, (name, e) in enumerate(report["engines"].items()):
            color = COLORS[i % len(COLORS)]
            lat = e["latency_s"]
            label = f"{name}: p50 {lat['p50']} s, p99 {lat['p99']} s" if lat["n"] else f"{name}: no output"
            if not e["ok"]:
                label += " (FAILED)"
            if q := e["stages"][-1].get("quantiles_s") or []:
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
                cdf.plot([], [], color=color, label=f"  stage {e['stages'][-1]['stage']} (end to end, solid): "
                                                    f"added p50 {added.get('p50')} / p99 {added.get('p99')} s")
            if pts := scheduled_points(e["stages"][-1].get("over_time") or []):
                cdf_t = [p["t"] for p in pts]
                over.plot(cdf_t, [p["p50"] for p in pts], color=color, label=name)
                over.plot(cdf_t, [p["max"] for p in pts], color=color, linestyle=":", linewidth=1)
        cdf.set(xscale="log", xlabel="latency, arrival to visible Delta commit (s, log)",
                ylabel="share of steady-state records")
        cdf.grid(True, which="both", alpha=0.3)
        cdf.legend(fontsize=8, loc="lower right")
        over.set(yscale="log", xlabel="arrival, s after the schedule's start",
                 ylabel="latency (s, log): median — / max ···")
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
    return Path(path)


def plot_cache(report: Mapping[str, Any], path: Path) -> None:
    """Hit rate per policy against the capacity (the report of :func:`.cachebench.run_cache_bench`)."""
    with figure(path, figsize=(6.5, 4.2)) as (_fig, ax):
        shares = [100 * r["capacity_share"] for r in report["runs"]]
        for policy, style in (("lru", "o-"), ("window", "s-"), ("opt", "^--")):
            ax.plot(shares, [r[policy]["hit_rate"] for r in report["runs"]], style, label=policy)
        ax.set(xlabel="capacity (% of the keys the trace touches)", ylabel="hit rate (row reads from memory)",
               title=f"row cache on the {report['size']} window-count trace ({report['lookups']:,} reads)")
        ax.grid(alpha=0.3)
        ax.legend()


def plot_commits(result: Mapping[str, Any], path: Path) -> None:
    """commits/s and commit p99 against N, one line per store, latency and shape."""
    series: dict[str, list[dict[str, Any]]] = {}
    for p in result["points"]:
        lat = "" if p["target"] == "local" else f" +{p['latency_ms']} ms"
        series.setdefault(f"{p['target']}{lat} {p['shape']}", []).append(p)
    with figure(path, dpi=90, nrows=1, ncols=2, figsize=(12, 4.5)) as (fig, (ax1, ax2)):
        for label, pts in sorted(series.items()):
            pts = sorted(pts, key=lambda p: p["writers"])
            xs = [p["writers"] for p in pts]
            style = "-" if "computations" in label else "--"
            ax1.plot(xs, [p["commits_per_s_store"] for p in pts], style, marker="o", label=label)
            ax2.plot(xs, [p["commit_p99_ms"] or 0 for p in pts], style, marker="o", label=label)
        for ax, title in ((ax1, "commits/s of the store (its rows tables together)"), (ax2, "commit p99 (ms)")):
            ax.set_xscale("log", base=2)
            ax.set(xlabel="writers N", title=title)
            ax.grid(True, alpha=0.3)
        ax2.set_yscale("log")
        ax1.legend(fontsize=7)
        fig.suptitle(f"deltawheel bench commits ({result['cpus']} cores, {result['seconds']:g} s per point, "
                     f"ZooKeeper: {result['zookeeper']})")
