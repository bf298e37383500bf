"""One self-contained HTML page of a store's status and plots (``deltawheel report``): matplotlib PNGs
embedded as ``data:`` URIs, so the page fetches nothing and runs no script."""

from __future__ import annotations

import base64
import html
import io
import os
import time
from datetime import UTC, datetime
from typing import Any, Callable

from deltawheel.executor.drivers.status import StoreStatus
from deltawheel.executor.protocol.reports import watermark_known
from deltawheel.statestore.zk.watermarks import END_OF_TIME

from .statustext import render

__all__ = ["build_html", "write_report", "PLOTS"]

PLOTS = ("Watermark lag per stage", "Batch duration per step", "Records per second", "State size per computation",
         "Dead letters over time")


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _times(rows: list[dict[str, Any]]) -> list[datetime]:
    return [_at(r["recorded_ms"]) for r in rows]


def _by_comp(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["computation"], []).append(r)
    return out


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def _series(ax: Any, series: list[tuple[str, str, str, list[tuple[Any, float]]]], ylabel: str, empty: str) -> None:
    """Plot each (label, line style, marker, points) series that has points; ``empty`` when none has."""
    drawn = [s for s in series if s[3]]
    for label, style, marker, pts in drawn:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker, label=label)
    if drawn:
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    else:
        _empty(ax, empty)


def _lag(ax: Any, st: StoreStatus) -> None:
    series = []
    for comp, rows in _by_comp(st.batches).items():
        for col, style in (("low_watermark_ms", "-"), ("input_watermark_ms", ":")):
            pts = [(t, (r["recorded_ms"] - r[col]) / 1000) for t, r in zip(_times(rows), rows, strict=True)
                   if watermark_known(r[col]) and r[col] < END_OF_TIME]
            series.append((f"{comp} {'output' if col.startswith('low') else 'input'}", style, ".", pts))
    _series(ax, series, "seconds behind wall time", "no watermark recorded yet (or every input finished)")


def _steps(ax: Any, st: StoreStatus) -> None:
    rows = st.batches[-40:]
    if not rows:
        _empty(ax, "no batch recorded yet")
        return
    names = sorted({k for r in rows for k in (r["steps_s"] or {})})
    bottom = [0.0] * len(rows)
    x = list(range(len(rows)))
    for name in names:
        vals = [float((r["steps_s"] or {}).get(name, 0.0)) for r in rows]
        ax.bar(x, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(x, [f"{r['computation'][:10]}:{r['batch_id']}" for r in rows], rotation=70, fontsize=6)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, ncol=2)


def _rate(ax: Any, st: StoreStatus) -> None:
    _series(ax, [(comp, "-", "o", [(t, (r["records_in"] or 0) / r["wall_s"])
                                   for t, r in zip(_times(rows), rows, strict=True) if r["wall_s"]])
                 for comp, rows in _by_comp(st.batches).items()], "records in / batch second", "no batch recorded yet")


def _state(ax: Any, st: StoreStatus) -> None:
    if not st.state:
        _empty(ax, "the rows table holds no state")
        return
    comps = sorted(st.state)
    keys = [st.state[c]["keys"] for c in comps]
    bars = ax.bar(comps, keys, color="#4c72b0")
    for b, c in zip(bars, comps, strict=True):
        ax.annotate(f"{st.state[c]['bytes'] / 1024:.0f} KB", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("keys (label: bytes)")
    ax.tick_params(axis="x", labelrotation=20, labelsize=7)


def _dead(ax: Any, st: StoreStatus) -> None:
    dead = [r for r in st.dead_letters if r["recorded_ms"] is not None]
    if not dead:
        _empty(ax, "no dead letters")
        return
    for comp, rows in _by_comp(dead).items():
        ts = sorted(r["recorded_ms"] for r in rows)
        ax.step([_at(t) for t in ts], range(1, len(ts) + 1), where="post", marker="o", label=comp)
    lo, hi = min(r["recorded_ms"] for r in dead), max(r["recorded_ms"] for r in dead)
    if hi - lo < 60_000:  # one moment: a minute either side, not an axis of years
        ax.set_xlim(_at(lo - 60_000), _at(hi + 60_000))
    ax.set_ylim(bottom=0)
    ax.set_ylabel("dead letters (cumulative)")
    ax.legend(fontsize=7)


_OVER_TIME = ("Watermark lag per stage", "Records per second", "Dead letters over time")
_DRAW: dict[str, Callable[[Any, StoreStatus], None]] = dict(zip(PLOTS, (_lag, _steps, _rate, _state, _dead), strict=True))


def build_html(st: StoreStatus) -> str:
    """The page: the status text, then one titled figure per plot of :data:`PLOTS`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    for title in PLOTS:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.set_title(title)
        _DRAW[title](ax, st)
        if title in _OVER_TIME:
            from matplotlib.dates import DateFormatter

            ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]  # not matplotlib's MM:SS.ffffff
            ax.set_xlabel("UTC")
            fig.autofmt_xdate()
        slug = title.lower().replace(" ", "-")
        figures.append(f'<figure id="{slug}"><figcaption>{html.escape(title)}</figcaption>'
                       f'<img alt="{html.escape(title)}" title="{html.escape(title)}" width="720" '
                       f'src="data:image/png;base64,{_png(fig)}"></figure>')
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(st.now_ms / 1000))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>deltawheel report: {html.escape(st.store)}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1000px}}pre{{background:#f4f4f4;padding:.8em;overflow-x:auto;
font-size:12px}}figure{{margin:1.2em 0}}figcaption{{font-weight:bold;margin-bottom:.3em}}</style></head>
<body><h1>deltawheel report</h1><p>store <code>{html.escape(st.store)}</code>, {when} UTC; {len(st.batches)} batches
recorded, {len(st.dead_letters)} dead letters, {len(st.late)} late records.</p>
<h2>Status</h2><pre>{html.escape(render(st, batches=5))}</pre>
<h2>Plots</h2>
{chr(10).join(figures)}
</body></html>
"""


def write_report(st: StoreStatus, out: str) -> str:
    """Write the page for ``st`` to ``out`` (folders made as needed); returns its absolute path."""
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(build_html(st))
    return out

