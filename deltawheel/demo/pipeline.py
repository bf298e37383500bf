"""The demo pipeline: MillWheel's Zeitgeist on generated search queries, deterministic for (events, seed)::

    queries (generator injector)
      └─ window_counter   counts per query in fixed 10 s event-time windows -> window_counts
          └─ model         per-query moving average: actual vs expected -> predictions
              └─ detector  spikes (actual >> expected) and dips (actual << expected) -> anomalies
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar, cast

from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.windowing.windowed import windowed
from deltawheel.executor.windowing.windows import FixedWindows

__all__ = ["WINDOW_MS", "window_counter", "Model", "Detector", "computations"]

WINDOW_MS = 10_000
HISTORY = 12
SPIKE_RATIO = 3.0
DIP_RATIO = 0.25
MIN_EXPECTED = 4.0


def window_counter(window_ms: int = WINDOW_MS, *, dedup_retention: timedelta = Computation.dedup_retention) -> Computation:
    """The first stage: counts of each query per 10 s window (``window_ms``), refined by late data for 30 s."""
    return windowed(name="window_counter", inputs={"queries": "query"}, output="window_counts",
                    windowing=FixedWindows(window_ms), allowed_lateness_ms=30_000, combine="count",
                    dedup_retention=dedup_retention)


class Model(Computation):
    """Per-query history of window counts; predicts each window from the moving average."""

    name = "model"
    inputs = {"window_counts": RECORD_KEY}
    outputs = ("predictions",)
    num_intervals = 4
    window_ms = WINDOW_MS  # the first stage's window length (an instance attribute when not the default)

    def process_record(self, ctx: Any, record: Any) -> None:
        """For each window since the last one seen (one without a pane counts 0): predict, then learn;
        late panes and retractions are ignored."""
        pane = record.value
        if pane.get("retraction") or pane.get("timing") == "LATE":
            return  # late refinements do not re-train the model
        start, count = int(pane["window_start"]), int(pane["value"])
        st = ctx.state or {"hist": [], "avg": None, "last": None}
        last = st["last"]
        if last is not None and start <= last:
            return
        gap = [] if last is None else list(range(last + self.window_ms, start, self.window_ms))
        for s in gap + [start]:
            actual = count if s == start else 0
            if st["avg"] is not None and len(st["hist"]) >= 3:
                ctx.produce("predictions", {"query": ctx.key, "window_start": s, "actual": actual,
                                            "expected": round(st["avg"], 3)}, timestamp_ms=s + self.window_ms)
            st["avg"] = actual if st["avg"] is None else 0.7 * st["avg"] + 0.3 * actual
            st["hist"] = (st["hist"] + [[s, actual]])[-HISTORY:]
        st["last"] = start
        ctx.state = st


class Detector(Computation):
    """Flags spikes and dips; one anomaly per episode (state remembers the open one)."""

    name = "detector"
    inputs = {"predictions": RECORD_KEY}
    outputs = ("anomalies",)
    num_intervals = 4

    def process_record(self, ctx: Any, record: Any) -> None:
        """Produce an anomaly when a prediction opens a spike or dip episode."""
        p = record.value
        actual, expected = p["actual"], p["expected"]
        kind = None
        if expected >= MIN_EXPECTED and actual >= SPIKE_RATIO * expected:
            kind = "spike"
        elif expected >= MIN_EXPECTED and actual <= DIP_RATIO * expected:
            kind = "dip"
        st = ctx.state or {"open": None, "episodes": 0}
        if kind is not None and kind != st["open"]:
            st["episodes"] += 1
            ctx.produce("anomalies", {"query": ctx.key, "window_start": p["window_start"], "kind": kind,
                                      "actual": actual, "expected": expected})
        st["open"] = kind
        ctx.state = st


def computations(*, window_ms: int = WINDOW_MS, dedup_retention: timedelta | None = None) -> tuple[Computation, ...]:
    """The window counter, model and detector; ``dedup_retention`` (None: the default) is set on a
    subclass of each one's class.

    Raises:
        ConfigError: a ``dedup_retention`` that is not a positive timedelta."""
    if dedup_retention is None:
        counter, model, detector = window_counter(window_ms), Model(), Detector()
    else:
        counter = window_counter(window_ms, dedup_retention=dedup_retention)
        model, detector = _retained(Model, dedup_retention)(), _retained(Detector, dedup_retention)()
    if window_ms != WINDOW_MS:
        model.window_ms = window_ms
    return (counter, model, detector)


_C = TypeVar("_C", bound=Computation)


def _retained(cls: type[_C], dedup_retention: timedelta) -> type[_C]:
    """A subclass of ``cls`` whose ``dedup_retention`` is the one given (checked by ``validate``)."""
    sub = cast("type[_C]", type(cls.__name__, (cls,), {"dedup_retention": dedup_retention,
                                                        "__module__": cls.__module__, "__doc__": cls.__doc__}))
    sub.validate()
    return sub
