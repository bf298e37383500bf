"""``deltawheel demo --follow``: the Zeitgeist pipeline live, its three stages at once, on events a
:class:`LiveGenerator` renames into the input folder every 100-200 ms (docs/continuous.md, "The demo,
live"). With ``seconds`` the input ends and every stage drains; Ctrl-C or SIGTERM stop at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from deltawheel.executor.sources.injector import publish_watermark
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout

from .monitor import StageMonitor, files_read, percentiles
from .pipeline import WINDOW_MS
from .zeitgeist import ZeitgeistParams, generate_queries

__all__ = ["QUERY_SCHEMA", "LiveQueries", "LiveGenerator", "follow", "check_settings", "check_store"]

QUERY_SCHEMA = "record_id STRING, query STRING, event_time TIMESTAMP"
PERIOD_S = 120  # without --seconds: the events come in periods of this long, each with its spike and dip
Say = Callable[[str], None]


class LiveQueries(ParquetInjector):
    """The live input folder as the demo's ``queries`` injector; :meth:`close_until` ends its event time."""

    def __init__(self, name: str, folder: str, *, max_disorder_ms: int) -> None:
        super().__init__(name, folder, key_column="query", event_time_column="event_time",
                         record_id_column="record_id", watermark_delay_ms=max_disorder_ms, schema=QUERY_SCHEMA)
        self._floor: int | None = None

    def close_until(self, ms: int) -> None:
        """No event of this run is older than ``ms`` any more: the watermark is at least ``ms``."""
        self._floor = ms

    def watermark_ms(self) -> int | None:
        """The estimate, raised to :meth:`close_until`'s time once the input ended."""
        wm = super().watermark_ms()
        return wm if self._floor is None else max(self._floor, wm if wm is not None else self._floor)


@dataclass(frozen=True)
class Arrival:
    """One input file: its name, rename time (seconds since the epoch) and records."""

    name: str
    at_s: float
    records: int


