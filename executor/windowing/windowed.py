"""The Dataflow model on the core API: :class:`WindowedComputation` and :func:`windowed`, an ordinary
``Computation`` whose windows live in the key's state and timers. docs/windowing.md."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, cast

from deltawheel.statestore.codecs import Codec, get_codec
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.rowtable.rows import TimeDomain, Timer

from ..computation import Computation, ErrorPolicy, KeyExtractor, LatePolicy, Record
from ..context import Context
from .combiners import CombineFn, check_encodable, combine_fn_from_spec, negate
from .panes import AccumulationMode, Pane, PaneInfo, Timing
from .settings import SETTINGS, ComputationSettings, refuse_unknown
from .triggers import Trigger, TriggerContext, default_trigger
from .windows import Window, WindowFn, WindowingError

__all__ = ["STATE_VERSION", "WindowingStrategy", "WindowedComputation", "windowed", "dropped_stream"]

STATE_VERSION = 1


@dataclass(frozen=True)
class WindowingStrategy:
    """Where (window fn), when (trigger, allowed lateness), how (accumulation) and what (combine)."""

    window_fn: WindowFn
    trigger: Trigger
    combine: CombineFn
    allowed_lateness_ms: int = 0
    accumulation: AccumulationMode = AccumulationMode.DISCARDING

    def __post_init__(self) -> None:
        if self.allowed_lateness_ms < 0:
            raise WindowingError(f"allowed lateness must be >= 0 ms, got {self.allowed_lateness_ms}")


def dropped_stream(output: str) -> str:
    """The stream that receives the dropped elements of a windowed computation writing ``output``."""
    return f"{output}_dropped"


class WindowedComputation(Computation):
    """Windows, triggers, lateness, accumulation and combining on per-key state; see :func:`windowed`."""

    output: str = "panes"
    event_time_timers = True  # window ends and allowed lateness are event-time timers

    def __init__(self, strategy: WindowingStrategy, *, value: Callable[[Any], Any] | None = None) -> None:
        self.strategy = strategy
        self._value = value
        self._codec: Codec | None = None
        self._encodable: set[tuple[str, type]] = set()  # (combiner method, type) whose values encoded
        self._checked("create", strategy.combine.create())  # a combiner the codec cannot store fails here

    def allowed_lateness_ms(self) -> int:
        """The strategy's allowed lateness (a ``state_ttl`` shorter than it is warned about)."""
        return self.strategy.allowed_lateness_ms

    def __setattr__(self, attr: str, value: Any) -> None:
        """ConfigError for a computation setting set as an instance attribute: give it to :func:`windowed`."""
        if attr in SETTINGS:
            raise ConfigError(
                f"{self.name}: {attr} of a windowed computation is given where it is built, "
                f"windowed(..., {attr}=...); set on the built computation it would reach some parts of "
                "the executor and not others")
        super().__setattr__(attr, value)

    def process_record(self, ctx: Context, record: Record) -> None:
        """Add the record to each window it falls in and evaluate their triggers, or drop it (with why)."""
        st = self._load(ctx)
        s = self.strategy
        wm = ctx.input_watermark_ms
        value = self._value(record.value) if self._value is not None else record.value
        touched: list[str] = []
        for proto in s.window_fn.assign(record.timestamp_ms):
            if wm is not None and wm >= proto.end_ms + s.allowed_lateness_ms:
                self._drop(ctx, record, value, proto, "too_late")
                continue
            closed = self._closed_window(st, proto)
            if closed is not None:
                self._drop(ctx, record, value, closed, "window_closed")
                continue
            wid = self._merge_into(ctx, st, proto) if s.window_fn.merging else proto.wid
            if wid not in st:
                st[wid] = self._new_window(Window.from_wid(wid), wm)
            ws = st[wid]
            ws["a"] = self._checked("add", s.combine.add(ws["a"] if "a" in ws else s.combine.create(), value))
            ws["n"] = ws.get("n", 0) + 1
            s.trigger.on_element(self._tc(ctx, wid, ws), 0)
            if wid not in touched:
                touched.append(wid)
        for wid in touched:
            self._evaluate(ctx, st, wid)
        self._save(ctx, st)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        """A window's event-time or processing-time timer: evaluate its trigger."""
        st = self._load(ctx)
        wid = timer.tag[2:]
        if wid in st:
            self._evaluate(ctx, st, wid)
        self._save(ctx, st)

    def _checked(self, method: str, value: Any) -> Any:
        """``value``, after checking the first value of each type encodes with the codec."""
        kind = (method, type(value))
        if kind not in self._encodable:
            if self._codec is None:
                self._codec = get_codec(self.codec, allow_pickle=self.allow_pickle)
            check_encodable(self.strategy.combine, method, value, self._codec)
            self._encodable.add(kind)
        return value

    @staticmethod
    def _load(ctx: Context) -> dict[str, dict[str, Any]]:
        state = ctx.state
        if state is None:
            return {}
        if state.get("v") != STATE_VERSION:
            raise WindowingError(
                f"{ctx.computation}: window state of key {ctx.key!r} has version {state.get('v')!r}, "
                f"this code reads version {STATE_VERSION}; migrate the state or run matching code")
        return dict(state["w"])

    @staticmethod
    def _save(ctx: Context, st: dict[str, dict[str, Any]]) -> None:
        ctx.state = {"v": STATE_VERSION, "w": st} if st else None

    def _new_window(self, w: Window, wm: int | None) -> dict[str, Any]:
        ws: dict[str, Any] = {"t": self.strategy.trigger.initial_state()}
        if wm is not None and wm >= w.end_ms:
            ws["e"] = 1
        return ws

    def _tc(self, ctx: Context, wid: str, ws: dict[str, Any]) -> TriggerContext:
        return TriggerContext(ws["t"], ctx.input_watermark_ms, ctx.now_ms, Window.from_wid(wid).end_ms)

    def _closed_window(self, st: dict[str, dict[str, Any]], proto: Window) -> Window | None:
        """The closed window ``proto`` falls into: itself, or (merging windows) a closed one it overlaps."""
        if st.get(proto.wid, {}).get("x"):
            return proto
        if not self.strategy.window_fn.merging:
            return None
        closed = (Window.from_wid(wid) for wid, ws in st.items() if ws.get("x"))
        return next((w for w in closed if w.start_ms < proto.end_ms and proto.start_ms < w.end_ms), None)

    def _merge_into(self, ctx: Context, st: dict[str, dict[str, Any]], proto: Window) -> str:
        """Merge ``proto`` with the key's live windows; return the id of the window holding it."""
        live = [Window.from_wid(wid) for wid, ws in st.items() if not ws.get("x")]
        target = proto.wid
        for merged, sources in self.strategy.window_fn.merge(live + [proto]):
            stored = [w for w in sources if w.wid in st]
            if proto in sources:
                target = merged.wid
            if stored == [merged]:
                continue  # absorbed by an existing window: not a merge
            self._merge_windows(ctx, st, merged, stored)
        return target

    def _merge_windows(self, ctx: Context, st: dict[str, dict[str, Any]], merged: Window,
                       sources: list[Window]) -> None:
        s = self.strategy
        olds = [st.pop(w.wid) for w in sources]
        for w in sources:
            self._delete_timers(ctx, w.wid)
        ws = self._new_window(merged, ctx.input_watermark_ms)
        ws["a"] = self._checked("merge", s.combine.merge([o["a"] if "a" in o else s.combine.create() for o in olds]))
        n = sum(o.get("n", 0) for o in olds)
        if n:
            ws["n"] = n
        if s.accumulation is AccumulationMode.ACCUMULATING_AND_RETRACTING:
            retract = [r for o in olds for r in o.get("r", [])]
            retract += [[w.wid, o["l"]] for w, o in zip(sources, olds, strict=True) if "l" in o]
            if retract:
                ws["r"] = retract
        tc = self._tc(ctx, merged.wid, ws)
        tc.merging = [o["t"] for o in olds]
        s.trigger.on_merge(tc, 0)
        st[merged.wid] = ws
        self._schedule(ctx, merged.wid, ws)

    def _evaluate(self, ctx: Context, st: dict[str, dict[str, Any]], wid: str) -> None:
        s = self.strategy
        ws = st[wid]
        w = Window.from_wid(wid)
        wm = ctx.input_watermark_ms
        eow = wm is not None and wm >= w.end_ms
        expired = wm is not None and wm >= w.end_ms + s.allowed_lateness_ms
        if not ws.get("x"):
            timing = Timing.EARLY if not eow else Timing.LATE if ws.get("e") else Timing.ON_TIME
            tc = self._tc(ctx, wid, ws)
            finished = False
            if s.trigger.should_fire(tc, 0):
                # an empty pane is emitted only when it is the ON_TIME pane of a watermark firing
                by_watermark = timing is Timing.ON_TIME and not s.trigger.should_fire(
                    TriggerContext(tc.states, None, tc.now_ms, tc.end_ms), 0)
                s.trigger.on_fire(tc, 0)
                finished = s.trigger.is_finished(tc, 0)
                if ws.get("n") or by_watermark:
                    self._emit(ctx, wid, ws, timing, is_last=finished or expired)
            elif expired and ws.get("n"):
                self._emit(ctx, wid, ws, timing, is_last=True)
            if eow:
                ws["e"] = 1
            if finished and not expired:
                st[wid] = ws = {"x": 1}
        if expired:
            del st[wid]
            self._delete_timers(ctx, wid)
            return
        self._schedule(ctx, wid, ws)

    def _emit(self, ctx: Context, wid: str, ws: dict[str, Any], timing: Timing, *, is_last: bool) -> None:
        s = self.strategy
        value = self._checked("extract", s.combine.extract(ws["a"] if "a" in ws else s.combine.create()))
        index = ws.get("i", 0)
        info = PaneInfo(timing, index, index == 0, is_last)
        window = Window.from_wid(wid)
        if s.accumulation is AccumulationMode.ACCUMULATING_AND_RETRACTING:
            # a retraction carries the withdrawn pane's value, negated where negation is defined
            for rwid, rvalue in ws.pop("r", []):
                self._produce(ctx, Pane(ctx.key, Window.from_wid(rwid), negate(rvalue), info, True))
            if "l" in ws:
                self._produce(ctx, Pane(ctx.key, window, negate(ws["l"]), info, True))
            ws["l"] = _snapshot(value)
        self._produce(ctx, Pane(ctx.key, window, value, info))
        ws["i"] = index + 1
        ws.pop("n", None)
        if s.accumulation is AccumulationMode.DISCARDING:
            ws.pop("a", None)

    def _produce(self, ctx: Context, pane: Pane) -> None:
        ctx.produce(self.output, pane.to_dict(), timestamp_ms=pane.window.end_ms)

    def _drop(self, ctx: Context, record: Record, value: Any, w: Window, reason: str) -> None:
        ctx.produce(dropped_stream(self.output), {
            "key": ctx.key, "value": value, "event_time": record.timestamp_ms,
            "window_start": None if w.is_global else w.start_ms,
            "window_end": None if w.is_global else w.end_ms, "reason": reason})

    def _schedule(self, ctx: Context, wid: str, ws: dict[str, Any]) -> None:
        w = Window.from_wid(wid)
        done = ws.get("x") or ws.get("e")
        ctx.set_timer(f"w:{wid}", (w.end_ms + self.strategy.allowed_lateness_ms if done else w.end_ms) - 1)
        targets = [int(n["t"]) for n in ws.get("t", ()) if "t" in n and not n.get("f") and n["t"] > ctx.now_ms]
        if targets and not ws.get("x"):
            ctx.set_timer(f"p:{wid}", min(targets), domain=TimeDomain.PROCESSING_TIME)
        else:
            ctx.delete_timer(f"p:{wid}", domain=TimeDomain.PROCESSING_TIME)

    @staticmethod
    def _delete_timers(ctx: Context, wid: str) -> None:
        ctx.delete_timer(f"w:{wid}")
        ctx.delete_timer(f"p:{wid}", domain=TimeDomain.PROCESSING_TIME)


