"""Replay of a computation whose job instances share its intervals (docs/replay.md, "Limits"):
two instances each own half of the intervals and commit their own batches; a replay of unchanged
code would run every instance's commits in version order, each with its own batch's files, but
each over every interval instead of the intervals its instance held: not exact yet, so the plan
refuses it with a typed error naming the versions and intervals. Real Spark, ZooKeeper and Delta.

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
# file that both instances' batches read would be processed twice for every key (measured before
# the refusal: every count doubled from the start). Filtering each replayed batch to its commit's
# intervals leaves the pending productions differing: the live rows keep those of instance a's
# last batch (its intervals' keys; a has no later commit that clears them), the replay's next
# commit (b's batch) clears them. Until both are solved the plan refuses such a replay.


def _plan(spark: Any, layout: StoreLayout, into: Path, **start: Any) -> Any:
    from deltawheel.executor.drivers.replay import plan_replay

    return plan_replay(spark, store=layout, into=StoreLayout(str(into)), pipeline="sharing", computation=NAME,
                       **start)


@pytest.mark.slow  # four instance runs, then the plans (about 2 min)
@pytest.mark.timeout(1500)
def test_a_replay_of_instances_sharing_intervals_is_refused_not_wrong(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    from deltawheel.statestore.exceptions import ReplayUnavailableError

    folder, layout, zk, expected, middle = shared
    # the live run is exact, and both instances committed batches of their own intervals
    assert {k: s for k, (s, _) in state_of(spark, layout, NAME).items()} == expected
    live = _live_commits(spark, layout)
    ran = [f for c in live for f in c.files or ()]
    assert sorted(set(ran)) == [f"part-{n:05d}.parquet" for n in range(4)]
    assert len(ran) == 2 * 4  # each file run by each instance's batch: two commits name it
    for start in ({"from_start": True}, {"from_version": middle}):
        with pytest.raises(ReplayUnavailableError, match=r"committed by job instances holding part of its "
                           r"intervals \(e\.g\. \[[0-3], [0-3]\] of \[0, 1, 2, 3\]\).*not supported yet"):
            _plan(spark, layout, tmp_path / "shadow", **start)
        assert not (tmp_path / "shadow" / "rows").exists()  # nothing written
