"""Bounded storage, measured: repeated runs of a counting pipeline with ``deltawheel gc`` between
them; at 1x, 5x and 10x the input of the first run, the files, bytes and log entries of every table
and the ZooKeeper nodes stay within a bound that follows from the configuration, not from the
amount of input. Then a crash in the next batch and a restart: the rows equal an uninterrupted run's.

Every run: 3 batches of 12 records over 5 keys (``BucketCounter``, 4 intervals, record ids kept
90 s), the watermark then advanced past them (each bucket's timer fires, its count is produced to
``counts`` and its state dropped). After runs 1, 5 and 10, gc as a user runs it on an idle store:
stream records kept one hour (``--stream-retention-hours 1``: the test's event times are in 1970,
so none), metrics rows 0 h, VACUUM and the log 0 h (``--force``).

The bounds (from the configuration):
- a table's data files: one per partition after OPTIMIZE + VACUUM: the rows table's partitions are
  (computation, interval), at most ``num_intervals``; the other tables are not partitioned: 1;
- log entries: after a checkpoint at the newest version and the cleanup of what is before it, the
  checkpoint, its commit and the commit's checksum: 3 per table;
- bytes: the live files hold the keys' rows (5 keys, their state emptied once the watermark passes,
  the ids of the records of the last 90 s) and the stream records within the retention: at most
  twice the first run's figure (a run's ids, and the Parquet footers of one file per partition);
- ZooKeeper nodes: the pipeline's folders (8) and per interval its node, its grants folder and the
  grant nodes a lease manager keeps (``keep_grants``, 5): 8 + 4 x 7 = 36 (the runs' executors
  publish no watermarks; the owners are EPHEMERAL and gone between runs).

Prints the figures (``pytest -s``). Slow: about 20 runs and 3 gc runs.
"""

from __future__ import annotations

import inspect
import os

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.zk, pytest.mark.slow]

RUN_BATCHES, RECORDS, KEYS = 3, 12, 5


class _Crash(Exception):
    pass


def _counter():  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from executor_util import BucketCounter

    class ShortIds(BucketCounter):  # record ids kept 90 s (processing time) instead of 10 minutes
        dedup_retention = timedelta(seconds=90)

    return ShortIds()


def _batch(run: int, b: int) -> list[tuple[str, str, int]]:
    base = (run * RUN_BATCHES + b) * 10 * 60_000  # 10 minutes of event time per batch
    return [(f"r{run}-{b}-{i}", f"q{i % KEYS}", base + 1_000 * i) for i in range(RECORDS)]


def _run(spark, layout, zk, run: int, *, faults=None) -> None:  # type: ignore[no-untyped-def]
    from executor_util import events, start_executor, stop_executor

    ex, client = start_executor(spark, layout, zk, _counter(), faults=faults)
    try:
        for b in range(RUN_BATCHES):
            ex(events(spark, _batch(run, b)), run * RUN_BATCHES + b)
        ex.flush(input_watermark_ms=(run + 1) * RUN_BATCHES * 10 * 60_000)
    finally:
        stop_executor(ex, client)


def _table_figures(path: str) -> tuple[int, int, int]:
    """(live data files, their bytes, versioned log files) of a local Delta table, read from its log."""
    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(path)
    assert snap is not None, path
    files = len(snap.adds)
    size = sum(int(a.get("size", 0)) for a in snap.adds)
    log = sum(1 for n in os.listdir(os.path.join(path, "_delta_log")) if n[:20].isdigit())
    return files, size, log


def _zk_nodes(zk) -> int:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.zk.client import connect

    client = connect(zk)
    try:
        def count(path: str) -> int:
            return 1 + sum(count(f"{path.rstrip('/')}/{c}") for c in client.get_children(path))
        return count("/")
    finally:
        client.stop()
        client.close()


