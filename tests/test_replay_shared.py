"""Replay of a computation whose job instances share its intervals (docs/replay.md, "Limits"):
two instances each own half of the intervals and commit their own batches; a replay of unchanged
code runs every instance's commits in version order, each with its own batch's files, and should
give an empty diff. It does not yet (both tests are strict xfails, see ``DOUBLED``): each replayed
batch runs over every interval instead of the intervals its instance held. Real Spark, ZooKeeper
and Delta.

Instances are pipeline runners with their own instance name and intervals, run one after the
other in this process on the shared Spark session (as in tests/test_rescale.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.layout import StoreLayout
from executor_util import state_of
from pyspark import cloudpickle
from rescale_instance import write_file

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]

NAME = "shared_count"


class SharedCount(Computation):
    """Counts every record of its key and produces the running count at the record's time.
    Without record-id dedup: a record replayed twice, or never, changes the state and the
    productions."""

    name = NAME
    inputs = {"events": RECORD_KEY}
    outputs = ("counts",)
    num_intervals = 4
    exactly_once = False

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"k": ctx.key, "n": ctx.state})


def injector(folder: Path) -> ParquetInjector:
    return ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                           watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)


def _live_commits(spark: Any, layout: StoreLayout) -> list[Any]:
    from deltawheel.statestore.inspection.positions import computation_commits

    return [c for c in computation_commits(spark, layout, NAME) if c.kind != "claim"]


def _files_read(spark: Any, layout: StoreLayout, *, after: int | None = None) -> list[tuple[str, ...]]:
    """The input files of each commit of a batch with input, in version order (after ``after``)."""
    return [tuple(c.files) for c in _live_commits(spark, layout) if c.files and (after is None or c.version > after)]


@pytest.fixture(scope="module")
def shared(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(folder, layout, ZkConfig, expected counts, the rows version after the first round): instance
    ``a`` owns intervals 0 and 1, ``b`` owns 2 and 3; each runs over files 0-1, then over 2-3."""
    import uuid

    base = tmp_path_factory.mktemp("shared")
    folder, layout = base / "in", StoreLayout(str(base / "store"))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/shared-{uuid.uuid4().hex[:8]}")
    expected: dict[str, int] = {}

    def add(n: int) -> None:
        for k, c in write_file(folder, n).items():
            expected[k] = expected.get(k, 0) + c

    def run(instance: str, intervals: list[int]) -> None:
        PipelineRunner(spark, layout, Pipeline("sharing", (injector(folder),), (SharedCount(),)), zk=zk, wait_s=20,
                       instance=instance, intervals=intervals, warm_workers=False).run()

    for n in (0, 1):
        add(n)
    run("a", [0, 1])
    run("b", [2, 3])
    middle = _live_commits(spark, layout)[-1].version
    for n in (2, 3):
        add(n)
    run("a", [0, 1])
    run("b", [2, 3])
    return folder, layout, zk, expected, middle


# The replay runs every live commit over every interval of its plan (its executor owns them all),
# not over the intervals the committing instance held (recorded in the commit's ``late`` mark): a
# file that both instances' batches read is processed twice for every key. Filtering each replayed
# batch to its commit's intervals leaves the pending productions differing: the live rows keep
# those of instance a's last batch (its intervals' keys; a has no later commit that clears them),
# the replay's next commit (b's batch) clears them.
DOUBLED = pytest.mark.xfail(strict=True, reason="replay ignores the intervals a shared-interval commit held: "
                            "each instance's batch is re-run over every interval, so each input file is processed "
                            "once per instance (every key's count doubled after the start)")


def _replay(spark: Any, folder: Path, layout: StoreLayout, zk: ZkConfig, into: Path, **start: Any) -> Any:
    from deltawheel.executor.drivers.replay import plan_replay, replay, shadow_chroot

    into_layout = StoreLayout(str(into))
    plan = plan_replay(spark, store=layout, into=into_layout, pipeline="sharing", computation=NAME, **start)
    return replay(spark, plan, code=SharedCount(), injectors=(injector(folder),),
                  zk=ZkConfig(hosts=zk.hosts, chroot=shadow_chroot(zk.chroot, into_layout)))


@pytest.mark.slow  # four instance runs, then replays (about 2-3 min)
@pytest.mark.timeout(1500)
@DOUBLED
def test_replay_of_instances_sharing_intervals_from_the_start_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    folder, layout, zk, expected, _ = shared
    # the live run is exact, and both instances committed batches of their own intervals
    assert {k: s for k, (s, _) in state_of(spark, layout, NAME).items()} == expected
    live = _live_commits(spark, layout)
    ran = [f for c in live for f in c.files or ()]
    assert sorted(set(ran)) == [f"part-{n:05d}.parquet" for n in range(4)]
    assert len(ran) == 2 * 4  # each file run by each instance's batch: two commits name it
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_start=True)
    shadow = StoreLayout(str(tmp_path / "shadow"))
    # the replay ran the live commits in version order, each with its own batch's files
    assert _files_read(spark, shadow) == _files_read(spark, layout)
    d = result.diff
    assert d is not None and d.empty, d.to_json()
    assert {k: s for k, (s, _) in state_of(spark, shadow, NAME).items()} == expected
    produced = spark.read.format("delta").load(shadow.stream("counts")).count()
    assert produced == sum(expected.values())  # one production per record, none twice


@pytest.mark.slow  # four instance runs, then replays (about 2-3 min)
@pytest.mark.timeout(1500)
@DOUBLED
def test_replay_of_instances_sharing_intervals_from_the_middle_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    folder, layout, zk, expected, middle = shared
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_version=middle)
    later = [c for c in _live_commits(spark, layout) if c.version > middle]
    assert sorted({f for c in later for f in c.files or ()}) == ["part-00002.parquet", "part-00003.parquet"]
    shadow = StoreLayout(str(tmp_path / "shadow"))
    assert _files_read(spark, shadow) == _files_read(spark, layout, after=middle)
    d = result.diff
    assert d is not None and d.empty, d.to_json()
    assert {k: s for k, (s, _) in state_of(spark, shadow, NAME).items()} == expected
