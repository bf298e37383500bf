"""``deltawheel bench``: the benchmark scripts of ``benchmarks/`` as subcommands.

``deltawheel bench throughput --size small --out bench-out/small --engines spark_sql,spark_tws``
runs the engines on WORKLOAD.md's input and writes ``throughput.json`` and
``throughput.png`` into ``--out``, printing each engine's micro-batches as they
finish. Exit code 1 if an engine's output differs from the reference.

The benchmark modules (pyarrow, matplotlib, the engine registry) are imported
only when a benchmark runs, so ``deltawheel --help`` stays fast.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def _throughput(args: argparse.Namespace) -> int:
    from deltawheel.benchmarks.throughput import run_from_args

    return int(run_from_args(args))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("bench", help="run benchmarks (throughput) and save JSON + PNG figures")
    sub = p.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    sub.required = True
    t = sub.add_parser("throughput", help="records/s of several engines on the same workload")
    t.add_argument("--size", default="small", choices=["small", "medium", "big"],
                   help="WORKLOAD.md size (default small)")
    t.add_argument("--out", required=True, help="output folder for throughput.json / throughput.png")
    t.add_argument("--engines", default=None,
                   help="comma-separated engine names, run in this order (default: every registered "
                   "engine: spark_sql, spark_tws, and deltawheel if benchmarks/engine_deltawheel.py exists)")
    t.add_argument("--data-root", default=None, help="dataset folder (default <repo>/bench-out/data)")
    t.add_argument("--warmup", action="store_true",
                   help="run each engine once, unmeasured, on a tiny input first (JVM warm-up)")
    t.add_argument("--rounds", type=int, default=1,
                   help="run the engines N times, interleaved (A B, B A, ...); report each engine's median run")
    t.set_defaults(func=_throughput)
