"""``deltawheel bench``: the benchmarks as subcommands, each imported when it runs (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import importlib
import io
import sys
from typing import Callable

from deltawheel.benchmarks import args as bench_args
from deltawheel.benchmarks.taskreplay import add_tasks_arguments

__all__ = ["register"]


def _runs(module: str) -> Callable[[argparse.Namespace], int]:
    """``deltawheel.benchmarks.<module>.run_from_args``, standard output line-buffered."""

    def run(args: argparse.Namespace) -> int:
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(line_buffering=True)
        return int(importlib.import_module(f"deltawheel.benchmarks.{module}").run_from_args(args))

    return run


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``bench`` subcommand and its benchmarks to ``subparsers``."""
    p = subparsers.add_parser("bench", help="run benchmarks (throughput, cache, watermarks, latency) and save JSON + PNG figures")
    sub = p.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    sub.required = True
    benchmarks: list[tuple[str, str, Callable[[argparse.ArgumentParser], None], str]] = [
        ("throughput", "records/s of several engines on the same workload",
         bench_args.add_throughput_arguments, "throughput"),
        ("cache", "row cache hit rates: window-aware vs LRU vs optimal on the workload's trace",
         bench_args.add_cache_arguments, "cachebench"),
        ("watermarks", "injector watermark estimates side by side: lag against late records",
         bench_args.add_watermark_arguments, "watermarks"),
        ("latency", "per-record latency from arrival to a visible Delta commit, engines side by side",
         bench_args.add_latency_arguments, "latency"),
        ("restart", "seconds from restarting a SIGKILLed continuous job to its first committed batch, with "
         "and without an instance name (docs/continuous.md)", bench_args.add_restart_arguments, "restart"),
        ("commits", "the commit ceiling of one store: N writers' batches on a folder and on s3a:// behind "
         "real network latency (Toxiproxy; docs/scale.md)", bench_args.add_commits_arguments, "commits"),
        ("state", "state larger than the workers' caches: records/s against Spark SQL (RocksDB), the cache "
         "policies on the run's trace, restart time at 1x and 10x the state (docs/scale.md)",
         bench_args.add_state_arguments, "largestate"),
        ("tasks", "run image tasks captured with DELTAWHEEL_TASK_CAPTURE=DIR again in one process and print "
         "their CPU seconds", add_tasks_arguments, "taskreplay"),
    ]
    for name, help_text, add_arguments, module in benchmarks:
        b = sub.add_parser(name, help=help_text)
        add_arguments(b)
        b.set_defaults(func=_runs(module))
