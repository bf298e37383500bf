"""Late handling across a crash and restart: a batch decides lateness from the batch and durable
state only, a replayed batch decides as its first attempt did, and dedup comes before late routing.

The crash matrix: a late-heavy input (every batch after the first brings records behind the
watermark the previous one acted on, and a producer retry of a record processed on time), a
crash at each protocol step of batch 2, a restart (new ZooKeeper session, leases, recovery) and
Spark's replay of batch 2 — the outputs, state and ``late_data`` must equal an uncrashed run's,
with ``LatePolicy.ROUTE`` (what is routed) and ``LatePolicy.PROCESS`` (the ``late`` flag user
code sees)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from deltawheel.executor.computation import Computation, LatePolicy
from deltawheel.executor.protocol.reports import format_report
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor, stream_rows
from pyspark import cloudpickle

pytestmark = [pytest.mark.spark, pytest.mark.zk]

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules


class RoutedBuckets(BucketCounter):
    """The bucket counter with records behind the watermark routed to ``late_data``."""

    name = "routed_buckets"
    late_policy = LatePolicy.ROUTE


class LateFlags(Computation):
    """Produces, per record, the ``late`` flag it was given (``LatePolicy.PROCESS``)."""

    name = "flags"
    inputs = {"events": "q"}
    outputs = ("flags",)
    num_intervals = 4

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("flags", {"id": record.record_id, "late": record.late})


# (records, input watermark) per batch: from batch 1 on each batch holds records behind the
# watermark the previous batch acted on; batch 3 retries r11 (processed on time in batch 1)
BATCHES: list[tuple[list[tuple[str, str, int]], int | None]] = [
    ([("r01", "cats", 1_000), ("r02", "dogs", 2_000), ("r03", "cats", 8_000), ("r04", "emus", 9_500)], None),
    ([("r11", "cats", 12_000), ("r12", "dogs", 3_000), ("r13", "emus", 14_000), ("r14", "cats", 5_000)], 11_000),
    ([("r21", "cats", 4_000), ("r22", "dogs", 15_000), ("r23", "emus", 25_000), ("r24", "cats", 10_500),
      ("r25", "dogs", 22_000)], 21_000),
    ([("r31", "cats", 18_000), ("r32", "dogs", 6_000), ("r33", "emus", 31_000), ("r11", "cats", 12_000),
      ("r34", "cats", 20_500)], 30_000),
]
CRASH_BATCH = 2
POINTS = ["after_prepare", "after_user_code", "before_commit", "after_commit", "after_delivery",
          "before_watermark"]


class Crash(Exception):
    """Stands in for the process dying at a protocol step."""


def _comp(policy: str) -> Computation:
    return RoutedBuckets() if policy == "route" else LateFlags()


def _late_rows(spark: Any, layout: Any) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(layout.late_data)
    return sorted((r["computation"], r["record_id"], r["key"], r["event_time_ms"], r["watermark_ms"], r["batch_id"])
                  for r in df.collect())


def _run(spark: Any, layout: Any, zk_config: Any, *, policy: str, write_path: str,
         crash_at: str | None = None) -> dict[str, Any]:
    """The batches and a final flush; optionally a crash at a fault point of batch 2, then a restart
    (new session, leases, recovery) and Spark's replay of batch 2 if its foreachBatch never returned."""
    from deltawheel.executor.protocol.faults import FaultPoint

    fired: list[FaultPoint] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if crash_at is not None and point == FaultPoint(crash_at) and batch_id == CRASH_BATCH and not fired:
            fired.append(point)
            raise Crash(point)

    comp = _comp(policy)
    ex, client = start_executor(spark, layout, zk_config, comp, faults=faults, writer="first", write_path=write_path)
    b = 0
    try:
        try:
            for b, (items, wm) in enumerate(BATCHES):
                ex.run_batch(events(spark, items), b, input_watermark_ms=wm)
            b = len(BATCHES)
            ex.flush(input_watermark_ms=60_000)  # settles the last delivery (a crash in it surfaces here)
        except Crash:
            client.stop()  # the session dies with the process: its leases go
            client.close()
            ex, client = start_executor(spark, layout, zk_config, _comp(policy), writer="second",
                                        write_path=write_path)
            # Spark replays the batch whose foreachBatch never returned, then goes on
            for b2 in range(b, len(BATCHES)):
                ex.run_batch(events(spark, BATCHES[b2][0]), b2, input_watermark_ms=BATCHES[b2][1])
            ex.flush(input_watermark_ms=60_000)
    finally:
        stop_executor(ex, client)
    assert [str(p) for p in fired] == ([crash_at] if crash_at else [])
    out = "counts" if policy == "route" else "flags"
    # keys with state or timers; a row left holding only dedup ids is not compared: how long ids
    # are kept is counted in batches of the executor (a restarted one counts afresh), so whether
    # such a row is trimmed yet differs after a restart, whatever the lateness decisions
    state = {k: v for k, v in state_of(spark, layout, comp.name).items() if v != (None, [])}
    return {"outputs": stream_rows(spark, layout, out), "state": state, "late_data": _late_rows(spark, layout)}