_SCALARS = (int, float, str, bool, type(None))


def _snapshot(value: Any) -> Any:
    """``value`` as it is now: a pane value may be the accumulator, which ``add`` may change in place."""
    return value if isinstance(value, _SCALARS) else copy.deepcopy(value)


def windowed(*, name: str, inputs: Mapping[str, KeyExtractor], output: str, windowing: WindowFn,
             trigger: Trigger | None = None, allowed_lateness_ms: int = 0,
             accumulation: AccumulationMode | str = AccumulationMode.DISCARDING,
             combine: CombineFn | str = "sum", value: Callable[[Any], Any] | None = None,
             num_intervals: int = Computation.num_intervals, codec: str = Computation.codec,
             allow_pickle: bool = Computation.allow_pickle, exactly_once: bool = Computation.exactly_once,
             dedup_retention: timedelta = Computation.dedup_retention,
             strong_productions: bool = Computation.strong_productions,
             straggler_timeout_s: float = Computation.straggler_timeout_s,
             delivery_timeout_s: float = Computation.delivery_timeout_s,
             late_policy: LatePolicy | str = Computation.late_policy,
             error_policy: ErrorPolicy | str = Computation.error_policy,
             state_ttl: timedelta | None = Computation.state_ttl,
             state_ttl_processing: timedelta | None = Computation.state_ttl_processing,
             **unknown: Any) -> WindowedComputation:
    """A windowed computation reading ``inputs`` (stream -> key extractor) and writing panes, timestamped
    at the window end, to ``output`` (dropped elements to ``dropped_stream(output)``). ``trigger``: Beam's
    default if None; ``allowed_lateness_ms``: how long after its end a window accepts data; ``combine``:
    sum, count, min, max, mean or a CombineFn; ``value``: maps a record value to the combiner's input; the
    other keywords are the :class:`Computation` settings. Raises ConfigError (invalid names or settings, an
    unknown keyword) or WindowingError (invalid strategy)."""
    refuse_unknown(name, unknown, arguments=_ARGUMENTS)
    settings = ComputationSettings(
        num_intervals=num_intervals, codec=codec, allow_pickle=allow_pickle, exactly_once=exactly_once,
        dedup_retention=dedup_retention, strong_productions=strong_productions,
        straggler_timeout_s=straggler_timeout_s, delivery_timeout_s=delivery_timeout_s,
        late_policy=late_policy, error_policy=error_policy, state_ttl=state_ttl,
        state_ttl_processing=state_ttl_processing)
    strategy = WindowingStrategy(window_fn=windowing, trigger=trigger or default_trigger(),
                                 combine=combine_fn_from_spec(combine), allowed_lateness_ms=allowed_lateness_ms,
                                 accumulation=AccumulationMode.parse(accumulation))
    cls = type(f"Windowed_{name}", (WindowedComputation,), {
        "name": name, "inputs": dict(inputs), "outputs": (output, dropped_stream(output)),
        "output": output, **settings.attributes()})
    comp = cast("type[WindowedComputation]", cls)
    comp.validate()
    return comp(strategy, value=value)


_ARGUMENTS = ("name", "inputs", "output", "windowing", "trigger", "allowed_lateness_ms", "accumulation", "combine",
              "value")
