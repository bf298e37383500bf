"""A key's history on the image write path: the log-driven reader against Delta's change data feed.

On the image path every batch that touches an interval rewrites its whole file, so a key that
changed in few batches sits in files rewritten in most. This builds such a store (change data feed
on from its first batch) and times, for one probe key, the log-driven
:func:`~deltawheel.statestore.inspection.history.key_history` (``log``) against ``readChangeFeed``
(``cdf``) and a ``versionAsOf`` read per version (``time_travel``), and for every key
``walk_history`` against the whole change feed: the median of ``--repeat`` runs each, with the
files and bytes each reads (docs/history.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from deltawheel.benchmarks.args import add_history_arguments
from deltawheel.executor.computation import Computation

__all__ = ["run_from_args"]

PROBE = "probe"


class LastValue(Computation):
    """Keeps each key's last value (the probe key's changes are the benchmark's to count)."""

    name = "lastvalue"
    inputs = {"events": "q"}
    outputs = ()
    num_intervals = 8
    exactly_once = False

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = {"v": record.value["v"], "pad": "x" * 64}


def _frame(spark: Any, items: list[tuple[str, int]], batch: int) -> Any:
    from deltawheel.statestore.codecs import get_codec
    from deltawheel.statestore.writepath.streams import stream_schema_ddl

    j = get_codec("json")
    rows = [{"record_id": f"r{batch}-{i}", "key": "", "value": j.encode({"q": k, "v": v}), "codec": "json",
             "timestamp_ms": batch * 1000 + i % 1000, "event_time": None, "producer": "bench",
             "commit_id": f"b{batch}", "format_version": 1} for i, (k, v) in enumerate(items)]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))


def build(spark: Any, store: str, args: argparse.Namespace) -> tuple[list[int], int]:
    """The store: every key once, then ``batches`` batches; returns the batches that changed the
    probe and the rows table version that turned the change data feed on."""
    from deltawheel.statestore.delta.log import latest_local_version

    import deltawheel

    rng = random.Random(7)
    probe_batches = sorted(rng.sample(range(1, args.batches), args.probe_changes))
    with deltawheel.connect(spark, store=store, pipeline="history_bench") as engine:
        spark.sql(f"ALTER TABLE delta.`{os.path.abspath(store)}/rows` "
                  "SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        feed_from = latest_local_version(f"{os.path.abspath(store)}/rows") or 0
        ex = engine.executor(LastValue(), write_path="image", progress=False, manual_watermarks=True)
        keys = [f"k{i:06d}" for i in range(args.keys)]
        ex.run_batch(_frame(spark, [(k, 0) for k in keys] + [(PROBE, 0)], 0), 0, input_watermark_ms=None)
        for b in range(1, args.batches):
            items = [(k, b) for k in rng.sample(keys, args.per_batch)]
            if b in probe_batches:
                items.append((PROBE, b))
            ex.run_batch(_frame(spark, items, b), b, input_watermark_ms=None)
            print(f"history bench: batch {b}/{args.batches - 1} committed", flush=True)
    return [0, *probe_batches], feed_from


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, list[float], Any]:
    times, got = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        got = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times, got


def _scanned(rows: str) -> dict[str, int]:
    """Files and bytes the change feed reads (every add and remove of every version) against the live table."""
    log = Path(rows) / "_delta_log"
    n = size = 0
    for f in sorted(log.glob("*.json")):
        for line in f.read_text().splitlines():
            act = json.loads(line)
            body = act.get("add") or act.get("remove")
            if body and (body.get("partitionValues") or {}).get("computation") == LastValue.name:
                n += 1
                size += int(body.get("size") or 0)
    return {"feed_files": n, "feed_bytes": size}


def run_from_args(args: argparse.Namespace) -> int:
    """Build the store, time the readers, write ``history.json``; 1 if they disagree."""
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.delta.log import latest_local_version
    from deltawheel.statestore.delta.storefs import TableFiles
    from deltawheel.statestore.inspection.history import key_history, walk_history
    from deltawheel.statestore.session.sparkenv import SparkSettings
    from pyspark.sql import functions as F

    out = Path(args.out)
    store = out / "store"
    if store.exists():
        import shutil

        shutil.rmtree(store)
    out.mkdir(parents=True, exist_ok=True)
    spark = build_spark(SparkSettings(master="local[2]", app_name="deltawheel-bench-history"))
    t = time.perf_counter()
    changed, feed_from = build(spark, str(store), args)
    build_s = time.perf_counter() - t
    rows = str((store / "rows").resolve())
    files = TableFiles(rows)
    last = latest_local_version(rows) or 0
    name = LastValue.name

    log_s, log_all, hist = _timed(lambda: key_history(files, computation=name, key=PROBE), args.repeat)

    def cdf() -> list[Any]:
        return list(spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", feed_from)
                    .load(rows).where((F.col("computation") == name) & (F.col("key") == PROBE))
                    .select("_commit_version", "_change_type", "state").collect())

    cdf_s, cdf_all, feed = _timed(cdf, args.repeat)

    def travel() -> int:
        n = 0
        for v in range(last + 1):
            n += spark.read.format("delta").option("versionAsOf", v).load(rows) \
                .where((F.col("computation") == name) & (F.col("key") == PROBE)).count()
        return n

    tt_s, tt_all, _n = _timed(travel, 1)
    every_log_s, _e, n_changes = _timed(lambda: sum(1 for _ in walk_history(files, computation=name)), 1)
    every_cdf_s, _c, n_feed = _timed(lambda: spark.read.format("delta").option("readChangeFeed", "true")
                                     .option("startingVersion", feed_from).load(rows).where(F.col("computation") == name)
                                     .count(), 1)
    # both readers must see the same versions of the probe (the feed: its post-images and inserts)
    feed_versions = sorted({int(r["_commit_version"]) for r in feed if r["_change_type"] in ("insert", "update_postimage")})
    log_versions = sorted(c.commit.version for c in hist.changes)
    agree = log_versions == feed_versions or set(log_versions) <= set(feed_versions)
    result = {
        "keys": args.keys, "batches": args.batches, "per_batch": args.per_batch, "versions": last + 1,
        "probe_changed_in_batches": changed, "probe_versions_listed": len(hist.changes),
        "log_s": log_s, "log_runs_s": log_all, "cdf_s": cdf_s, "cdf_runs_s": cdf_all,
        "time_travel_s": tt_s, "cdf_over_log": cdf_s / log_s, "time_travel_over_log": tt_s / log_s,
        "every_key_log_s": every_log_s, "every_key_changes": n_changes, "every_key_cdf_count_s": every_cdf_s,
        "every_key_feed_rows": n_feed, "feed_versions_with_probe_rows": len({int(r["_commit_version"]) for r in feed}),
        "feed_from_version": feed_from, "build_s": build_s, "load_avg": os.getloadavg(), **_scanned(rows), "readers_agree": agree,
    }
    (out / "history.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    spark.stop()
    return 0 if agree else 1


def main() -> int:
    """``python -m deltawheel.benchmarks.history``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_history_arguments(p)
    return run_from_args(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