_CLEAN: dict[tuple[str, str], dict[str, Any]] = {}


@pytest.fixture(scope="module")
def clean_runs(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    """Per (policy, write path): the outputs, state and late data of the run that never crashed
    (computed once, on first use)."""
    from pathlib import Path

    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    def get(policy: str, write_path: str) -> dict[str, Any]:
        if (policy, write_path) not in _CLEAN:
            layout = StoreLayout(str(tmp_path_factory.mktemp(f"clean-{policy}-{write_path}") / "store"))
            copy_migrated_store(migrated_template, Path(layout.root))
            zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/clean-late-{policy}-{write_path}", session_timeout_s=6.0)
            _CLEAN[(policy, write_path)] = _run(spark, layout, zk, policy=policy, write_path=write_path)
        return _CLEAN[(policy, write_path)]

    return get


def _matrix() -> list[Any]:
    # the default run keeps one crash of the matrix (its clean run and crashed run take ~25 s);
    # the process policy's late flags are checked in test_windowing_settings.py
    fast = {("route", "image", "before_commit")}
    return [pytest.param(policy, path, point,
                         marks=() if (policy, path, point) in fast else pytest.mark.slow,
                         id=f"{policy}-{path}-{point}")
            for policy in ("route", "process") for path in ("image", "merge") for point in POINTS]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("policy", "write_path", "point"), _matrix())
def test_a_crash_at_any_step_of_a_late_heavy_run_gives_the_uncrashed_result(
        spark, migrated_store, zk_config, clean_runs, policy, write_path, point) -> None:  # type: ignore[no-untyped-def]
    want = clean_runs(policy, write_path)
    if policy == "route":  # the input really is late-heavy
        assert {"r21", "r24", "r31", "r32"} <= {r[1] for r in want["late_data"]}, want["late_data"]
    else:
        import json
        flags = {json.loads(v)["id"]: json.loads(v)["late"] for _id, _k, v, _t in want["outputs"]}
        assert flags["r21"] and flags["r24"] and flags["r32"] and not flags["r23"], flags
        assert want["late_data"] == []
    got = _run(spark, migrated_store, zk_config, policy=policy, write_path=write_path, crash_at=point)
    assert got == want
    # the retry of r11 (processed on time in batch 1) is a duplicate, not a late record
    assert "r11" not in {r[1] for r in want["late_data"]}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_a_retry_of_a_record_processed_on_time_is_a_duplicate_not_late_data(
        spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    """A producer retries r1 after the watermark passed it: r1 was processed on time, so the retry
    is dropped as a duplicate; it lands neither in ``late_data`` nor in a count. A record behind the
    watermark that was never seen (r9) is routed."""
    ex, client = start_executor(spark, migrated_store, zk_config, RoutedBuckets(), write_path=write_path)
    try:
        ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "cats", 2_000)]), 0, input_watermark_ms=None)
        ex.run_batch(events(spark, [("r3", "cats", 12_000)]), 1, input_watermark_ms=11_000)
        r = ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r9", "cats", 3_000), ("r4", "cats", 13_000)]), 2,
                         input_watermark_ms=11_000)
        assert (r.processed, r.duplicates, r.late, r.late_routed) == (1, 1, 1, 1)
        assert ", 1 late, " in format_report("routed", r)  # the batch line counts the routed record
        ex.flush(input_watermark_ms=40_000)
    finally:
        stop_executor(ex, client)
    assert [row[1] for row in _late_rows(spark, migrated_store)] == ["r9"]
    counts = sorted((k, v) for _, k, v, _ in stream_rows(spark, migrated_store, "counts"))
    assert counts == [("cats", '{"n": 2, "q": "cats", "start": 0}'), ("cats", '{"n": 2, "q": "cats", "start": 10000}')]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("direct", [True, False])
