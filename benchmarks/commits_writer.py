"""One writer of the commit benchmark: a job instance's batches, cut down to their commit.

A batch checks the leases, commits a few keys' images with the fence rows and publishes the
watermarks in the background, as an executor fed by ``foreachBatch`` does (the next batch waits
for it before its own); a failed batch is counted by its error's type and the writer goes on."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["WriterSpec", "WriterStats", "run_writer", "keys_for"]


@dataclass(frozen=True)
class WriterSpec:
    """What one writer writes: ``computation``'s ``intervals`` (of ``num_intervals``)."""

    name: str
    computation: str
    intervals: tuple[int, ...]
    num_intervals: int
    keys_per_batch: int = 8
    turns: bool = False  # take turns at the table's commits (``zk/turns.py``), as instances sharing intervals do


@dataclass(kw_only=True)
class WriterStats:
    """One writer's figures over the measured time."""

    name: str
    commits: int = 0
    attempts: int = 0
    conflicts: int = 0
    commit_s: list[float] = field(default_factory=list)
    batch_s: list[float] = field(default_factory=list)
    failed: dict[str, int] = field(default_factory=dict)
    commit_ids: list[str] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    turns_skipped: int = 0  # commits made without a turn (``WriterSpec.turns``)
    batch_started: float | None = None  # monotonic start of the batch under way (None: between batches)


def keys_for(spec: WriterSpec, per_interval: int = 32) -> list[str]:
    """``per_interval`` keys of each of the writer's intervals (its own key space)."""
    from deltawheel.statestore.rowtable.rows import interval_of

    want = set(spec.intervals)
    got: dict[int, list[str]] = {iv: [] for iv in spec.intervals}
    i = 0
    while any(len(v) < per_interval for v in got.values()):
        key = f"{spec.name}-k{i:05d}"
        iv = interval_of(key, spec.num_intervals)
        if iv in want and len(got[iv]) < per_interval:
            got[iv].append(key)
        i += 1
    return [k for iv in spec.intervals for k in got[iv]]


def run_writer(spark: Any, layout: Any, zk: Any, *, pipeline: str, spec: WriterSpec, start: threading.Event,
               measuring: threading.Event, stop: threading.Event, stats: WriterStats,
               ready: threading.Barrier) -> None:
    """Take the leases and intervals, run batches from ``start`` to ``stop``; count those in ``measuring``."""
    from deltawheel.statestore.codecs import get_codec
    from deltawheel.statestore.rowtable.rows import KeyRow, interval_of
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from deltawheel.statestore.zk.watermarks.authority import WatermarkAuthority

    client = connect(zk)
    leases = LeaseManager(client, pipeline=pipeline, owner=spec.name)
    authority = WatermarkAuthority(client, pipeline=pipeline)
    store = RowStore(spark, layout, writer=spec.name, conflict_retries=10)
    turns = None
    if spec.turns:
        from deltawheel.statestore.zk.turns import CommitTurns

        turns = CommitTurns(client, pipeline=pipeline, writer=spec.name)
        store.turns = turns.turn
    codec = get_codec("json")
    publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{spec.name}-watermarks")
    published: Future[Any] | None = None
    try:
        grants = leases.acquire(spec.computation, spec.intervals, wait_s=30.0)
        seqs = {iv: g.sequencer for iv, g in grants.items()}
        store.fence(spec.computation, seqs, claim_only=True)
        pool = keys_for(spec)
        counts = dict.fromkeys(pool, 0)
        ready.wait()
        start.wait()
        n = 0
        while not stop.is_set():
            picked: Sequence[str] = [pool[(n * spec.keys_per_batch + j) % len(pool)] for j in range(spec.keys_per_batch)]
            n += 1
            t0 = stats.batch_started = time.monotonic()
            conflicts0 = store.stats.conflicts
            try:
                # 1. the leases, checked locally
                def check() -> None:
                    for iv in spec.intervals:
                        leases.check_valid(spec.computation, iv)

                check()
                # 2. the fenced commit
                for k in picked:
                    counts[k] += 1
                rows = [KeyRow(computation=spec.computation, key=k,
                               interval=interval_of(k, spec.num_intervals),
                               state=codec.encode({"n": counts[k]})) for k in picked]
                t1 = time.monotonic()
                res = store.commit(spec.computation, rows, sequencers=seqs, num_intervals=spec.num_intervals,
                                   lease_check=check)
                t2 = time.monotonic()
                # 3. the watermark: oldest work per interval, the low watermark advanced (after the
                # previous batch's has landed, and raising what it raised)
                last, published = published, None
                if last is not None:
                    last.result()
                now = int(time.time() * 1000)
                published = publisher.submit(authority.publish_and_advance, spec.computation,
                                             {iv: (now, s) for iv, s in seqs.items()})
            except Exception as exc:  # counted, and the writer goes on
                stats.batch_started = None
                if measuring.is_set():
                    name = type(exc).__name__
                    stats.failed[name] = stats.failed.get(name, 0) + 1
                continue
            stats.batch_started = None
            if measuring.is_set():  # a batch counts when it ends in the measured time
                stats.commits += 1
                stats.attempts += res.attempts
                stats.conflicts += store.stats.conflicts - conflicts0
                stats.commit_s.append(t2 - t1)
                stats.batch_s.append(time.monotonic() - t0)
                stats.commit_ids.append(res.commit_id)
                stats.keys.update(picked)
    finally:
        stats.turns_skipped = 0 if turns is None else turns.skipped
        publisher.shutdown(wait=True)
        with contextlib.suppress(Exception):
            leases.release(spec.computation)
        leases.close()
        authority.close()
        client.stop()
        client.close()