class LiveGenerator:
    """Writes the demo's events into ``folder`` as they come due, in periods of ``seconds`` (or
    :data:`PERIOD_S`) each with its spike and dip; record ids ``f<start ms>-<index>``."""

    def __init__(self, folder: str, *, rate: int, seed: int, seconds: float | None = None) -> None:
        self.folder, self.rate, self.seed, self.seconds = folder, int(rate), seed, seconds
        self.params = ZeitgeistParams(n_events=1, seed=seed, rate_per_s=self.rate)
        self.period_s = seconds if seconds is not None else PERIOD_S
        self.by_name: dict[str, Arrival] = {}  # the files written, by name
        self.written = 0
        self.last_event_ms: int | None = None
        self.done = threading.Event()  # with ``seconds``: every event written
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deltawheel-demo-generator", daemon=True)
        self.t0_ms = 0

    def start(self) -> LiveGenerator:
        """Start writing (the run's time starts now)."""
        os.makedirs(self.folder, exist_ok=True)
        self.t0_ms = int(time.time() * 1000)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop writing (a file being written is finished first)."""
        self._stop.set()
        self._thread.join()

    def _period(self, k: int) -> pa.Table:
        n = max(1, int(round(self.rate * self.period_s)))
        start = self.t0_ms + int(k * self.period_s * 1000)
        t = generate_queries(n, seed=self.seed + k, start_ms=start, rate_per_s=self.rate)
        ids = pa.array([f"f{self.t0_ms}-{k * n + i:010d}" for i in range(n)], pa.string())
        base = start + np.arange(n, dtype=np.int64) * 1000 // self.rate  # when each event is due
        return t.set_column(0, "record_id", ids).append_column("_due_ms", pa.array(base, pa.int64()))

    def _loop(self) -> None:
        rng = np.random.default_rng(self.seed)
        k, table, pos, index = 0, self._period(0), 0, 0
        while not self._stop.wait(float(rng.uniform(0.1, 0.2))):
            now_ms = int(time.time() * 1000)
            parts = []
            while True:
                due = table.column("_due_ms").to_numpy()
                end = int(np.searchsorted(due, now_ms, side="right"))
                if end > pos:
                    parts.append(table.slice(pos, end - pos))
                    pos = end
                if pos < table.num_rows or self.seconds is not None:
                    break
                k, table, pos = k + 1, self._period(k + 1), 0
            if parts:
                self._write(pa.concat_tables(parts).drop(["_due_ms"]), index)
                index += 1
            if self.seconds is not None and pos >= table.num_rows:
                self.done.set()
                return

    def _write(self, events: pa.Table, index: int) -> None:
        name = f"part-{self.t0_ms}-{index:06d}.parquet"
        staged = os.path.join(self.folder, f".{name}.tmp")
        pq.write_table(events, staged)
        os.replace(staged, os.path.join(self.folder, name))
        self.by_name[name] = Arrival(name, time.time(), events.num_rows)
        self.written += events.num_rows
        last = events.column("event_time").cast(pa.int64()).to_numpy().max()
        self.last_event_ms = int(last) if self.last_event_ms is None else max(self.last_event_ms, int(last))


def check_settings(layout: StoreLayout, *, rate: int, seconds: float | None, window_ms: int,
                   instance: str | None = None) -> None:
    """Refuse what ``demo --follow`` cannot run, before anything starts.

    Raises:
        ConfigError: an instance name, a remote store, a bad rate, duration or window, another demo's store.
    """
    if instance is not None:
        raise ConfigError("demo --follow runs every computation's intervals in one process: --instance is for the "
                          "bounded demo")
    if not layout.is_local:
        raise ConfigError(f"demo --follow measures from the store's files: use a local --store (got {layout.root})")
    if rate < 1:
        raise ConfigError(f"--rate must be at least 1 record/s, got {rate}")
    if seconds is not None and seconds <= 0:
        raise ConfigError(f"--seconds must be > 0, got {seconds:g}")
    if window_ms < 1_000:
        raise ConfigError(f"demo --follow: --window must be at least 1 second, got {window_ms / 1000:g}")
    check_store(layout, follow=True)


def check_store(layout: StoreLayout, *, follow: bool) -> None:
    """Refuse a local store holding the other demo's generated input (both write the same rows).

    Raises:
        ConfigError: it holds the bounded demo's input (``follow``) or a live run's (not ``follow``).
    """
    root = os.path.join(layout.root, "_input")
    other, hint = ("seed", "the bounded demo") if follow else ("follow", "a demo --follow run")
    if layout.is_local and os.path.isdir(root) and any(n.startswith(other) for n in os.listdir(root)):
        default = "data/demo-follow" if follow else "data/demo"
        raise ConfigError(f"store {layout.root} holds the input of {hint} ({root}): the live and the bounded demo "
                          f"need a store each; pass another --store (default {default})")


@dataclass(frozen=True)
class FollowResult:
    """What :func:`follow` did: events written, whether it drained, per-stage (records, p50, p99) in all."""

    events: int
    drained: bool
    figures: dict[str, tuple[int, float | None, float | None]]
    summary: Any  # the run's RunSummary


def follow(engine: Any, folder: str, *, rate: int, seconds: float | None, seed: int, every_s: float = 5.0,
           window_ms: int = WINDOW_MS, say: Say, drain_timeout_s: float = 120.0,
           gc_every: str | int | None = None, dedup_retention: timedelta | None = None) -> FollowResult:
    """Run the demo live on ``engine``, its input in ``folder``; ``gc_every`` goes to
    ``engine.start_pipeline``, ``dedup_retention`` applies to every stage.

    Raises:
        ConfigError: as :func:`check_settings` (before anything starts).
        DeltaWheelError: a failed batch's own error (after the run was stopped)."""
    from deltawheel.executor.drivers.pipeline import Pipeline

    from .pipeline import computations

    layout = engine.layout
    check_settings(layout, rate=rate, seconds=seconds, window_ms=window_ms)
    gen = LiveGenerator(folder, rate=rate, seed=seed, seconds=seconds)
    os.makedirs(folder, exist_ok=True)
    queries = LiveQueries("queries", folder, max_disorder_ms=gen.params.max_disorder_ms)
    pipeline = Pipeline("zeitgeist", (queries,), computations(window_ms=window_ms, dedup_retention=dedup_retention))
    run = engine.start_pipeline(pipeline, gc_every=gc_every)
    gen.start()
    until = f"for {seconds:g}s" if seconds else "until stopped"
    say(f"generating {rate} search events/s into {folder} ({until});"
        f" a line per stage every {every_s:g}s: records made durable per second, watermark lag (now - the stage's "
        "low watermark), latency from a record's arrival at the stage (its file's rename; for model and "
        "detector the upstream delivery's commit) to the commit of the batch that processed it")
    monitor = StageMonitor(layout, pipeline="zeitgeist", generator=gen,
                           stages=[("window_counter", None), ("model", "window_counts"), ("detector", "predictions")])
    asked = threading.Event()
    old: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, lambda _signum, _frame: asked.set())
    drained = False
    last = [time.monotonic()]

    def lines(force: bool = False) -> None:
        run.check()
        if force or time.monotonic() - last[0] >= every_s:
            elapsed, last[0] = time.monotonic() - last[0], time.monotonic()
            for line in monitor.lines(engine.authority, elapsed_s=elapsed):
                say(line)

    try:
        while not asked.wait(0.25):
            lines()
            if gen.done.is_set():
                drained = _drain(engine, queries, gen, monitor, run.executors, lines=lines, asked=asked, say=say,
                                 timeout_s=drain_timeout_s, window_ms=window_ms)
                lines(force=True)
                break
    finally:
        gen.stop()
        try:
            run.stop()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
    monitor.poll()
    return FollowResult(gen.written, drained,
                        {name: percentiles(f.total) for name, f in monitor.figures.items()}, run.summary())


def _drain(engine: Any, queries: LiveQueries, gen: LiveGenerator, monitor: StageMonitor, executors: dict[str, Any],
           *, lines: Callable[[], None], asked: threading.Event, say: Say, timeout_s: float, window_ms: int) -> bool:
    """Once every file is read, close event time at the last window's end; wait until every stage
    committed everything (stable for 2 s). False after ``timeout_s``."""
    gave_up = "not drained within the time allowed (or asked to stop): stopping as it is"
    say(f"input ended after {gen.written} events; draining ...")
    deadline, stable_since = time.monotonic() + timeout_s, None
    names = set(gen.by_name)  # the generator has stopped writing
    while not names <= files_read(monitor):
        lines()
        if time.monotonic() > deadline or asked.wait(0.5):
            say(gave_up)
            return False
    last = gen.last_event_ms if gen.last_event_ms is not None else gen.t0_ms
    until = last - last % window_ms + window_ms
    queries.close_until(until)
    publish_watermark(engine.authority, queries)
    say("every file read: the input's watermark moved to the end of the last window")
    counter = executors["window_counter"]
    while time.monotonic() < deadline and not asked.wait(0.5):
        lines()
        fired = any(r.input_watermark_ms is not None and r.input_watermark_ms >= until for r in counter.reports)
        quiet = all(ex.inflight.held_ts() is None for ex in executors.values())
        read = monitor.caught_up("model", "window_counts") and monitor.caught_up("detector", "predictions")
        if fired and quiet and read:
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since >= 2.0:
                say("drained: every stage read and committed everything")
                return True
        else:
            stable_since = None
    say(gave_up)
    return False
