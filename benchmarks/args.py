"""The ``deltawheel bench`` arguments: argparse only, so the CLI need not import the benchmarks."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

__all__ = ["SIZE_NAMES", "add_throughput_arguments", "add_cache_arguments", "add_watermark_arguments", "add_latency_arguments",
           "DEFAULT_CAPACITIES", "add_commits_arguments", "add_state_arguments", "pick_names"]

DEFAULT_CAPACITIES = (0.02, 0.05, 0.1, 0.2, 0.4)
#: the named workload sizes (``workload.SIZES``; docs/benchmarks.md, "The workload")
SIZE_NAMES = ("small", "medium", "big", "big-keys")


def pick_names(text: str, allowed: Sequence[str], what: str, bench: str) -> list[str]:
    """The comma-separated names of ``text``.

    Raises:
        ConfigError: none given, or one not in ``allowed``.
    """
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = sorted(set(got) - set(allowed))
    if bad or not got:
        from deltawheel.statestore.exceptions import ConfigError

        unknown = ", ".join(map(repr, bad)) or "(none)"
        raise ConfigError(f"bench {bench}: unknown {what} {unknown}; the {what}s are {', '.join(allowed)}")
    return got


def _add_workload_arguments(p: argparse.ArgumentParser, **out: Any) -> None:
    """``--size``, ``--out`` (its ``default``/``required`` and ``help`` in ``out``) and ``--data-root``."""
    p.add_argument("--size", default="small", choices=SIZE_NAMES,
                   help="workload size: WORKLOAD.md's small, medium, big, or big-keys (big over 500,000 key ranks; "
                        "default small)")
    p.add_argument("--out", type=Path, **out)
    p.add_argument("--data-root", type=Path, help="dataset folder (default <repo>/bench-out/data)")


def add_throughput_arguments(p: argparse.ArgumentParser) -> None:
    """Add the throughput benchmark's options (size, output folder, engines, warm-up, rounds, isolation) to ``p``."""
    _add_workload_arguments(p, required=True, help="output folder for throughput.json / throughput.png")
    p.add_argument("--engines", default=None,
                   help="comma-separated engine names, run in this order (default: every engine)")
    p.add_argument("--warmup", action="store_true",
                   help="run each engine once, unmeasured, on a tiny input first (in each run's own process)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the engines N times in balanced orders (three engines: N=6 evens them); report "
                        "each engine's median run")
    p.add_argument("--store-uri", default=None,
                   help="put each engine's state and output on this store (e.g. s3a://bucket/bench), not "
                        "the output folder; engines that cannot (spark_tws) are refused")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE",
                   help="a Spark setting for every engine, on top of the benchmark's (repeatable)")
    p.add_argument("--shared-session", action="store_true",
                   help="run every engine in this process and one Spark session (default: each run in a "
                        "process of its own, whose tree's peak memory is measured)")


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    """Add the cache benchmark's options (size, output folder, capacities) to ``p``."""
    _add_workload_arguments(p, required=True, help="output folder for cache.json / cache.png")
    p.add_argument("--capacities", default=",".join(str(c) for c in DEFAULT_CAPACITIES),
                   help="comma-separated capacities as shares of the keys the trace touches (0 < c <= 1)")
    p.add_argument("--trace", default=None,
                   help="replay the image lookups a run with DELTAWHEEL_IMAGE_CACHE_TRACE=DIR recorded; "
                        "--capacities are then shares of the trace's peak bytes of live images")


def add_watermark_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench watermarks`` options."""
    _add_workload_arguments(p, default="bench-out/watermarks", help="output folder for watermarks.json")
    p.add_argument("--percentiles", default="0.001,0.01",
                   help="comma-separated shares for the percentile estimates (beside bound and exact)")


def add_latency_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench latency`` options (docs/latency.md)."""
    p.add_argument("--rate", type=float, default=1000.0, help="records per second arriving (default 1000)")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of input (default 60)")
    p.add_argument("--engines", default="deltawheel,spark_tws,spark_sql,floor",
                   help="comma-separated, run one after another in this order (default: all four; also "
                        "deltawheel_jvm: deltawheel with KafkaInjector(direct_read=False); deltawheel_fused: "
                        "every later stage fused to the one before it)")
    p.add_argument("--stages", type=int, default=1, choices=[1, 3],
                   help="pipeline stages: 1, or 3 (the running count, then two pass-through stages)")
    p.add_argument("--source", default="files", choices=["files", "kafka"],
                   help="files: Parquet files renamed into a folder; kafka: the same records in a topic")
    p.add_argument("--kafka", default=None,
                   help="--source kafka: the broker, host:port (default: a local broker started under --out)")
    p.add_argument("--out", default="bench-out/latency", help="output folder for latency.json / latency.png")
    p.add_argument("--warmup", type=float, default=10.0,
                   help="seconds of input at the start left out of the percentiles (default 10)")
    p.add_argument("--prewarm", type=float, default=5.0,
                   help="seconds of an unmeasured run of each engine first, at most 1,000 records/s "
                        "(0: none; default 5)")
    p.add_argument("--seed", type=int, default=7, help="the input schedule's seed (gaps between files, keys)")
    p.add_argument("--keys", type=int, default=50_000, help="distinct keys (default 50,000)")
    p.add_argument("--generator", default="thread", choices=["thread", "process"],
                   help="the input generator in a thread (default) or a child process")
    p.add_argument("--drain-timeout", type=float, default=120.0,
                   help="seconds to wait after the last input file for every record's output (default 120)")
    p.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument("--commit-time", default="mtime", choices=["mtime", "commit_info"],
                   help="a version's commit time: its <v>.json file's mtime (default) or commitInfo.timestamp")
    p.add_argument("--zk", default=None,
                   help="ZooKeeper for the deltawheel engine, host:port[,host:port] (default: a store's embedded server)")
    p.add_argument("--watch-log", action="store_true", help="also report when output versions first appear")
    p.add_argument("--later-trigger", default=None,
                   help="--stages 3: deltawheel's stages 2 and 3 (unfused) triggered every INTERVAL, e.g. '500 "
                        "milliseconds' (default: as fast as possible, as stage 1)")