def _figures(layout, zk) -> dict[str, tuple[int, int, int]]:  # type: ignore[no-untyped-def]
    # the store's first rows table (empty since migration 8) and buckets' own
    out = {name: _table_figures(path) for name, path in (("rows", layout.rows), ("rows/buckets", layout.rows_of("buckets")),
                                                          ("counts", layout.stream("counts")),
                                                          ("dead_letters", layout.dead_letters),
                                                          ("late_data", layout.late_data),
                                                          ("_metrics/buckets", layout.metrics_of("buckets")))
           if os.path.isdir(os.path.join(path, "_delta_log"))}
    out["zookeeper"] = (_zk_nodes(zk), 0, 0)
    return out


@pytest.mark.timeout(3600)
def test_storage_stays_bounded_as_input_grows_and_a_crash_resumes_exactly(spark, zk_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import BucketCounter, state_of, stream_rows

    from deltawheel import migrations
    from deltawheel.cli import main

    stores = {}
    for name in ("gcd", "clean"):
        stores[name] = StoreLayout(str(tmp_path / name))
        migrations.apply(spark, stores[name], dry_run=False)
    zk = {name: ZkConfig(hosts=zk_server.hosts, chroot=f"/bound-{name}", session_timeout_s=6.0) for name in stores}
    layout, z = stores["gcd"], zk["gcd"]
    measured: dict[int, dict[str, tuple[int, int, int]]] = {}
    runs = 10
    for run in range(runs):
        _run(spark, layout, z, run)
        if run + 1 in (1, 5, 10):
            assert main(["gc", "--store", layout.root, "--apply", "--zk", z.hosts, "--zk-chroot", z.chroot,
                         "--stream-retention-hours", "1", "--metrics-retention-hours", "0",
                         "--vacuum-retain-hours", "0", "--log-retention-hours", "0", "--force"]) == 0
            measured[run + 1] = _figures(layout, z)
            print(f"\nafter {run + 1}x input ({(run + 1) * RUN_BATCHES * RECORDS} records): "
                  + "; ".join(f"{t}: {f} files, {b} bytes, {lg} log entries" if t != "zookeeper" else f"{t}: {f} nodes"
                              for t, (f, b, lg) in measured[run + 1].items()))
    intervals = BucketCounter.num_intervals
    keep_grants = inspect.signature(LeaseManager).parameters["keep_grants"].default
    # the chroot, /layout, /pipelines, /pipelines/test, its store binding, computations, buckets,
    # intervals; per interval its node, its grants folder and the grant nodes kept
    zk_bound = 8 + intervals * (2 + keep_grants)
    for x, figs in measured.items():
        for table, (files, size, log) in figs.items():
            if table == "zookeeper":
                assert files <= zk_bound, (x, files, zk_bound)
                continue
            assert files <= (intervals if table == "rows/buckets" else 0 if table == "rows" else 1), (x, table, files)
            assert log <= 3, (x, table, log)
            assert size <= 2 * measured[1][table][1], (x, table, size)
    # a crash after the commit of the next run's second batch, then a restart that runs the run again
    crashed: list[int] = []

    def faults(point, batch_id) -> None:  # type: ignore[no-untyped-def]
        if str(point) == "after_commit" and batch_id == runs * RUN_BATCHES + 1 and not crashed:
            crashed.append(batch_id)
            raise _Crash(point)

    with pytest.raises(_Crash):
        _run(spark, layout, z, runs, faults=faults)
    assert crashed
    _run(spark, layout, z, runs)
    for run in range(runs + 1):  # the uninterrupted run on a store never gc'ed
        _run(spark, stores["clean"], zk["clean"], run)
    assert state_of(spark, layout, "buckets") == state_of(spark, stores["clean"], "buckets")
    # the gc'ed store's counts: every one produced since its last gc, once, as the uninterrupted run
    # produced it (its retention of one hour back from the wall clock deleted the earlier ones,
    # whose event times are in 1970; it kept the counts of the last run before it: delivered but
    # still checkpointed in the rows until the interval's next commit, a restart may redeliver them)
    last = runs * RUN_BATCHES * 10 * 60_000
    kept = stream_rows(spark, layout, "counts")
    clean = stream_rows(spark, stores["clean"], "counts")
    assert len(kept) == len(set(kept)) and set(kept) <= set(clean)
    assert [r for r in kept if r[3] >= last] == [r for r in clean if r[3] >= last] != []
