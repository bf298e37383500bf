"""Charts for the benchmark JSON files (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

__all__ = ["plot_throughput"]


def plot_throughput(report: Mapping[str, Any], path: Path, *, log_scale: bool | None = None) -> Path:
    """Bar chart of records/s per engine (the report of :func:`.throughput.run_throughput`), each bar
    annotated with its ratio to the slowest; log scale beyond 20x, incorrect engines hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = report["engines"]
    names = list(engines)
    rates = [float(engines[n]["records_per_s"]) for n in names]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(names) + 2), 4.5))
    if not names:
        ax.text(0.5, 0.5, "no engine ran", ha="center", va="center", transform=ax.transAxes)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path
    slowest = min(r for r in rates if r > 0) if any(r > 0 for r in rates) else 1.0
    if log_scale is None:
        log_scale = max(rates) / slowest > 20
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]
    bars = ax.bar(names, rates, color=[colors[i % len(colors)] for i in range(len(names))])
    for bar, n, r in zip(bars, names, rates, strict=True):
        ok = engines[n].get("correct", False)
        if not ok:
            bar.set_hatch("//")
        label = f"{r:,.0f}/s\n×{r / slowest:.1f}" + ("" if ok else "\nWRONG")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, r), ha="center", va="bottom",
                    fontsize=9, xytext=(0, 2), textcoords="offset points")
    if log_scale:
        ax.set_yscale("log")
        ax.set_ylim(top=max(rates) * 6)
    else:
        ax.set_ylim(top=max(rates) * 1.25)
    ax.set_ylabel("records / s" + (" (log)" if log_scale else ""))
    machine = report.get("machine", {})
    ax.set_title(f"zeitgeist-window-count, size {report.get('size')} (N={report.get('n'):,}), "
                 f"{machine.get('logical_cores', '?')} cores", fontsize=10)
    ax.text(0.99, 0.98, "× = ratio to the slowest engine", ha="right", va="top", fontsize=8,
            transform=ax.transAxes, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
