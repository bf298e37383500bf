"""Commits that read no input record positions without a batch:
the merge path's fence, the image path's compaction, a tool's commit (promote, repair). A replay
starts from or across them, re-runs nothing for them, and names a tool's change it does not make."""

from __future__ import annotations

from typing import Any

import pytest


def _commit(version: int, *, kind: str = "commit", batch: int | None = 0, files: tuple[str, ...] | None = ("f",),
            **meta: Any) -> Any:
    from deltawheel.statestore.inspection.positions import ComputationCommit

    return ComputationCommit(version=version, timestamp_ms=0, kind=kind, batch_id=batch, files=files,
                             input_ms=None, late_ms=None, meta={"kind": kind, **meta})


def test_a_commit_without_input_is_crossed_and_a_tool_change_is_named() -> None:
    from deltawheel.statestore.exceptions import ReplayUnavailableError
    from deltawheel.statestore.inspection.positions import commits_after, replay_horizon, tool_changes
    from deltawheel.statestore.rowtable.inputfiles import entry_of, no_input_entry

    assert entry_of(no_input_entry()) == (None, ())
    commits = [_commit(1), _commit(2, kind="fence", batch=None, files=()), _commit(3, batch=1),
               _commit(4, kind="compact", batch=None, files=()),
               _commit(5, kind="promote", batch=None, files=(), tool="promote", audit_id="a1"),
               _commit(6, batch=2, files=()),  # a timers-only batch: re-run
               _commit(7, kind="claim", batch=None, files=None)]
    assert replay_horizon(commits) is None
    assert [c.version for c in commits_after(commits, None)] == [1, 3, 6]
    assert [c.version for c in commits_after(commits, 4)] == [6]
    changes = tool_changes(commits, 3)
    assert [(t.version, t.tool, t.audit_id) for t in changes] == [(5, "promote", "a1")]
    assert "promote change at rows version 5 (audit id a1)" in changes[0].describe()
    assert tool_changes(commits, 5) == [] and tool_changes(commits, 1, to_version=4) == []
    # a tool's commit of an older deltawheel (no positions) is still the horizon
    old = [*commits, _commit(8, kind="repair", batch=None, files=None, tool="repair")]
    assert replay_horizon(old) == 8
    with pytest.raises(ReplayUnavailableError, match="replay from version 8 or later"):
        commits_after(old, 3)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # two executors (merge, then image): minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_the_merge_paths_fence_and_the_image_paths_compaction_record_no_input(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path) -> None:
    from deltawheel.executor.drivers.wiring import positions_recorder
    from deltawheel.statestore.inspection.positions import commits_after, computation_commits, replay_horizon
    from executor_util import BucketCounter, events, start_executor, stop_executor

    def records() -> Any:  # its batches record their positions, as the pipeline drivers' do
        return positions_recorder(BucketCounter(), {}, layout=migrated_store, checkpoint=str(tmp_path / "ck"))

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="merge",
                                positions=records())
    assert ex.positions is not None
    ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 1_000)]), 0, input_watermark_ms=None,
                 input_files=["a.parquet"])
    ex.run_batch(events(spark, [("r3", "cats", 2_000)]), 1, input_watermark_ms=None, input_files=["b.parquet"])
    stop_executor(ex, client)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer="w2",
                                positions=records())
    ex.run_batch(events(spark, [("r4", "dogs", 3_000)]), 2, input_watermark_ms=None, input_files=["c.parquet"])
    stop_executor(ex, client)
    commits = computation_commits(spark, migrated_store, "buckets")
    kinds = {c.kind for c in commits}
    assert {"fence", "compact"} <= kinds, kinds
    for c in commits:
        if c.kind in ("fence", "compact"):
            assert c.files == () and c.batch_id is None, c
    assert replay_horizon(commits) is None  # a replay may start from the start, across them
    assert [c.files for c in commits_after(commits, None)] == [("a.parquet",), ("b.parquet",), ("c.parquet",)]
