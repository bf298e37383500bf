"""``deltawheel run MODULE:PIPELINE``: a user's own pipeline, every stage live (docs/continuous.md), and
``deltawheel quickstart``: a word count given one micro-batch twice, the second pass changing nothing."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.drivers.engine import connect
from deltawheel.executor.drivers.pipeline import load_pipeline
from deltawheel.executor.drivers.restarts import RESTARTS
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.rowtable.rows import TimeDomain

from . import common

__all__ = ["register", "run_quickstart", "WordCount"]

TEXT = (
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps and the fox runs",
    "exactly once means the same input changes state once",
)
COMPUTATION = "wordcount"
INTERVALS = 4
REPORT_AFTER_MS = 3_600_000  # the processing-time timer each word sets: an hour out, so it stays pending


class WordCount(Computation):
    """Counts each word (the key), produces the count to ``word_counts``, sets a ``report`` timer."""

    name = COMPUTATION
    inputs = {"words": RECORD_KEY}
    outputs = ("word_counts",)
    num_intervals = INTERVALS

    def process_records(self, ctx: Any, records: list[Any]) -> None:
        """Add the key's new records to its count, produce the count, (re)set its report timer."""
        count = (ctx.state or {"count": 0})["count"] + len(records)
        ctx.state = {"count": count}
        ctx.set_timer("report", records[-1].timestamp_ms + REPORT_AFTER_MS, domain=TimeDomain.PROCESSING_TIME)
        ctx.produce("word_counts", {"word": ctx.key, "count": count})


def register(sub: Any) -> None:
    """Add the ``run`` and ``quickstart`` subcommands to ``sub``."""
    p = sub.add_parser("run", help="run your own pipeline (MODULE:PIPELINE) unbounded, every stage live, until "
                                   "Ctrl-C or SIGTERM")
    p.add_argument("target", metavar="MODULE:PIPELINE",
                   help="an importable module (or a .py file) and the name in it of a Pipeline, or of a function "
                        "returning one (e.g. myjob:pipeline)")
    common.add_store_arg(p)
    p.add_argument("--trigger", action="append", default=[], metavar="[COMPUTATION=]INTERVAL",
                   help="a processing-time interval between micro-batches, e.g. '2s' (default: as fast as "
                        "possible); COMPUTATION=INTERVAL for one computation (repeatable)")
    p.add_argument("--computation", action="append", default=None,
                   help="run only this computation here (repeatable; default: all)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds (default: run until stopped)")
    p.add_argument("--drain", action="store_true",
                   help="the stop (--seconds, SIGTERM, Ctrl-C) is the end of the input: read every source to "
                        "its end, fire and deliver everything, then exit")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for leases another process holds")
    p.add_argument("--instance", default=None,
                   help="this job instance's name (letters, digits, _): processes with different names share the "
                        "intervals; a restart under the same name takes its killed predecessor's leases at once")
    p.add_argument("--standby", action="store_true",
                   help="with --instance: hold no interval while an instance that is not a standby lives, and "
                        "take the intervals of the last one that stops or dies (its session timeout)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)")
    p.add_argument("--restarts", type=int, default=RESTARTS, metavar="N",
                   help="a stage whose batch failed with a retryable error (the store unreachable, a full disk) "
                        "starts again in this process, after 2 s doubling to 30 s, at most N times without a "
                        f"committed batch; then the command exits with the error (default {RESTARTS}; 0: at once)")
    common.add_run_args(p)
    p.set_defaults(func=_run)
    p = sub.add_parser("quickstart", help="a word count through the store: leases, fenced commits, dedup on a replay")
    common.add_store_arg(p, required=False)
    common.add_zk_args(p)
    common.add_spark_args(p)
    p.set_defaults(func=_quickstart, store=None)


def _triggers(specs: list[str]) -> tuple[str | None, dict[str, str]]:
    default: str | None = None
    per: dict[str, str] = {}
    for spec in specs:
        name, sep, interval = spec.partition("=")
        if sep:
            per[name.strip()] = interval.strip()
        else:
            default = spec
    return default, per


def _run(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.target)
    trigger, per = _triggers(args.trigger)
    say = common.timed_say(time.monotonic())
    with common.engine_from(args, common.layout_from(args), pipeline.name) as (_spark, engine):
        engine.progress = say
        run = engine.start_pipeline(pipeline, trigger=trigger, triggers=per, computations=args.computation,
                                    gc_every=args.gc_every, metrics_port=args.metrics_port, restarts=args.restarts,
                                    standby=args.standby)
        run.run_until_stopped(seconds=args.seconds, drain=args.drain)
    return 0


def _quickstart(args: argparse.Namespace) -> int:
    if args.store is None:
        args.store = os.path.join("data", "quickstart")
    return run_quickstart(args)


def words_frame(spark: Any, *, now_ms: int) -> Any:
    """The words of :data:`TEXT` as a micro-batch (record id ``s<sentence>-w<word>``, key the word)."""
    codec = get_codec("json")
    rows = [(f"s{i}-w{j}", w, codec.encode({"word": w}), "json", now_ms)
            for i, line in enumerate(TEXT) for j, w in enumerate(line.split())]
    return spark.createDataFrame(rows, "record_id STRING, key STRING, value BINARY, codec STRING, timestamp_ms BIGINT")


def run_quickstart(args: argparse.Namespace) -> int:
    """Run the quickstart word count on ``args.store`` (the same batch twice); returns 0."""
    layout = common.layout_from(args)
    zookeeper = common.zookeeper_for(args, layout)  # the store's own server unless --zk is given
    cfg = zookeeper.config
    spark = common.spark_from(args)
    try:
        with connect(spark, store=layout.root, zk=cfg.hosts, pipeline="quickstart", zk_chroot=cfg.chroot,
                     zk_digest=cfg.digest, zk_session_timeout_s=args.zk_session_timeout) as engine:
            ex = engine.executor(WordCount(), wait_s=30, progress=False)
            print(f"leases: intervals {ex.owner.intervals} with sequencers {ex.owner.sequencers}")
            batch = words_frame(spark, now_ms=int(time.time() * 1000))
            for attempt in (1, 2):
                ex(batch, attempt - 1)
                r = ex.reports[-1]
                print(f"pass {attempt}: {r.records_in} records, {r.processed} new, {r.duplicates} duplicates "
                      f"dropped, {r.productions} produced; one fenced commit wrote {r.keys_written} rows "
                      f"({r.commit_s:.1f} s)")
            ex.settle()  # the last delivery landed
            words = {w for line in TEXT for w in line.split()}
            rows = engine.store.read_keys(COMPUTATION, words, num_intervals=INTERVALS)
            codec = get_codec("json")
            top = sorted(((codec.decode(r.state)["count"], k) for k, r in rows.items() if r.state is not None),
                         reverse=True)[:5]
            print("top words: " + ", ".join(f"{k}={c}" for c, k in top))
        print("\ninspect the state:")
        print(f'  deltawheel sql --store {layout.root} "SELECT key, state_json, n_timers, n_checkpointed FROM state ORDER BY key"')
        print(f"  deltawheel inspect --store {layout.root} --computation {COMPUTATION} --key the")
        print(f'  deltawheel sql --store {layout.root} "SELECT key, value_json FROM word_counts_decoded ORDER BY key"')
        return 0
    finally:
        if zookeeper.release():
            print("deltawheel: stopped the embedded ZooKeeper", file=sys.stderr)
