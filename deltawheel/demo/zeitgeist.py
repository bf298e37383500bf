"""A deterministic generator of search queries for the Zeitgeist demo (MillWheel section 2):
Zipf-like popularity, bounded event-time jitter, a few late events, and a spike and a dip
(:class:`AnomalySchedule`). The output depends only on the arguments:

>>> t = generate_queries(1000, seed=7)
>>> t.column_names, t.num_rows
(['record_id', 'query', 'event_time'], 1000)
>>> t.equals(generate_queries(1000, seed=7))
True
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from deltawheel.executor.sources.folders import local_folder_token
from deltawheel.executor.sources.injector import BatchStats, MaxSeenMinusBound
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError

__all__ = ["DEFAULT_START_MS", "AnomalySchedule", "AnomalyWindows", "ZeitgeistParams", "generate_queries",
           "anomaly_windows", "query_name", "table_digest", "write_event_files", "GeneratorInjector", "scaled_events"]

DEFAULT_START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z, the first event's default base time

_WORDS = (
    "weather", "news", "football", "recipes", "maps", "translate", "music", "movies",
    "flights", "hotels", "stocks", "election", "olympics", "jobs", "cars", "phones",
    "laptops", "games", "books", "health", "fitness", "garden", "pets", "travel",
    "tickets", "concerts", "science", "space", "history", "art",
)


def query_name(rank: int) -> str:
    """The query string of popularity rank ``rank`` (0 = most popular).

    >>> query_name(0), query_name(31)
    ('weather', 'news-1')
    """
    word = _WORDS[rank % len(_WORDS)]
    return word if rank < len(_WORDS) else f"{word}-{rank // len(_WORDS)}"


@dataclass(frozen=True, kw_only=True)
class AnomalySchedule:
    """The spike (query ``spike_rank`` ``spike_factor`` times more likely) and the dip (``dip_rank``
    absent) as ``[start, end)`` fractions of the base-time span."""

    spike_rank: int = 5
    spike_factor: float = 10.0
    spike_start: float = 0.40
    spike_end: float = 0.50
    dip_rank: int = 0
    dip_start: float = 0.65
    dip_end: float = 0.80

    def check(self, n_queries: int) -> None:
        """Raise :class:`ConfigError` when the schedule cannot apply to ``n_queries`` queries."""
        if not (0 <= self.spike_rank < n_queries and 0 <= self.dip_rank < n_queries):
            raise ConfigError(f"spike_rank {self.spike_rank} and dip_rank {self.dip_rank} must be "
                              f"query ranks below n_queries={n_queries}")
        if self.spike_rank == self.dip_rank:
            raise ConfigError("spike_rank and dip_rank must be different queries")
        if self.spike_factor <= 1.0:
            raise ConfigError(f"spike_factor must be > 1, got {self.spike_factor}")
        for what, a, b in (("spike", self.spike_start, self.spike_end), ("dip", self.dip_start, self.dip_end)):
            if not 0.0 <= a < b <= 1.0:
                raise ConfigError(f"{what} interval [{a}, {b}) must satisfy 0 <= start < end <= 1")
        if self.spike_start < self.dip_end and self.dip_start < self.spike_end:
            raise ConfigError("the spike and the dip intervals must not overlap")


@dataclass(frozen=True, kw_only=True)
class AnomalyWindows:
    """The anomalies of one generated data set in base time (epoch ms, end exclusive)."""

    spike_query: str
    spike_start_ms: int
    spike_end_ms: int
    dip_query: str
    dip_start_ms: int
    dip_end_ms: int


@dataclass(frozen=True, kw_only=True)
class ZeitgeistParams:
    """The generator's settings: event ``i`` at ``start_ms + i * 1000 // rate_per_s`` minus up to
    ``max_disorder_ms``; a ``late_fraction`` from ``late_after_events`` on is ``late_by_ms`` later."""

    n_events: int
    seed: int
    start_ms: int = DEFAULT_START_MS
    rate_per_s: int = 100
    n_queries: int = 50
    max_disorder_ms: int = 3_000
    late_fraction: float = 0.002
    late_by_ms: int = 30_000
    late_after_events: int = 1_000
    schedule: AnomalySchedule = field(default_factory=AnomalySchedule)

    def generate(self) -> pa.Table:
        """The events: ``record_id`` (``q{seed}-{i:010d}``), ``query``, ``event_time`` (timestamp[ms, UTC]).

        Raises:
            ConfigError: a bad count, rate, fraction or :class:`AnomalySchedule`."""
        n_events, seed, start_ms, rate_per_s = self.n_events, self.seed, self.start_ms, self.rate_per_s
        n_queries, max_disorder_ms, schedule = self.n_queries, self.max_disorder_ms, self.schedule
        late_fraction, late_by_ms, late_after_events = self.late_fraction, self.late_by_ms, self.late_after_events
        if n_events < 0 or rate_per_s <= 0 or n_queries <= 1:
            raise ConfigError(f"need n_events >= 0, rate_per_s > 0 and n_queries > 1; got {n_events}, "
                              f"{rate_per_s}, {n_queries}")
        if not 0.0 <= late_fraction <= 1.0 or max_disorder_ms < 0 or late_by_ms < 0:
            raise ConfigError(f"late_fraction must be in [0, 1] and max_disorder_ms, late_by_ms >= 0; got "
                              f"{late_fraction}, {max_disorder_ms}, {late_by_ms}")
        schedule.check(n_queries)
        rng = np.random.default_rng(seed)
        u_query = rng.random(n_events)
        jitter = rng.integers(0, max_disorder_ms + 1, n_events, dtype=np.int64)
        u_late = rng.random(n_events)

        index = np.arange(n_events, dtype=np.int64)
        base_ms = start_ms + index * 1000 // rate_per_s
        win = anomaly_windows(n_events, start_ms=start_ms, rate_per_s=rate_per_s, schedule=schedule)
        weights = 1.0 / np.arange(1, n_queries + 1, dtype=np.float64)
        spiked = weights.copy()
        spiked[schedule.spike_rank] *= schedule.spike_factor
        dipped = weights.copy()
        dipped[schedule.dip_rank] = 0.0
        in_spike = (base_ms >= win.spike_start_ms) & (base_ms < win.spike_end_ms)
        in_dip = (base_ms >= win.dip_start_ms) & (base_ms < win.dip_end_ms)
        rank = np.searchsorted(_cdf(weights), u_query, side="right")
        rank[in_spike] = np.searchsorted(_cdf(spiked), u_query[in_spike], side="right")
        rank[in_dip] = np.searchsorted(_cdf(dipped), u_query[in_dip], side="right")
        rank = np.minimum(rank, n_queries - 1)  # guards u == 1.0 - eps rounding

        late = (u_late < late_fraction) & (index >= late_after_events)
        event_ms = base_ms - jitter - np.where(late, late_by_ms, 0)
        names = np.array([query_name(r) for r in range(n_queries)], dtype=object)
        return pa.table({
            "record_id": pa.array([f"q{seed}-{i:010d}" for i in range(n_events)], pa.string()),
            "query": pa.array(names[rank], pa.string()),
            "event_time": pa.array(event_ms, pa.timestamp("ms", tz="UTC")),
        })

    def windows(self) -> AnomalyWindows:
        """Where the spike and the dip are in base time."""
        return anomaly_windows(self.n_events, start_ms=self.start_ms, rate_per_s=self.rate_per_s,
                               schedule=self.schedule)


def scaled_events(events: int, scale: float) -> int:
    """``events`` times ``scale``, rounded (``deltawheel demo --scale``).

    >>> scaled_events(20_000, 10), scaled_events(20_000, 0.05)
    (200000, 1000)

    Raises:
        ConfigError: ``events`` negative, ``scale`` not a positive finite number, or no events.
    """
    if events < 0:
        raise ConfigError(f"--events must be >= 0, got {events}: give the number of generated search queries")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--scale must be a positive number (times --events), got {scale!r}: e.g. --scale 10 "
                          "for ten times the default input")
    n = int(round(events * scale))
    if n < 1:
        raise ConfigError(f"--scale {scale:g} times --events {events} is {events * scale:g} events, which rounds "
                          "to none: give a larger --scale or --events")
    return n


def anomaly_windows(n_events: int, *, start_ms: int = DEFAULT_START_MS, rate_per_s: int = 100,
                    schedule: AnomalySchedule = AnomalySchedule()) -> AnomalyWindows:
    """The spike and dip intervals in base time (epoch ms) for ``n_events`` events.

    >>> w = anomaly_windows(10_000, start_ms=0, rate_per_s=100)
    >>> (w.spike_query, w.spike_start_ms, w.spike_end_ms, w.dip_query, w.dip_start_ms, w.dip_end_ms)
    ('translate', 40000, 50000, 'weather', 65000, 80000)
    """
    span = n_events * 1000 // rate_per_s

    def at(frac: float) -> int:
        return start_ms + int(round(frac * span))

    return AnomalyWindows(spike_query=query_name(schedule.spike_rank),
                          spike_start_ms=at(schedule.spike_start), spike_end_ms=at(schedule.spike_end),
                          dip_query=query_name(schedule.dip_rank), dip_start_ms=at(schedule.dip_start),
                          dip_end_ms=at(schedule.dip_end))


def _cdf(weights: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(weights)
    out: np.ndarray = cdf / cdf[-1]  # numpy's division by one of its scalars is typed Any
    return out


def generate_queries(n_events: int, *, seed: int, **settings: Any) -> pa.Table:
    """``n_events`` events (``settings``: :class:`ZeitgeistParams`'s); raises as its ``generate``."""
    return ZeitgeistParams(n_events=n_events, seed=seed, **settings).generate()


def table_digest(table: pa.Table) -> str:
    """SHA-256 over ``"{record_id},{query},{event_time_ms}\\n"`` for every row, in order.

    >>> table_digest(generate_queries(10, seed=1)) == table_digest(generate_queries(10, seed=1))
    True
    """
    h = hashlib.sha256()
    ms = table.column("event_time").cast(pa.int64()).to_pylist()
    for rid, q, t in zip(table.column("record_id").to_pylist(), table.column("query").to_pylist(), ms, strict=True):
        h.update(f"{rid},{q},{t}\n".encode())
    return h.hexdigest()


def write_event_files(table: pa.Table, folder: str, *, events_per_batch: int, first_mtime_s: int) -> list[str]:
    """Write ``table`` as ``part-00000.parquet``, ... (``events_per_batch`` rows each, file ``i``
    modified at ``first_mtime_s + i``: Spark's reading order), idempotently; returns the paths.

    Raises:
        ConfigError: ``events_per_batch`` < 1, or a file exists with different content."""
    if events_per_batch < 1:
        raise ConfigError(f"events_per_batch must be >= 1, got {events_per_batch}")
    os.makedirs(folder, exist_ok=True)
    paths = []
    for f, start in enumerate(range(0, table.num_rows, events_per_batch)):
        chunk = table.slice(start, events_per_batch)
        path = os.path.join(folder, f"part-{f:05d}.parquet")
        paths.append(path)
        if os.path.exists(path):
            if not pq.read_table(path).equals(chunk):
                raise ConfigError(f"{path} exists with different events (another seed, size or "
                                  "schedule?); generate into a fresh folder")
            continue
        staged = os.path.join(folder, f".part-{f:05d}.parquet.{os.getpid()}.tmp")  # instances may write at once
        pq.write_table(chunk, staged)
        os.replace(staged, path)
        os.utime(path, (first_mtime_s + f, first_mtime_s + f))
    return paths


class GeneratorInjector:
    """The generator as an injector: :meth:`prepare` writes the events and ``_zeitgeist.json`` into
    ``folder``, read by a ParquetInjector keyed by ``query``; its watermark ends with the last file.

    Raises:
        ConfigError: a bad count or generation parameter (checked by :meth:`prepare`)."""

    def __init__(self, name: str, folder: str, params: ZeitgeistParams, *, events_per_batch: int = 1000,
                 max_files_per_trigger: int = 1) -> None:
        if events_per_batch < 1:
            raise ConfigError(f"events_per_batch must be >= 1, got {events_per_batch}")
        self.name = name
        self.folder = folder
        self.params = params
        self.events_per_batch = events_per_batch
        self.max_files_per_trigger = max_files_per_trigger
        n_files = -(-params.n_events // events_per_batch)
        self.last_file: str | None = f"part-{n_files - 1:05d}.parquet" if n_files else None
        self._estimate = MaxSeenMinusBound(params.max_disorder_ms)

    def prepare(self) -> list[str]:
        """Write the event files and the manifest if needed; return the file paths."""
        paths = write_event_files(self.params.generate(), self.folder, events_per_batch=self.events_per_batch,
                                  first_mtime_s=self.params.start_ms // 1000)
        manifest: dict[str, Any] = {"params": asdict(self.params), "anomalies": asdict(self.params.windows()),
                                    "events_per_batch": self.events_per_batch,
                                    "files": [os.path.basename(p) for p in paths]}
        staged = os.path.join(self.folder, f"._zeitgeist.json.{os.getpid()}.tmp")
        with open(staged, "w") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
        os.replace(staged, os.path.join(self.folder, "_zeitgeist.json"))
        return paths

    def parquet_injector(self) -> ParquetInjector:
        """The ParquetInjector reading the generated folder."""
        return ParquetInjector(self.name, self.folder, key_column="query", event_time_column="event_time",
                               record_id_column="record_id", max_files_per_trigger=self.max_files_per_trigger,
                               watermark_delay_ms=self.params.max_disorder_ms)

    def input_token(self) -> Any:
        """The folder's files (see :meth:`.ParquetInjector.input_token`)."""
        return local_folder_token(self.folder)

    def stream_df(self, spark: Any) -> Any:
        """:meth:`prepare`, then the folder as a streaming DataFrame in the stream schema."""
        self.prepare()
        return self.parquet_injector().stream_df(spark)

    def observe(self, stats: BatchStats) -> None:
        """Advance the estimate; a batch holding the last file ends the input."""
        self._estimate.observe(stats)
        if self.last_file is not None and self.last_file in stats.sources:
            self._estimate.finish()

    def finish(self) -> None:
        """All files were consumed: the watermark becomes :data:`END_OF_TIME`."""
        self._estimate.finish()

    def watermark_ms(self) -> int | None:
        """Max event time seen minus ``max_disorder_ms``; ``END_OF_TIME`` once the input ended."""
        return self._estimate.watermark_ms()
