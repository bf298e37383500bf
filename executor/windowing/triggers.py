"""When in processing time: trigger state machines (Beam Java SDK semantics, docs/windowing.md). A
trigger is an immutable tree; its state is a list of small dicts, one per node in pre-order, with the
optional keys ``f`` finished (1), ``n`` element count, ``t`` processing-time target (ms) and ``o`` the
watermark trigger's on-time firing done (1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .windows import WindowingError

__all__ = ["TriggerContext", "Trigger", "AfterWatermark", "AfterCount", "AfterProcessingTime", "Repeatedly",
           "AfterAny", "AfterAll", "AfterEach", "OrFinally", "Always", "Never", "DefaultTrigger", "default_trigger",
           "trigger_from_spec"]

NodeState = dict[str, Any]


@dataclass
class TriggerContext:
    """The clocks and the per-node states (pre-order, mutated in place) of one window's trigger."""

    states: list[NodeState]
    watermark_ms: int | None
    now_ms: int
    end_ms: int
    merging: list[list[NodeState]] = field(default_factory=list)

    @property
    def end_of_window_reached(self) -> bool:
        """The watermark has reached the window's end (``watermark >= end``)."""
        return self.watermark_ms is not None and self.watermark_ms >= self.end_ms


class Trigger:
    """Base of trigger tree nodes. Subclasses are frozen dataclasses."""

    def children(self) -> tuple["Trigger", ...]:
        """The subtriggers, in state order (none for a leaf)."""
        return ()

    def size(self) -> int:
        """Number of nodes in this subtree."""
        return 1 + sum(c.size() for c in self.children())

    def initial_state(self) -> list[NodeState]:
        """Fresh per-node state for a new window."""
        return [{} for _ in range(self.size())]
    # --- state machine; ``i`` is this node's index in ``tc.states`` ---------

    def is_finished(self, tc: TriggerContext, i: int) -> bool:
        """Node ``i`` has finished: it fires no more (until cleared)."""
        return bool(tc.states[i].get("f"))

    def on_element(self, tc: TriggerContext, i: int) -> None:
        """An element arrived in the pane: update node ``i`` (default: pass it to the unfinished children)."""
        for c, j in self._kids(i):
            if not c.is_finished(tc, j):
                c.on_element(tc, j)

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """Whether node ``i`` fires now; reads the state, never changes it."""
        raise NotImplementedError

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Node ``i`` fired: update its state (count reset, finished, ...)."""
        raise NotImplementedError

    def clear(self, tc: TriggerContext, i: int) -> None:
        """Reset this subtree (used by Repeatedly and when early firings end)."""
        for j in range(i, i + self.size()):
            tc.states[j] = {}

    def fire_repeating(self, tc: TriggerContext, i: int) -> None:
        """Fire node ``i``, and clear its subtree if that finished it."""
        self.on_fire(tc, i)
        if self.is_finished(tc, i):
            self.clear(tc, i)

    def on_merge(self, tc: TriggerContext, i: int) -> None:
        """Set node ``i`` from the same node of the merged windows (``tc.merging``)."""
        if any(s[i].get("f") for s in tc.merging):
            tc.states[i]["f"] = 1
        for c, j in self._kids(i):
            c.on_merge(tc, j)

    def _kids(self, i: int) -> list[tuple["Trigger", int]]:
        """The children of node ``i`` with their state indices (their subtrees follow ``i`` in pre-order)."""
        out, j = [], i + 1
        for c in self.children():
            out.append((c, j))
            j += c.size()
        return out


@dataclass(frozen=True)
class Never(Trigger):
    """Never fires; the window's pane comes only when it expires."""

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """Never."""
        return False

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Nothing to do: it never fires."""


class _Counting(Trigger):
    """A trigger counting its pane's elements (``n``); merged windows' counts add up."""

    def on_element(self, tc: TriggerContext, i: int) -> None:
        tc.states[i]["n"] = tc.states[i].get("n", 0) + 1

    def on_merge(self, tc: TriggerContext, i: int) -> None:
        super().on_merge(tc, i)
        n = sum(s[i].get("n", 0) for s in tc.merging)
        if n and not tc.states[i].get("f"):
            tc.states[i]["n"] = n


@dataclass(frozen=True)
class Always(_Counting):
    """Fires after every element."""

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """An element arrived since the last firing."""
        return bool(tc.states[i].get("n", 0))

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Reset the count."""
        tc.states[i].pop("n", None)