def add_restart_arguments(p: argparse.ArgumentParser) -> None:
    """Add the restart benchmark's options (input files, when to kill, session timeout, cases) to ``p``."""
    p.add_argument("--out", default="bench-out/restart", help="output folder for restart.json and the stores")
    p.add_argument("--files", type=int, default=30, help="input files of 200 records, one per micro-batch (default 30)")
    p.add_argument("--kill-after", type=int, default=3, help="SIGKILL the job after this many committed batches "
                   "(default 3)")
    p.add_argument("--session-timeout", type=float, default=20.0,
                   help="the job's ZooKeeper session timeout, seconds (default 20, connect's)")
    p.add_argument("--cases", default="with_instance,without_instance,standby",
                   help="comma-separated: with_instance (restart under the same instance name), without_instance, "
                        "standby (a running standby takes a SIGKILLed instance's intervals: give it a short "
                        "--session-timeout, e.g. 2)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for a job's batches (default 900)")


def add_commits_arguments(p: argparse.ArgumentParser) -> None:
    """Add the commit benchmark's options (writers, shapes, stores, latencies, seconds) to ``p``."""
    p.add_argument("--out", default="bench-out/commits", help="output folder for commits.json, commits.png and the "
                   "stores (default bench-out/commits)")
    p.add_argument("--writers", default="1,2,4,8,16", help="comma-separated writer counts N (default 1,2,4,8,16)")
    p.add_argument("--shapes", default="computations,instances",
                   help="comma-separated: computations (N computations of one pipeline, each its own leases), "
                        "instances (N job instances sharing one computation's intervals, taking turns at its commits)")
    p.add_argument("--targets", default="local,s3a",
                   help="comma-separated: local (a folder), s3a (S3Proxy behind Toxiproxy, the ZooKeeper log store)")
    p.add_argument("--latencies", default="0,20,50",
                   help="comma-separated ms added to every object-store response by Toxiproxy (s3a only; default 0,20,50)")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per point (default 20)")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each point (default 3)")
    p.add_argument("--keys-per-batch", type=int, default=8, help="keys each batch writes (default 8)")
    p.add_argument("--ensemble", action="store_true", help="a three-server ZooKeeper ensemble")
    p.add_argument("--quick", action="store_true", help="a small run: writers 1,2, local only, 4 s per point")



def add_state_arguments(p: argparse.ArgumentParser) -> None:
    """Add the large-state benchmark's options (keys, passes, batch size, intervals, cache shares) to ``p``."""
    p.add_argument("--out", default="bench-out/state", help="output folder for state.json, state.png and the "
                   "stores (default bench-out/state)")
    p.add_argument("--keys", type=int, default=10_000_000, help="distinct keys, each kept for ever (default 10,000,000)")
    p.add_argument("--passes", type=int, default=2, help="shuffled passes over the keys (default 2)")
    p.add_argument("--per-file", type=int, default=1_000_000,
                   help="records per input file, one file per micro-batch (default 1,000,000)")
    p.add_argument("--intervals", type=int, default=16,
                   help="key intervals (and Spark SQL's state partitions; default 16)")
    p.add_argument("--cache", default="0.1,0.25",
                   help="each worker's image cache bound, as shares of its state (default 0.1,0.25)")
    p.add_argument("--engines", default="deltawheel,spark_sql", help="comma-separated: deltawheel, spark_sql")
    p.add_argument("--scale", type=int, default=10,
                   help="the restart is measured on stores of KEYS/SCALE and of KEYS keys (default 10)")
    p.add_argument("--restart-records", type=int, default=10_000,
                   help="records of the file each restart runs (0: no restart; default 10,000)")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds one run may take (default 7200)")
