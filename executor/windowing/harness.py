"""The scenario harness: script a keyed stream (``SCENARIO_FORMAT.md``), run a windowed computation on
the real per-key runner, get its panes. docs/windowing.md, "Testing your pipeline: the scenario harness"."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.rowtable.rows import KeyRow, interval_of

from ..computation import Record
from ..tasks.usercode.keyrun import run_key
from .panes import AccumulationMode
from .triggers import trigger_from_spec
from .windowed import WindowedComputation, dropped_stream, windowed
from .windows import END_OF_INPUT_MS, WindowingError, window_fn_from_spec

__all__ = ["Backend", "MemoryBackend", "DeltaBackend", "Scenario", "load_scenario", "run_scenario",
           "assert_panes_equal", "PANE_FIELDS", "window_fn_from_spec", "trigger_from_spec"]

_MS = 1000
PANE_FIELDS = ("window_start", "window_end", "value", "timing", "pane_index", "is_first", "is_last", "retraction")
_COMPUTATION = "scenario"
_OUTPUT = "panes"


class Backend(Protocol):
    """Where the harness keeps key rows between runs."""

    def load(self, computation: str, key: str) -> KeyRow | None:
        """The stored row of ``key`` (None if it has none)."""
        ...

    def save(self, rows: list[KeyRow], deletes: list[str]) -> None:
        """Store ``rows`` and delete the rows of the keys ``deletes``, atomically."""
        ...

    def keys(self, computation: str) -> list[str]:
        """Keys of ``computation`` that have a row."""
        ...


class MemoryRows:
    """One computation's rows by key, in memory; :meth:`commit` does nothing."""

    def __init__(self) -> None:
        self.rows: dict[str, KeyRow] = {}

    def load(self, key: str) -> KeyRow | None:
        """The row of ``key`` (None: none)."""
        return self.rows.get(key)

    def save(self, key: str, row: KeyRow | None) -> None:
        """Set the row of ``key`` (None: delete it)."""
        if row is None:
            self.rows.pop(key, None)
        else:
            self.rows[key] = row

    def keys(self) -> list[str]:
        """The keys with a row, sorted."""
        return sorted(self.rows)

    def commit(self) -> None:
        """Nothing to write."""


class DeltaRows(MemoryRows):
    """One computation's rows in a Delta store (migrated; every interval fenced, by default one above its
    fence): :meth:`save` changes them in memory, :meth:`commit` writes the changes in one fenced commit."""

    def __init__(self, spark: Any, layout: Any, computation: str, num_intervals: int, *, writer: str,
                 sequencers: Mapping[int, int] | None = None) -> None:
        import deltawheel.migrations as migrations
        from deltawheel.statestore.rowtable.store import RowStore

        super().__init__()
        migrations.apply(spark, layout, dry_run=False)
        self.layout, self.name, self.n = layout, computation, num_intervals
        self.store = RowStore(spark, layout, writer=writer)
        if sequencers is None:
            fences = self.store.fences(computation)
            sequencers = {iv: fences.get(iv, 0) + 1 for iv in range(num_intervals)}
        self.seqs = dict(sequencers)
        self.store.fence(computation, self.seqs)
        self.puts: dict[str, KeyRow] = {}
        self.dels: set[str] = set()
        self.reread()

    def reread(self) -> None:
        """Read the rows back from the table."""
        self.rows = {r.key: r for r in self.store.scan_intervals(self.name, range(self.n))}

    def save(self, key: str, row: KeyRow | None) -> None:
        """Set the row of ``key`` (None: delete it) until :meth:`commit`."""
        if row is None:
            if self.rows.pop(key, None) is not None:
                self.dels.add(key)
            self.puts.pop(key, None)
        else:
            self.rows[key] = self.puts[key] = row
            self.dels.discard(key)

    def commit(self) -> None:
        """Write what :meth:`save` changed in one fenced commit (nothing if nothing changed)."""
        if self.puts or self.dels:
            self.store.commit(self.name, list(self.puts.values()), sequencers=self.seqs,
                              deletes=[(interval_of(k, self.n), k) for k in sorted(self.dels)],
                              num_intervals=self.n)
        self.puts.clear()
        self.dels.clear()


class MemoryBackend:
    """Rows in memory (fast; for tests and the ``memory`` backend)."""

    def __init__(self) -> None:
        self._rows = MemoryRows()

    def load(self, computation: str, key: str) -> KeyRow | None:
        """The stored row of ``key`` (None if it has none; the scenario has one computation)."""
        return self._rows.load(key)

    def save(self, rows: list[KeyRow], deletes: list[str]) -> None:
        """Store ``rows`` and delete the rows of the keys ``deletes``."""
        for row in rows:
            self._rows.save(row.key, row)
        for key in deletes:
            self._rows.save(key, None)

    def keys(self, computation: str) -> list[str]:
        """Keys with a row, sorted."""
        return self._rows.keys()


