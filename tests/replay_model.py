"""The demo's ``model`` with another moving average: the mean of the last ``WINDOW`` windows instead
of the exponential average (what a user's fix looks like); replayed by tests/test_replay.py."""

from __future__ import annotations

from typing import Any

from deltawheel.demo.pipeline import HISTORY, WINDOW_MS, Model

WINDOW = 3


class WindowModel(Model):
    """Predicts each window as the mean of the ``WINDOW`` windows before it; state as the demo's."""

    def process_record(self, ctx: Any, record: Any) -> None:
        """As :meth:`Model.process_record`, with the expected value from the last windows' mean."""
        pane = record.value
        if pane.get("retraction") or pane.get("timing") == "LATE":
            return
        start, count = int(pane["window_start"]), int(pane["value"])
        st = ctx.state or {"hist": [], "avg": None, "last": None}
        last = st["last"]
        if last is not None and start <= last:
            return
        gap = [] if last is None else list(range(last + WINDOW_MS, start, WINDOW_MS))
        for s in gap + [start]:
            actual = count if s == start else 0
            if st["avg"] is not None and len(st["hist"]) >= 3:
                recent = [a for _, a in st["hist"][-WINDOW:]]
                ctx.produce("predictions", {"query": ctx.key, "window_start": s, "actual": actual,
                                            "expected": round(sum(recent) / len(recent), 3)}, timestamp_ms=s + WINDOW_MS)
            st["avg"] = actual if st["avg"] is None else 0.7 * st["avg"] + 0.3 * actual
            st["hist"] = (st["hist"] + [[s, actual]])[-HISTORY:]
        st["last"] = start
        ctx.state = st


class TaggedModel(Model):
    """The demo's model whose state also says which code wrote it (a state change a promotion shows)."""

    def process_record(self, ctx: Any, record: Any) -> None:
        """As :meth:`Model.process_record`, then tags the key's state."""
        super().process_record(ctx, record)
        if ctx.state is not None:
            ctx.state = {**ctx.state, "tag": "fixed"}