@dataclass(frozen=True)
class AfterCount(_Counting):
    """Fires once ``count`` elements are in the pane; then finishes."""

    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise WindowingError(f"after_count needs count >= 1, got {self.count}")

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """``count`` elements are in the pane."""
        return int(tc.states[i].get("n", 0)) >= self.count

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Finish."""
        tc.states[i] = {"f": 1}


@dataclass(frozen=True)
class AfterProcessingTime(Trigger):
    """Fires ``delay_ms`` of processing time after the first element of the pane; then finishes."""

    delay_ms: int

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise WindowingError(f"after_processing_time needs delay >= 0, got {self.delay_ms} ms")

    def on_element(self, tc: TriggerContext, i: int) -> None:
        """Set the target (processing time now + ``delay_ms``) at the pane's first element."""
        tc.states[i].setdefault("t", tc.now_ms + self.delay_ms)

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """Processing time has reached the target."""
        t = tc.states[i].get("t")
        return t is not None and tc.now_ms >= int(t)

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Finish."""
        tc.states[i] = {"f": 1}

    def on_merge(self, tc: TriggerContext, i: int) -> None:
        """Finished if any merged window's was; else the earliest of their targets."""
        super().on_merge(tc, i)
        ts = [int(s[i]["t"]) for s in tc.merging if s[i].get("t") is not None]
        if ts and not tc.states[i].get("f"):
            tc.states[i]["t"] = min(ts)


@dataclass(frozen=True)
class Repeatedly(Trigger):
    """Fires whenever ``trigger`` fires, resetting it each time it finishes; never finishes."""

    trigger: Trigger

    def children(self) -> tuple[Trigger, ...]:
        """``(trigger,)``."""
        return (self.trigger,)

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """``trigger`` can fire."""
        return self.trigger.should_fire(tc, i + 1)

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Fire ``trigger``, and clear it if that finished it."""
        self.trigger.fire_repeating(tc, i + 1)


@dataclass(frozen=True)
class _Composite(Trigger):
    triggers: tuple[Trigger, ...]

    def children(self) -> tuple[Trigger, ...]:
        return self.triggers


@dataclass(frozen=True)
class AfterAny(_Composite):
    """Fires once, when any subtrigger can fire."""

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """An unfinished subtrigger can fire."""
        return any(c.should_fire(tc, j) for c, j in self._kids(i) if not c.is_finished(tc, j))

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Fire the unfinished subtriggers that can, then finish."""
        for c, j in self._kids(i):
            if not c.is_finished(tc, j) and c.should_fire(tc, j):
                c.on_fire(tc, j)
        tc.states[i]["f"] = 1


@dataclass(frozen=True)
class AfterAll(_Composite):
    """Fires once, when every unfinished subtrigger can fire."""

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """There are unfinished subtriggers and all of them can fire."""
        live = [(c, j) for c, j in self._kids(i) if not c.is_finished(tc, j)]
        return bool(live) and all(c.should_fire(tc, j) for c, j in live)

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Fire every unfinished subtrigger, then finish."""
        for c, j in self._kids(i):
            if not c.is_finished(tc, j):
                c.on_fire(tc, j)
        tc.states[i]["f"] = 1


@dataclass(frozen=True)
class AfterEach(_Composite):
    """Runs its subtriggers in sequence: fires when the current one fires; finished after the last."""

    def _current(self, tc: TriggerContext, i: int) -> tuple[Trigger, int] | None:
        return next(((c, j) for c, j in self._kids(i) if not c.is_finished(tc, j)), None)

    def on_element(self, tc: TriggerContext, i: int) -> None:
        """Pass the element to the current (first unfinished) subtrigger."""
        cur = self._current(tc, i)
        if cur is not None:
            cur[0].on_element(tc, cur[1])

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """The current subtrigger can fire."""
        cur = self._current(tc, i)
        return cur is not None and cur[0].should_fire(tc, cur[1])

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Fire the current subtrigger; finish once none is left unfinished."""
        cur = self._current(tc, i)
        if cur is not None:
            cur[0].on_fire(tc, cur[1])
        if self._current(tc, i) is None:
            tc.states[i]["f"] = 1


