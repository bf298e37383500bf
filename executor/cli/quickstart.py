"""``deltawheel quickstart``: write, read and inspect state through the store.

A word count over a few sentences, run twice over the same input to show
exactly-once dedup: the second pass finds every record id already applied
and changes nothing. Every key's state, a timer and a checkpointed
production land in one fenced Delta commit under ZooKeeper leases. Rows are
read through the owner's cache (warmed by the recovery scan, updated by each
commit), so the second pass reads nothing from the table.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.cache import RowCache
from deltawheel.statestore.rowtable.dedup import Deduplicator
from deltawheel.statestore.rowtable.rows import KeyRow, Production, SeenId, Timer, interval_of
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect, digest_acls
from deltawheel.statestore.zk.leases import LeaseManager

from .common import (
    add_spark_args,
    add_store_arg,
    add_zk_args,
    layout_from,
    spark_from,
    zookeeper_for,
)

__all__ = ["register", "run_quickstart"]

TEXT = (
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps and the fox runs",
    "exactly once means the same input changes state once",
)
COMPUTATION = "wordcount"
INTERVALS = 4


def register(sub: Any) -> None:
    """Add the ``quickstart`` subcommand to ``sub``."""
    p = sub.add_parser("quickstart", help="write, read and inspect state through the store (a word count)")
    add_store_arg(p, required=False)
    add_zk_args(p)
    add_spark_args(p)
    p.set_defaults(func=_run, store=None)


def _run(args: argparse.Namespace) -> int:
    if args.store is None:
        args.store = os.path.join("data", "quickstart")
    return run_quickstart(args)


def run_quickstart(args: argparse.Namespace) -> int:
    """Run the quickstart word count on ``args.store`` (twice over the same input); returns 0."""
    from deltawheel import migrations

    layout = layout_from(args)
    zookeeper = zookeeper_for(args, layout)  # the store's own server unless --zk is given
    cfg = zookeeper.config
    spark = spark_from(args)
    client = connect(cfg)
    try:
        for m in migrations.apply(spark, layout, dry_run=False):
            print(f"migrated: {m.version:04d} {m.name}")
        owner_name = f"{socket.gethostname()}:{os.getpid()}"
        leases = LeaseManager(client, pipeline="quickstart", owner=owner_name, acls=digest_acls(cfg))
        store = RowStore(spark, layout, writer=owner_name)
        cache = RowCache(1_000)
        owner = IntervalOwner(store, leases, COMPUTATION, num_intervals=INTERVALS, cache=cache)
        rec = owner.acquire(wait_s=30)
        print(f"leases: intervals {owner.intervals} with sequencers {owner.sequencers}")
        codec = get_codec("json")
        dedup = Deduplicator(store, COMPUTATION, num_intervals=INTERVALS, blooms=rec.blooms, read=owner.read)
        records = [(w, f"s{i}-w{j}") for i, line in enumerate(TEXT) for j, w in enumerate(line.split())]
        for attempt in (1, 2):
            now = int(time.time() * 1000)
            cache.begin_batch(watermark_ms=None, now_ms=now)
            hits, read_before = cache.stats.hits, store.stats.keys_read
            rows = owner.read({w for w, _ in records})
            res = dedup.split(records, known_rows=rows)
            changed: dict[str, KeyRow] = {}
            for word, rid in res.new:
                row = changed.get(word) or rows.get(word) or KeyRow(COMPUTATION, word, interval_of(word, INTERVALS))
                count = (codec.decode(row.state) if row.state else {"count": 0})["count"] + 1
                row = row.with_(
                    state=codec.encode({"count": count}),
                    record_ids=row.record_ids + (SeenId(rid, now),),
                    timers=(Timer(now + 60_000, "report"),),
                    pending=(Production(f"{word}/{count}", "word_counts", word,
                                        codec.encode({"word": word, "count": count}), now),),
                )
                changed[word] = row
            result = owner.commit(list(changed.values()))
            cache.end_batch()
            dedup.remember(res.new)
            print(f"pass {attempt}: {len(records)} records, {len(res.new)} new, {len(res.duplicates)} duplicates "
                  f"dropped; committed {result.rows_written} rows in one fenced commit ({result.duration_s:.1f} s); "
                  f"rows: {cache.stats.hits - hits} from the cache, {store.stats.keys_read - read_before} read "
                  "from the table")
        top = sorted(((codec.decode(r.state)["count"], k) for k, r in store.read_keys(
            COMPUTATION, {w for w, _ in records}, num_intervals=INTERVALS).items()), reverse=True)[:5]
        print("top words: " + ", ".join(f"{k}={c}" for c, k in top))
        owner.release()
        leases.close()
        print("\ninspect the state:")
        print(f'  deltawheel sql --store {layout.root} "SELECT key, state_json, n_timers, n_checkpointed FROM state ORDER BY key"')
        print(f"  deltawheel inspect --store {layout.root} --computation {COMPUTATION} --key the")
        return 0
    finally:
        client.stop()
        client.close()
        if zookeeper.release():
            print("deltawheel: stopped the embedded ZooKeeper", file=sys.stderr)
