"""``deltawheel bench tasks --captured DIR``: run captured image tasks again, in one process.

Runs the tasks a ``DELTAWHEEL_TASK_CAPTURE=DIR`` run left, in order, without Spark, caches warmed as
in the run, and prints each task's CPU seconds (docs/performance.md)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from typing import Any

__all__ = ["add_tasks_arguments", "run_from_args", "replay", "warm"]

_VARIANTS = ("captured", "record", "vector", "columnar")


def add_tasks_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``deltawheel bench tasks``."""
    p.add_argument("--captured", required=True, help="the folder a run with DELTAWHEEL_TASK_CAPTURE=DIR filled")
    p.add_argument("--computation", choices=_VARIANTS, default="captured",
                   help="run the captured computation (default), or the benchmark's window count per record, "
                        "vectorised (combine) or columnar (process_columns) in its place")
    p.add_argument("--repeat", type=int, default=1, help="run all tasks N times (each task's best CPU time is kept)")
    p.add_argument("--profile", default=None, help="write a cProfile of the tasks' runs to this file")
    p.add_argument("--json", default=None, help="also write the figures as JSON to this file")


def _files(folder: str) -> list[str]:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".pkl"))
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: int(n.split("-")[0]))]


def warm(spec: Any, table: Any, first: set[tuple[str, ...]]) -> dict[tuple[str, ...], Any]:
    """Load the task's intervals' images, ids files and Bloom filters into this process's caches.

    Returns copies of the filters as loaded, for :func:`_restore` after the task; ``first``: the
    filters loaded so far."""
    import pyarrow.compute as pc
    from deltawheel.executor.tasks.image import dedup
    from deltawheel.executor.tasks.image.capture import warm as warm_interval

    ivs = set(pc.unique(table.column("interval")).to_pylist()) if table.num_rows else set()
    batch = max(1, table.num_rows // max(1, len(ivs)))
    kept = {}
    for iv in sorted(i for i in ivs if i in spec.sequencers):
        paths = dedup.bloom_paths(spec, iv)
        if paths not in first:  # built from the files the first time (a filter of the run itself,
            first.add(paths)    # in this process, holds the ids that batch added)
            dedup.cached_bloom(paths, forget=True)
        warm_interval(spec, iv, batch)
        if (bloom := dedup.cached_bloom(paths)) is not None:
            kept[paths] = bloom.copy()
    return kept


def _restore(kept: dict[tuple[str, ...], Any]) -> None:
    from deltawheel.executor.tasks.image import dedup

    for paths, bloom in kept.items():
        dedup.remember_bloom(paths, bloom)


def _variant(spec: Any, which: str) -> Any:
    if which == "captured":
        return spec
    from deltawheel.executor.computation import Computation

    from .engine_deltawheel import window_count

    comp = window_count(spec.comp.num_intervals, vectorised=which == "vector", columnar=which == "columnar")
    if which == "record" and spec.comp.codec == "int64map":  # the columnar run's computation, per record
        per_record = type("WindowCountPerRecord", (type(window_count(spec.comp.num_intervals, columnar=True)),),
                          {"process_columns": Computation.process_columns})
        comp = per_record()
    return replace(spec, comp=comp)


def replay(folder: str, *, computation: str = "captured", repeat: int = 1,
           profile: str | None = None) -> dict[str, Any]:
    """Run the captured tasks of ``folder``; returns the figures (CPU seconds per task and in total)."""
    import cProfile
    import time

    from deltawheel.executor.tasks.image.capture import load_captured
    from deltawheel.executor.tasks.image.task import run_task

    files = _files(folder)
    tasks = [load_captured(p) for p in files]
    tasks = [(_variant(spec, computation), table) for spec, table in tasks]
    prof = cProfile.Profile(time.process_time) if profile else None  # CPU, not wall: robust to load
    best: list[float] = [float("inf")] * len(tasks)
    first: set[tuple[str, ...]] = set()
    out: list[dict[str, Any]] = []
    for _ in range(max(1, repeat)):
        out = []
        for n, (spec, table) in enumerate(tasks):
            kept = warm(spec, table, first)
            t0 = time.process_time()
            if prof is not None:
                prof.enable()
            sums = run_task(spec, table)
            if prof is not None:
                prof.disable()
            cpu = time.process_time() - t0
            _restore(kept)
            best[n] = min(best[n], cpu)
            out.append({"file": os.path.basename(files[n]), "records": table.num_rows,
                        "intervals": [s.interval for s in sums], "processed": sum(s.processed for s in sums),
                        "duplicates": sum(s.duplicates for s in sums), "fired": sum(s.fired for s in sums),
                        "productions": sum(s.n_prods for s in sums), "keys_written": sum(s.keys_written for s in sums),
                        "bloom_maybe": sum(s.bloom_maybe for s in sums),
                        "cpu_s": round(best[n], 4)})
    if prof is not None and profile:
        prof.dump_stats(profile)
    return {"captured": folder, "computation": computation, "repeat": repeat, "tasks": out,
            "total_cpu_s": round(sum(best), 4)}


def run_from_args(args: argparse.Namespace) -> int:
    """``deltawheel bench tasks``: print (and optionally save) the figures."""
    report = replay(args.captured, computation=args.computation, repeat=args.repeat, profile=args.profile)
    for t in report["tasks"]:
        print(f"{t['file']}: {t['records']:>7} records, intervals {t['intervals']}, processed {t['processed']}, "
              f"fired {t['fired']}, productions {t['productions']}, keys written {t['keys_written']}: "
              f"{t['cpu_s']:.3f} s CPU")
    print(f"{len(report['tasks'])} tasks ({report['computation']}): {report['total_cpu_s']:.3f} s CPU in total")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