class DeltaBackend(MemoryBackend):
    """The Delta rows table (migrated if needed) as a :class:`Backend`: read per step, one fenced commit."""

    def __init__(self, spark: Any, layout: Any, *, sequencer: int = 1) -> None:
        self._rows = self._store = DeltaRows(spark, layout, _COMPUTATION, 1, writer="scenario",
                                             sequencers={0: sequencer})

    def begin_step(self) -> None:
        """Read the scenario computation's rows from the Delta table (the step's starting point)."""
        self._store.reread()

    def end_step(self) -> None:
        """Commit what the step changed in one fenced transaction (nothing if it changed nothing)."""
        self._store.commit()


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario: its computation and its steps (ms)."""

    name: str
    computation: WindowedComputation
    steps: tuple[Mapping[str, Any], ...]


def _ms(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WindowingError(f"scenario {what} must be a number of seconds, got {value!r}")
    return round(value * _MS)


def load_scenario(scenario: Mapping[str, Any] | Path | str) -> Scenario:
    """Parse a scenario (a dict, or a JSON file path) into a :class:`Scenario`; else WindowingError."""
    if isinstance(scenario, (Path, str)):
        scenario = json.loads(Path(scenario).read_text())
    assert isinstance(scenario, Mapping)
    for field in ("windowing", "steps"):
        if field not in scenario:
            raise WindowingError(f"scenario {scenario.get('name')!r} has no {field!r}")
    comp = windowed(
        name=_COMPUTATION, inputs={"elements": "key"}, output=_OUTPUT,
        windowing=window_fn_from_spec(scenario["windowing"], unit_ms=_MS),
        trigger=trigger_from_spec(scenario.get("trigger", {"type": "default"}), unit_ms=_MS),
        allowed_lateness_ms=_ms(scenario.get("allowed_lateness", 0), "allowed_lateness"),
        accumulation=AccumulationMode.parse(scenario.get("accumulation_mode", "discarding")),
        combine=scenario.get("combine", "sum"), num_intervals=1,
        state_ttl=None if scenario.get("state_ttl") is None else timedelta(
            milliseconds=_ms(scenario["state_ttl"], "state_ttl")))
    wm: int | None = None
    now: int | None = None
    for i, step in enumerate(scenario["steps"]):
        kinds = [k for k in ("key", "watermark", "processing_time") if k in step]
        if len(kinds) != 1:
            raise WindowingError(f"step {i} must be exactly one of element, watermark, processing_time: {step}")
        if "watermark" in step:
            t = _ms(step["watermark"], f"step {i} watermark")
            if wm is not None and t <= wm:
                raise WindowingError(f"step {i}: watermark {step['watermark']} does not increase")
            wm = t
        elif "processing_time" in step:
            t = _ms(step["processing_time"], f"step {i} processing_time")
            if t < 0 or (now is not None and t <= now):
                raise WindowingError(f"step {i}: processing time {step['processing_time']} does not increase")
            now = t
        else:
            _ms(step.get("event_time"), f"step {i} event_time")
    return Scenario(str(scenario.get("name", "")), comp, tuple(scenario["steps"]))


def _sec(ms: int | None) -> int | float | None:
    return None if ms is None else ms // _MS if ms % _MS == 0 else ms / _MS


class _Runner:
    def __init__(self, comp: WindowedComputation, backend: Backend) -> None:
        self.comp, self.backend = comp, backend
        self.codec = get_codec("json")
        self.wm: int | None = None
        self.now = 0
        self.panes: list[dict[str, Any]] = []
        self.dropped: list[dict[str, Any]] = []
        self.expired: list[dict[str, Any]] = []  # keys the state TTL dropped, after which step

    def run(self, key: str, records: list[Record], step: int) -> None:
        row = self.backend.load(self.comp.name, key)
        out = run_key(self.comp, key=key, interval=0, row=row, records=records,
                      input_watermark_ms=self.wm, now_ms=self.now)
        if out.keys_expired:
            self.expired.append({"key": key, "after_step": step})
        for p in out.productions:
            value = self.codec.decode(p.value)
            secs = {k: _sec(value[k]) for k in ("event_time", "window_start", "window_end") if k in value}
            if p.stream == dropped_stream(_OUTPUT):
                self.dropped.append({"step": step, **value, **secs})
            else:
                self.panes.append({**value, **secs, "after_step": step})
        new = out.row.with_(pending=()) if out.row is not None else None  # delivered
        if new is None or (new.state is None and not new.timers and not new.record_ids):
            self.backend.save([], [key])
        else:
            self.backend.save([new], [])

    def fire_due(self, step: int) -> None:
        for key in self.backend.keys(self.comp.name):
            row = self.backend.load(self.comp.name, key)
            if row is None:
                continue
            ev, pt = row.next_event_timer_ms, row.next_processing_timer_ms
            if (ev is not None and self.wm is not None and ev < self.wm) or (pt is not None and pt <= self.now):
                self.run(key, [], step)

    def apply(self, i: int, step: Mapping[str, Any]) -> None:
        if "key" in step:
            key = str(step["key"])
            rec = Record(key=key, value=step["value"], timestamp_ms=_ms(step["event_time"], "event_time"),
                         record_id=f"step-{i}", stream="elements")
            self.run(key, [rec], i)
            return
        if "watermark" in step:
            self.wm = _ms(step["watermark"], "watermark")
        else:
            self.now = _ms(step["processing_time"], "processing_time")
        self.fire_due(i)


def run_scenario(scenario: Mapping[str, Any] | Path | str, *, backend: str | Backend = "memory") -> dict[str, Any]:
    """Run a scenario (a dict or a JSON file's path) through the per-key runner; returns ``{"panes": [...],
    "dropped": [...]}``, with ``state_ttl`` also ``"expired": [{"key", "after_step"}, ...]``. ``backend``:
    ``"memory"``, ``"delta"`` or a :class:`Backend`. WindowingError: malformed scenario or unknown backend."""
    sc = load_scenario(scenario)
    if backend == "memory":
        store: Backend = MemoryBackend()
    elif backend == "delta":
        import tempfile

        from deltawheel.executor.session import build_spark
        from deltawheel.statestore.layout import StoreLayout

        store = DeltaBackend(build_spark(), StoreLayout(tempfile.mkdtemp(prefix="dw-scenario-")))
    elif isinstance(backend, str):
        raise WindowingError(f"unknown backend {backend!r}; use memory or delta")
    else:
        store = backend
    (r,) = _lockstep([sc], [store], store)
    return _result(r)


def _lockstep(scs: Sequence[Scenario], backends: Sequence[Backend], shared: Backend) -> list[_Runner]:
    """Run ``scs`` on their ``backends``, one ``shared`` step for all: step i of each, then end of input."""
    runners = [_Runner(sc.computation, b) for sc, b in zip(scs, backends, strict=True)]
    begin = getattr(shared, "begin_step", lambda: None)
    end = getattr(shared, "end_step", lambda: None)
    for i in range(max(len(sc.steps) for sc in scs) + 1):
        begin()
        for r, sc in zip(runners, scs, strict=True):
            if i < len(sc.steps):
                r.apply(i, sc.steps[i])
            elif i == len(sc.steps):
                r.wm = END_OF_INPUT_MS
                r.fire_due(i)
        end()
    return runners


def _result(r: _Runner) -> dict[str, Any]:
    out = {"panes": sorted(r.panes, key=lambda p: p["key"]), "dropped": r.dropped}  # stable within a key
    return out if r.comp.state_ttl is None else {**out, "expired": r.expired}


def assert_panes_equal(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Compare two outputs by SCENARIO_FORMAT.md's rule (AssertionError naming the difference): per key and
    window the panes equal on :data:`PANE_FIELDS` (and ``after_step`` where expected has it), dropped
    entries equal as a multiset."""
    def by_window(panes: list[Mapping[str, Any]], steps: bool) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
        out: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
        for p in panes:
            fields = tuple(p.get(f, False if f == "retraction" else None) for f in PANE_FIELDS)
            out[(p["key"], p["window_start"], p["window_end"])].append(
                fields + ((p.get("after_step"),) if steps else ()))
        return dict(out)

    steps = all("after_step" in p for p in expected.get("panes", []))
    got, want = by_window(list(actual.get("panes", [])), steps), by_window(list(expected.get("panes", [])), steps)
    for w in sorted(set(got) | set(want), key=repr):
        if got.get(w) != want.get(w):
            names = PANE_FIELDS + (("after_step",) if steps else ())
            raise AssertionError(
                f"panes of key {w[0]!r} window [{w[1]}, {w[2]}) differ ({', '.join(names)}):\n"
                f"  expected {want.get(w)}\n  actual   {got.get(w)}")

    def norm(d: list[Mapping[str, Any]]) -> list[str]:
        return sorted(json.dumps(x, sort_keys=True) for x in d)

    if norm(list(actual.get("dropped", []))) != norm(list(expected.get("dropped", []))):
        raise AssertionError(f"dropped differ:\n  expected {expected.get('dropped')}\n  actual   {actual.get('dropped')}")


