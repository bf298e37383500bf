"""A pipeline as a value (:class:`Pipeline`) and what a run gives back."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from deltawheel.statestore.exceptions import ConfigError

from ..computation import Computation, check_instance
from ..protocol.reports import BatchReport, format_watermark
from ..sources.injector import Injector

__all__ = ["Pipeline", "RunSummary", "MoveTiming", "StopReport", "load_pipeline"]


@dataclass(frozen=True)
class Pipeline:
    """Injectors and computations; streams are named by injector names and computation outputs."""

    name: str
    injectors: tuple[Injector, ...]
    computations: tuple[Computation, ...]
    #: (upstream, downstream) computation names: the downstream runs in its upstream's micro-batch on what
    #: that batch delivered, with no query of its own (docs/continuous.md, "Fused stages")
    fused: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for comp in self.computations:
            check_instance(comp)
        object.__setattr__(self, "fused", tuple(tuple(p) for p in self.fused))
        self.fused_into()

    def fused_into(self) -> dict[str, str]:
        """Downstream -> upstream name of each fused pair; ConfigError for a pair that cannot fuse."""
        by = {c.name: c for c in self.computations}
        out: dict[str, str] = {}
        for pair in self.fused:
            if len(pair) != 2 or not all(isinstance(n, str) for n in pair):
                raise ConfigError(f"pipeline {self.name}: fused={list(self.fused)!r}: each entry is a pair of "
                                  "computation names (upstream, downstream)")
            up, down = pair
            unknown = [n for n in pair if n not in by]
            if unknown:
                raise ConfigError(f"pipeline {self.name}: fused pair {pair!r} names no computation "
                                  f"{', '.join(map(repr, unknown))} (it has {', '.join(by)})")
            if down in out:
                raise ConfigError(f"pipeline {self.name}: {down} is fused twice (to {out[down]} and {up}); a "
                                  "computation runs in one upstream's micro-batch")
            streams = list(by[down].inputs)
            if len(streams) != 1 or self.upstream(by[down]) != [f"computation:{up}"]:
                raise ConfigError(f"pipeline {self.name}: {down} cannot run fused to {up}: a fused computation "
                                  f"reads one stream, which only its upstream produces ({down} reads "
                                  f"{', '.join(streams) or 'nothing'}, from {', '.join(self.upstream(by[down]))})")
            out[down] = up
        return out

    def upstream(self, comp: Computation) -> list[str]:
        """The sources feeding ``comp``, sorted: ``injector:<name>``, ``computation:<name>``."""
        names = {i.name for i in self.injectors}
        out: list[str] = []
        for s in comp.inputs:
            if s in names:
                out.append(f"injector:{s}")
            else:
                prods = [c.name for c in self.computations if s in c.outputs]
                if not prods:
                    raise ConfigError(f"{comp.name} reads stream {s!r}, which no injector or computation produces")
                out += [f"computation:{p}" for p in prods]
        return sorted(set(out))

    def ordered(self) -> list[Computation]:
        """Computations in topological order (upstream first)."""
        done: list[str] = []
        left = list(self.computations)
        while left:
            ready = [c for c in left if all(u.split(":", 1)[1] in done or u.startswith("injector:")
                                            for u in self.upstream(c))]
            if not ready:
                raise ConfigError(f"pipeline {self.name}: the computations {[c.name for c in left]} form a cycle")
            done += [c.name for c in ready]
            left = [c for c in left if c not in ready]
        by = {c.name: c for c in self.computations}
        return [by[n] for n in done]


@dataclass(frozen=True)
class MoveTiming:
    """An instance's change of intervals: from the first lease moved to the new executor's start."""

    computation: str
    before: tuple[int, ...]
    after: tuple[int, ...]
    seconds: float


@dataclass(repr=False)
class RunSummary:
    """A finished run: per computation, its batch reports, low watermark and lag; printed, one line."""

    reports: dict[str, list[BatchReport]] = field(default_factory=dict)
    low_watermarks: dict[str, int | None] = field(default_factory=dict)
    lag_ms: dict[str, int | None] = field(default_factory=dict)

    @classmethod
    def of(cls, reports: dict[str, list[BatchReport]], authority: Any) -> RunSummary:
        """``reports`` per computation, with its published low watermark and lag from ``authority``."""
        return cls(reports, {n: authority.published_low_watermark(n) for n in reports},
                   {n: authority.watermark_lag_ms(n) for n in reports})

    def __repr__(self) -> str:
        parts = [f"{name}: {len(reps)} batches, {sum(r.records_in for r in reps)} records in, "
                 f"{sum(r.productions for r in reps)} produced, low watermark "
                 f"{format_watermark(self.low_watermarks.get(name))}" for name, reps in self.reports.items()]
        return f"RunSummary({'; '.join(parts)})"


@dataclass(frozen=True, kw_only=True)
class StopReport:
    """What :meth:`ContinuousRun.stop` did; printed, the one line it also reports."""

    pipeline: str
    queries: int
    batches: int
    records_in: int
    seconds: float
    unfinished: tuple[str, ...] = ()  # queries whose batch in flight did not end within the timeout

    def __str__(self) -> str:
        late = (f"; still running after the timeout: {', '.join(self.unfinished)} (their batch runs again at the "
                "next start)") if self.unfinished else ""
        return (f"{self.pipeline}: stopped {self.queries} queries after their batch in flight ({self.batches} batches, "
                f"{self.records_in} records in this run), deliveries landed, leases given back in "
                f"{self.seconds:.1f}s{late}")


def load_pipeline(target: str) -> Any:
    """The ``Pipeline`` that ``MODULE:NAME`` (a module or a ``.py`` file) names, or a function returns;
    ConfigError for no ``:``, a module that cannot be imported, no such name, or not a Pipeline."""
    module_name, sep, name = target.partition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"run {target!r}: expected MODULE:PIPELINE, e.g. myjob:pipeline (a Pipeline, or a function "
                          "returning one, named in an importable module or a .py file)")
    if module_name.endswith(".py"):
        folder = os.path.dirname(os.path.abspath(module_name))
        module_name = os.path.basename(module_name)[:-3]
    else:
        folder = os.getcwd()
    sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"run {target!r}: cannot import {module_name!r} ({exc}); run from the folder holding it or "
                          "put it on PYTHONPATH") from exc
    obj = getattr(module, name, None)
    if obj is None:
        raise ConfigError(f"run {target!r}: module {module_name!r} has no {name!r}")
    if callable(obj) and not isinstance(obj, Pipeline):
        obj = obj()
    if not isinstance(obj, Pipeline):
        raise ConfigError(f"run {target!r}: {name!r} is a {type(obj).__name__}, not a deltawheel Pipeline (or a "
                          "function returning one)")
    return obj
