"""The throughput benchmark's command-line arguments, shared by ``python -m
deltawheel.benchmarks.throughput`` and ``deltawheel bench throughput`` (argparse only: the
CLI registers them without importing the benchmark modules)."""

from __future__ import annotations

import argparse

__all__ = ["add_throughput_arguments"]


def add_throughput_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default="small", choices=["small", "medium", "big"],
                   help="WORKLOAD.md size (default small)")
    p.add_argument("--out", required=True, help="output folder for throughput.json / throughput.png")
    p.add_argument("--engines", default=None,
                   help="comma-separated engine names, run in this order (default: every registered "
                   "engine: spark_sql, spark_tws, and deltawheel if benchmarks/engine_deltawheel.py exists)")
    p.add_argument("--data-root", default=None, help="dataset folder (default <repo>/bench-out/data)")
    p.add_argument("--warmup", action="store_true",
                   help="run each engine once, unmeasured, on a tiny input first (JVM warm-up)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the engines N times, interleaved (A B, B A, ...); report each engine's median run")