@dataclass(frozen=True)
class OrFinally(Trigger):
    """Fires when ``trigger`` fires; when ``until`` can fire, fires and finishes for good."""

    trigger: Trigger
    until: Trigger

    def children(self) -> tuple[Trigger, ...]:
        """``(trigger, until)``."""
        return (self.trigger, self.until)

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """``trigger`` (unfinished) or ``until`` can fire."""
        (a, ja), (u, ju) = self._kids(i)
        return (not a.is_finished(tc, ja) and a.should_fire(tc, ja)) or u.should_fire(tc, ju)

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Fire ``until`` and finish if it can; else fire ``trigger``, finishing when it finishes."""
        (a, ja), (u, ju) = self._kids(i)
        if u.should_fire(tc, ju):
            u.on_fire(tc, ju)
            tc.states[i]["f"] = 1
            return
        a.on_fire(tc, ja)
        if a.is_finished(tc, ja):
            tc.states[i]["f"] = 1


@dataclass(frozen=True)
class AfterWatermark(Trigger):
    """Fires ON_TIME when the watermark reaches the window end, with optional repeating early/late firings."""

    early: Trigger | None = None
    late: Trigger | None = None

    def children(self) -> tuple[Trigger, ...]:
        """``early`` and ``late``, those present."""
        return tuple(t for t in (self.early, self.late) if t is not None)

    def _sub(self, i: int, which: str) -> tuple[Trigger, int] | None:
        present = [name for name in ("early", "late") if getattr(self, name) is not None]
        return dict(zip(present, self._kids(i), strict=True)).get(which)

    def _phase(self, tc: TriggerContext, i: int) -> tuple[Trigger, int] | None:
        """``early`` before the on-time firing, ``late`` after it (None: absent)."""
        return self._sub(i, "late" if tc.states[i].get("o") else "early")

    def on_element(self, tc: TriggerContext, i: int) -> None:
        """Pass the element to the current phase's subtrigger."""
        sub = self._phase(tc, i)
        if sub is not None:
            sub[0].on_element(tc, sub[1])

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """Before the on-time firing: the end is reached or ``early`` can fire; after it, ``late`` can."""
        if not tc.states[i].get("o") and tc.end_of_window_reached:
            return True
        sub = self._phase(tc, i)
        return sub is not None and sub[0].should_fire(tc, sub[1])

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """The on-time firing (finishes without ``late``), or a repeating early / late firing."""
        node, sub = tc.states[i], self._phase(tc, i)
        if not node.get("o") and tc.end_of_window_reached:  # the on-time firing ends the early phase
            if sub is not None:
                sub[0].clear(tc, sub[1])
            node["o"] = 1
            if self.late is None:
                node["f"] = 1
        elif sub is not None:
            sub[0].fire_repeating(tc, sub[1])

    def on_merge(self, tc: TriggerContext, i: int) -> None:
        """Past the on-time firing if every merged window was and the end is reached; else early."""
        early, late = self._sub(i, "early"), self._sub(i, "late")
        if all(s[i].get("o") for s in tc.merging) and tc.end_of_window_reached:
            tc.states[i]["o"] = 1
            if late is not None:
                late[0].on_merge(tc, late[1])
            if self.late is None:
                tc.states[i]["f"] = 1
            return
        if early is not None:
            early[0].on_merge(tc, early[1])
            if early[0].is_finished(tc, early[1]):
                early[0].clear(tc, early[1])


@dataclass(frozen=True)
class DefaultTrigger(Trigger):
    """Beam's default trigger: fires whenever the watermark is at or past the window end; never finishes."""

    def should_fire(self, tc: TriggerContext, i: int) -> bool:
        """The watermark has reached the window end."""
        return tc.end_of_window_reached

    def on_fire(self, tc: TriggerContext, i: int) -> None:
        """Nothing to do: it keeps no state and never finishes."""


def default_trigger() -> Trigger:
    """Beam's default trigger, ``Repeatedly.forever(AfterWatermark.pastEndOfWindow())``."""
    return DefaultTrigger()


_LEAF_TRIGGERS: dict[str, Callable[[], Trigger]] = {"default": default_trigger, "always": Always, "never": Never}
_COMPOSITE_TRIGGERS: dict[str, Callable[[tuple[Trigger, ...]], Trigger]] = {
    "after_any": AfterAny, "after_all": AfterAll, "after_each": AfterEach}


def trigger_from_spec(spec: Mapping[str, Any], *, unit_ms: int = 1000) -> Trigger:
    """A trigger tree from its scenario description (delays in ``unit_ms``); else WindowingError."""
    if not isinstance(spec, Mapping):
        raise WindowingError(f"a trigger must be an object with a 'type', got {spec!r}")
    kind = spec.get("type")

    def sub(name: str) -> Trigger:
        if name not in spec:
            raise WindowingError(f"trigger {kind!r} needs {name!r}")
        return trigger_from_spec(spec[name], unit_ms=unit_ms)

    def subs() -> tuple[Trigger, ...]:
        items = spec.get("triggers")
        if not isinstance(items, Sequence) or not items:
            raise WindowingError(f"trigger {kind!r} needs a non-empty list 'triggers'")
        return tuple(trigger_from_spec(t, unit_ms=unit_ms) for t in items)

    if kind in _LEAF_TRIGGERS:
        return _LEAF_TRIGGERS[kind]()
    if kind in _COMPOSITE_TRIGGERS:
        return _COMPOSITE_TRIGGERS[kind](subs())
    if kind == "after_watermark":
        return AfterWatermark(early=sub("early") if "early" in spec else None,
                              late=sub("late") if "late" in spec else None)
    if kind == "after_count":
        return AfterCount(int(spec.get("count", 0)))
    if kind == "after_processing_time":
        if not isinstance(spec.get("delay"), (int, float)):
            raise WindowingError("trigger 'after_processing_time' needs a number 'delay'")
        return AfterProcessingTime(round(spec["delay"] * unit_ms))
    if kind == "repeatedly":
        return Repeatedly(sub("trigger"))
    if kind == "or_finally":
        return OrFinally(sub("trigger"), sub("finally"))
    raise WindowingError(f"unknown trigger type {kind!r}")