class _Namespaced:
    """One scenario's view of a shared backend: its keys live under ``prefix``."""

    def __init__(self, shared: Backend, prefix: str) -> None:
        self.shared, self.prefix = shared, prefix

    def load(self, computation: str, key: str) -> KeyRow | None:
        row = self.shared.load(computation, self.prefix + key)
        return None if row is None else row.with_(key=key)

    def save(self, rows: list[KeyRow], deletes: list[str]) -> None:
        self.shared.save([r.with_(key=self.prefix + r.key) for r in rows], [self.prefix + k for k in deletes])

    def keys(self, computation: str) -> list[str]:
        n = len(self.prefix)
        return [k[n:] for k in self.shared.keys(computation) if k.startswith(self.prefix)]


def run_scenarios_lockstep(scenarios: Sequence[Mapping[str, Any] | Path | str], *,
                           backend: Backend) -> list[dict[str, Any]]:
    """Run several scenarios on one backend in lockstep (step i of each, then one ``end_step`` for all);
    keys are namespaced per scenario, so each result equals what :func:`run_scenario` gives alone."""
    scs = [load_scenario(s) for s in scenarios]
    runners = _lockstep(scs, [_Namespaced(backend, f"s{i:03d}/") for i in range(len(scs))], backend)
    return [_result(r) for r in runners]
