"""``deltawheel bench``: the benchmark scripts of ``benchmarks/`` as subcommands.

``deltawheel bench throughput --size small --out bench-out/small --engines spark_sql,spark_tws``
runs the engines on WORKLOAD.md's input, each run in a process of its own (``--shared-session``:
all in this one), and writes ``throughput.json`` and
``throughput.png`` into ``--out``, printing each engine's micro-batches as they
finish. Exit code 1 if an engine's output differs from the reference.
``deltawheel bench watermarks --size small`` runs the same workload once per injector
watermark estimate (max seen minus bound, MillWheel's exact and percentile estimates) and reports
the watermark lag and the late records of each. ``deltawheel bench cache --size small --out bench-out/cache`` replays the same
workload's row accesses through the row cache (window-aware vs LRU vs the
offline optimum) and writes ``cache.json`` and ``cache.png``.
``deltawheel bench latency --rate 1000 --seconds 60 --engines deltawheel,spark_tws,spark_sql,floor``
feeds records at a fixed rate to each engine's continuous query and measures each record's time
from arrival to the Delta commit that makes its output readable (docs/latency.md); it writes
``latency.json`` and ``latency.png`` into ``--out``. Exit code 1 if an engine's output does not
hold every input record exactly once.
``deltawheel bench history --out bench-out/history`` times a key's history on the image path: the
log-driven reader against Delta's change data feed and time travel (docs/history.md).
``deltawheel bench restart --out bench-out/restart`` SIGKILLs a continuous job after a few batches,
restarts it and reports the seconds to its first committed batch and where they went, with and
without an instance name (``restart.json``; docs/continuous.md).
``deltawheel bench commits --writers 1,2,4,8,16`` runs N writers' batches on one store, a folder and
``s3a://`` behind Toxiproxy's latency, and writes ``commits.json`` and ``commits.png`` (docs/scale.md).

The benchmark modules (pyarrow, matplotlib, the engine registry) are imported
only when a benchmark runs, so ``deltawheel --help`` stays fast. Their progress lines reach a
pipe or a file as they are printed (``| tee``), not in one block at the end: a benchmark's
standard output is line-buffered.
"""

from __future__ import annotations

import argparse
import functools
import io
import sys
from typing import Callable

from deltawheel.benchmarks.args import (
    add_cache_arguments,
    add_commits_arguments,
    add_history_arguments,
    add_latency_arguments,
    add_restart_arguments,
    add_throughput_arguments,
    add_watermark_arguments,
)
from deltawheel.benchmarks.taskreplay import add_tasks_arguments

__all__ = ["register"]


def _by_line(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with standard output line-buffered: Python buffers a pipe's or a file's output in
    blocks, which would hold a benchmark's progress lines back until it ends (minutes)."""

    @functools.wraps(run)
    def lines(args: argparse.Namespace) -> int:
        if isinstance(sys.stdout, io.TextIOWrapper):
            sys.stdout.reconfigure(line_buffering=True)
        return run(args)

    return lines


def _throughput(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.throughput import run_from_args

    return int(run_from_args(args))


def _cache(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.cachebench import run_from_args

    return int(run_from_args(args))


def _watermarks(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.watermarks import run_from_args

    return int(run_from_args(args))


def _latency(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.latency import run_from_args

    return int(run_from_args(args))


def _history(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.history import run_from_args

    return int(run_from_args(args))


def _restart(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.restart import run_from_args

    return int(run_from_args(args))


def _commits(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.commits import run_from_args

    return int(run_from_args(args))


def _tasks(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.taskreplay import run_from_args

    return int(run_from_args(args))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``bench`` subcommand and its benchmarks to ``subparsers``."""
    p = subparsers.add_parser("bench", help="run benchmarks (throughput, cache, watermarks, latency) and save JSON + PNG figures")
    sub = p.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    sub.required = True
    t = sub.add_parser("throughput", help="records/s of several engines on the same workload")
    add_throughput_arguments(t)
    t.set_defaults(func=_by_line(_throughput))
    c = sub.add_parser("cache", help="row cache hit rates: window-aware vs LRU vs optimal on the workload's trace")
    add_cache_arguments(c)
    c.set_defaults(func=_by_line(_cache))
    w = sub.add_parser("watermarks", help="injector watermark estimates side by side: lag against late records")
    add_watermark_arguments(w)
    w.set_defaults(func=_by_line(_watermarks))
    lat = sub.add_parser("latency", help="per-record latency from arrival to a visible Delta commit, engines side by side")
    add_latency_arguments(lat)
    lat.set_defaults(func=_by_line(_latency))
    h = sub.add_parser("history", help="a key's history on the image path: the log-driven reader against Delta's "
                       "change data feed and time travel (docs/history.md)")
    add_history_arguments(h)
    h.set_defaults(func=_by_line(_history))
    r = sub.add_parser("restart", help="seconds from restarting a SIGKILLed continuous job to its first committed "
                       "batch, with and without an instance name (docs/continuous.md)")
    add_restart_arguments(r)
    r.set_defaults(func=_by_line(_restart))
    m = sub.add_parser("commits", help="the commit ceiling of one store: N writers' batches on a folder and on "
                       "s3a:// behind real network latency (Toxiproxy; docs/scale.md)")
    add_commits_arguments(m)
    m.set_defaults(func=_by_line(_commits))
    k = sub.add_parser("tasks", help="run image tasks captured with DELTAWHEEL_TASK_CAPTURE=DIR again in one "
                       "process and print their CPU seconds")
    add_tasks_arguments(k)
    k.set_defaults(func=_by_line(_tasks))