def test_the_pipeline_routes_a_retry_of_an_on_time_record_as_a_duplicate(
        spark, migrated_store, zk_config, tmp_path, direct) -> None:  # type: ignore[no-untyped-def]
    """Through the pipeline runner, with the image tasks reading the files themselves (direct read)
    or the JVM preparing them: the third file retries r1 (processed on time in the first) behind
    the watermark, next to r3, a record behind it never seen before. r1 is a duplicate; r3 alone
    is late data."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from executor_util import RoutedLate

    folder = tmp_path / "in"
    folder.mkdir()
    files = [[("r1", "k1", 1_000), ("r2", "k1", 30_000)], [("r4", "k1", 31_000)], [("r1", "k1", 1_000), ("r3", "k1", 2_000)]]
    for i, rows in enumerate(files):
        path = folder / f"part-{i}.parquet"
        pq.write_table(pa.table({"record_id": [r for r, _k, _t in rows], "key": [k for _r, k, _t in rows],
                                 "event_time": pa.array([t for _r, _k, t in rows], pa.int64())}), path)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order, one file a batch
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time", value_columns=[],
                          record_id_column="record_id", watermark_delay_ms=2_000, max_files_per_trigger=1)
    summary = PipelineRunner(spark, migrated_store, Pipeline("routing", (inj,), (RoutedLate(),)), zk=zk_config,
                             direct_read=direct, progress=print, end_of_input=False).run()
    reports = [r for r in summary.reports["routed"] if r.records_in]
    assert [r.direct for r in reports] == [direct] * 3
    assert [(r.processed, r.duplicates, r.late, r.late_routed) for r in reports] == \
        [(2, 0, 0, 0), (1, 0, 0, 0), (0, 1, 1, 1)]
    # judged against the watermark computed at the end of the batch before: file 1's 31 s - 2 s
    assert [(row[1], row[4]) for row in _late_rows(spark, migrated_store)] == [("r3", 29_000)]


def test_the_acted_watermark_mark_round_trips_through_commit_metadata() -> None:
    """What a commit records (JSON in the Delta commit's userMetadata) reads back as written."""
    import json

    from deltawheel.executor.protocol.lateness import ActedMark, _marks_of
    from deltawheel.statestore.delta.group import group_meta
    from hypothesis import given
    from hypothesis import strategies as st

    opt_ms = st.one_of(st.none(), st.integers(-(2**62), 2**62))

    @given(st.one_of(st.none(), st.integers(0, 2**40)), opt_ms, opt_ms,
           st.lists(st.integers(0, 4095), min_size=1, unique=True).map(lambda x: tuple(sorted(x))),
           st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), st.integers(-(2**62), 2**62),
                           max_size=3))
    def check(batch_id: int | None, late_ms: int | None, input_ms: int | None, ivs: tuple[int, ...],
              injectors: dict[str, int]) -> None:
        mark = ActedMark(batch_id=batch_id, late_ms=late_ms, input_ms=input_ms, intervals=ivs,
                         injectors=injectors)
        meta = json.dumps({**mark.to_meta(), "computation": "c", "kind": "commit"})
        assert _marks_of(meta, "c", set(ivs)) == [mark]
        assert _marks_of(meta, "other", set(ivs)) == []
        assert _marks_of(meta, "c", {4096}) == []
        # a group commit's version (``delta/group.py``): each batch's mark reads back, the holder's first
        other = ActedMark(batch_id=1, late_ms=5, input_ms=None, intervals=(4096,))
        group = group_meta([meta, json.dumps({**other.to_meta(), "computation": "c", "kind": "commit"})])
        assert _marks_of(group, "c", {*ivs, 4096}) == [mark, other]
        assert _marks_of(group, "c", {4096}) == [other]
        known = [m for m in (late_ms, input_ms) if m is not None]
        assert mark.acted_ms == (max(known) if known else None)

    check()
