"""``deltawheel demo``: the Zeitgeist pipeline on the embedded defaults, deterministic for (--events,
--seed): a re-run after a kill ends with the same rows; ``--follow`` runs it live (docs/continuous.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from . import common

__all__ = ["register", "demo_injector", "demo_computations", "parse_retention"]


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand to ``sub``."""
    p = sub.add_parser("demo", help="run the Zeitgeist demo pipeline (window counts, model, spike/dip detection)")
    common.add_store_arg(p, required=False)
    p.add_argument("--events", type=int, default=20_000, help="generated search queries (default 20000)")
    p.add_argument("--scale", type=float, default=None, metavar="X",
                   help="generate X times --events, over X times the event-time span, in X times the files")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--events-per-batch", type=int, default=2_000, help="events per generated file = micro-batch")
    p.add_argument("--wait", type=float, default=900.0,
                   help="seconds to wait for leases held by another copy (default 900)")
    p.add_argument("--input", default=None,
                   help="local folder for the generated input files (default: <store>/_input for a local store, "
                        "data/demo-input for an object-store one); on a cluster every worker must see it")
    p.add_argument("--instance", default=None, metavar="NAME",
                   help="run as job instance NAME (letters, digits, _): instances on one store share every "
                        "computation's intervals (docs/rescaling.md)")
    g = p.add_argument_group("live (--follow)")
    g.add_argument("--follow", action="store_true",
                   help="run the three stages live on events generated now, a line per stage every few "
                        "seconds (records/s, watermark lag, latency); default store data/demo-follow")
    g.add_argument("--rate", type=int, default=500, help="generated events per second (default 500)")
    g.add_argument("--seconds", type=float, default=None,
                   help="end the input after this many seconds, drain every stage and stop (default: run "
                        "until Ctrl-C or SIGTERM)")
    g.add_argument("--window", type=float, default=10.0, metavar="SECONDS",
                   help="the first stage's window length (default 10)")
    g.add_argument("--drain-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="with --seconds: how long the drain may take before the demo stops (default 120)")
    g.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between the per-stage lines (default 5)")
    p.add_argument("--dedup-retention", default=None, metavar="DURATION",
                   help="how long each stage keeps the ids of the records it ran, to drop one delivered "
                        "again (Computation.dedup_retention): 90s, 10m, 1h (default 10m)")
    common.add_run_args(p)
    p.set_defaults(func=_run, store=None)


def _run(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner

    demo_computations(args)  # checks --dedup-retention before anything starts
    if args.follow:
        if args.scale is not None:
            from deltawheel.statestore.exceptions import ConfigError

            raise ConfigError("--scale sizes the generated input of a bounded demo; with --follow the input is "
                              "generated live: set its size with --rate and --seconds")
        return _follow(args)
    if args.scale is not None:  # checked before anything starts
        from ..demo.zeitgeist import scaled_events

        args.events, args.scale = scaled_events(args.events, args.scale), None
    if args.store is None:
        args.store = os.path.join("data", "demo")
    layout = common.layout_from(args)
    if layout.is_local:
        from ..demo.follow import check_store

        check_store(layout, follow=False)
    progress = common.timed_say(time.monotonic())
    # the store's own server unless --zk is given; the last process using it stops it
    with common.zookeeper_for(args, layout) as zookeeper:
        spark = common.spark_from(args, announce=True)
        injector = demo_injector(args, layout)
        pipeline = Pipeline(name="zeitgeist", injectors=(injector,), computations=demo_computations(args))
        background = None
        if args.gc_every is not None:
            from deltawheel.gc.background import BackgroundGc

            background = BackgroundGc.every(spark, layout, args.gc_every)
        runner = PipelineRunner(spark, layout, pipeline, zk=zookeeper.config, wait_s=args.wait,
                                progress=progress, max_pause_s=args.max_pause, instance=args.instance,
                                background_gc=background)
        summary = runner.run()
        for m in runner.moves:
            progress(f"instance {args.instance}: {m.computation} intervals {list(m.before)} -> {list(m.after)} "
                     f"in {m.seconds:.1f}s")
        _summary(spark, layout, summary, events=args.events)
    return 0


def demo_injector(args: argparse.Namespace, layout: Any) -> Any:
    """The generator injector of a bounded demo's ``args``.

    Raises:
        ConfigError: a ``--scale`` that is not a positive number.
    """
    from ..demo.zeitgeist import GeneratorInjector, ZeitgeistParams, scaled_events

    events = args.events if args.scale is None else scaled_events(args.events, args.scale)
    params = ZeitgeistParams(n_events=events, seed=args.seed)
    return GeneratorInjector("queries", os.path.join(_input_root(args, layout), f"seed{args.seed}-n{events}"),
                             params, events_per_batch=args.events_per_batch)


def demo_computations(args: argparse.Namespace, *, window_ms: int | None = None) -> Any:
    """The demo's computations for ``args`` (``window_ms``: the first stage's window; None: 10 s).

    Raises:
        ConfigError: a ``--dedup-retention`` that is not a positive duration.
    """
    from ..demo.pipeline import WINDOW_MS, computations

    retention = None if args.dedup_retention is None else parse_retention(args.dedup_retention)
    return computations(window_ms=WINDOW_MS if window_ms is None else window_ms, dedup_retention=retention)


def parse_retention(text: str) -> Any:
    """The ``timedelta`` of a ``--dedup-retention`` value: a duration > 0 with its unit, as ``--gc-every``'s.

    >>> parse_retention("90s"), parse_retention("1.5m"), parse_retention("1h")
    (datetime.timedelta(seconds=90), datetime.timedelta(seconds=90), datetime.timedelta(seconds=3600))

    Raises:
        ConfigError: anything else.
    """
    from datetime import timedelta

    from deltawheel.gc.background import parse_every
    from deltawheel.statestore.exceptions import ConfigError

    try:
        seconds = parse_every(text)[1]
    except ConfigError:
        seconds = None
    if seconds is None:
        raise ConfigError(f"--dedup-retention must be a positive duration with its unit (90s, 10m, 1h), got "
                          f"{text!r}; nothing was started")
    return timedelta(seconds=seconds)


def _follow(args: argparse.Namespace) -> int:
    from ..demo.follow import check_settings, follow
    from ..demo.pipeline import computations

    if args.store is None:
        args.store = os.path.join("data", "demo-follow")
    layout = common.layout_from(args)
    window_ms = int(round(args.window * 1000))
    check_settings(layout, rate=args.rate, seconds=args.seconds, window_ms=window_ms,  # before anything starts
                   instance=args.instance)
    progress = common.timed_say(time.monotonic())
    names = tuple(f"{c.name} batch " for c in computations())

    def runner_lines(line: str) -> None:
        if not line.startswith(names):  # a line per batch is too many here
            progress(line)

    with common.engine_from(args, layout, "zeitgeist") as (spark, engine):
        engine.progress = runner_lines
        result = follow(engine, os.path.join(_input_root(args, layout), "follow"), rate=args.rate,
                        seconds=args.seconds, seed=args.seed, every_s=args.every, window_ms=window_ms, say=progress,
                        gc_every=args.gc_every, drain_timeout_s=args.drain_timeout,
                        dedup_retention=None if args.dedup_retention is None else parse_retention(args.dedup_retention))
        for name, (n, p50, p99) in result.figures.items():
            lat = "-" if p50 is None or p99 is None else f"p50 {p50:.2f}s p99 {p99:.2f}s"
            progress(f"{name} over the run: {n} records, latency {lat}")
        _summary(spark, layout, result.summary, events=result.events)
    return 0


def _input_root(args: argparse.Namespace, layout: Any) -> str:  # --input, else beside a local store's tables
    given: str | None = args.input
    if given is not None:
        return os.path.abspath(given)
    if layout.is_local:
        return os.path.join(layout.root, "_input")
    return os.path.abspath(os.path.join("data", "demo-input"))  # the generator writes local files


def _summary(spark: Any, layout: Any, summary: Any, *, events: int) -> None:
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("json")
    counts = spark.read.format("delta").load(layout.stream("window_counts"))
    anomalies = [codec.decode(r["value"]) for r in spark.read.format("delta").load(layout.stream("anomalies"))
                 .orderBy("timestamp_ms", "key").collect()]
    records = sum(r.records_in for r in summary.reports.get("window_counter", []))
    late = {n: sum(r.late for r in rs) for n, rs in summary.reports.items()}
    print("\n=== zeitgeist summary ===")
    resumed = records < events
    print(f"records read by window_counter : {records}"
          + (f" in this run, of {events} generated (another run on this store read the rest)" if resumed else ""))
    print(f"window panes (window_counts)   : {counts.count()}")
    print(f"anomalies                       : {len(anomalies)}")
    for a in anomalies:
        print(f"  {a['kind']:5s} {a['query']:>14s} window {time.strftime('%H:%M:%S', time.gmtime(a['window_start'] / 1000))}"
              f"  actual {a['actual']}  expected {a['expected']}")
    late_panes = counts.where(counts.value.cast("string").contains('"timing":"LATE"')).count()
    print("late records per stage         : " + json.dumps(late) + (" (this run)" if resumed else ""))
    print("  (window_counter's are the generator's deliberately late events; a LATE pane window_counter\n"
          f"   emitted for them ({late_panes} in window_counts) carries its window's end, behind the watermark\n"
          "   it already published: late data stays late downstream, where a later stage had read that far)")
    print("watermark lag per stage (ms)   : " + json.dumps(summary.lag_ms))
    print("\nquery the results:")
    print(f'  deltawheel sql --store {layout.root} "SELECT * FROM anomalies_decoded ORDER BY timestamp_ms"')
    print(f'  deltawheel sql --store {layout.root} "SELECT key, count(*) FROM window_counts GROUP BY key ORDER BY 2 DESC"')
    print(f'  deltawheel sql --store {layout.root} "SELECT computation, key, state_json FROM state LIMIT 20"')
    sys.stdout.flush()
