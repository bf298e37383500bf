"""Replay from the middle of a windowed computation's run: a flush batch (the
pipeline runner's batch without input, firing the timers the watermark made due) takes the id the
query's next micro-batch gets too, so the diff's choice of the live productions must be by commit,
not by batch id; real Spark, ZooKeeper and Delta."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]

PER_FILE = 400


@pytest.fixture(scope="module")
def flushed(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(store, ZkConfig, input folder): the demo's window_counter and model, run twice over a
    growing folder (2, then 4 files), each run ending with a flush."""
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from replay_source import pipeline_for

    from deltawheel.demo.zeitgeist import ZeitgeistParams, write_event_files

    base = tmp_path_factory.mktemp("flush")
    store, folder = base / "store", str(base / "input")
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/flush-{uuid.uuid4().hex[:8]}")
    params = ZeitgeistParams(n_events=4 * PER_FILE, seed=5, rate_per_s=20, n_queries=6)
    for files in (2, 4):
        write_event_files(params.generate().slice(0, files * PER_FILE), folder, events_per_batch=PER_FILE,
                          first_mtime_s=params.start_ms // 1000)
        PipelineRunner(spark, StoreLayout(str(store)), pipeline_for(folder, disorder_ms=params.max_disorder_ms),
                       zk=zk, end_of_input=False, progress=lambda line: None).run()
    return store, zk, folder


def _flush_sharing_its_id(spark: Any, store: Path) -> Any:
    """A window_counter commit of a flush (no input) whose batch id a later commit has too."""
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout

    commits = [c for c in computation_commits(spark, StoreLayout(str(store)), "window_counter") if c.reruns]
    shared = [c for i, c in enumerate(commits) if not c.files and any(
        d.batch_id == c.batch_id for d in commits[i + 1:])]
    assert shared, [(c.version, c.batch_id, c.files) for c in commits]
    return shared[0]


@pytest.mark.slow  # two runs of the demo's first stages, then a replay (about 4 min)
@pytest.mark.timeout(1500)
def test_replay_from_a_flush_in_the_middle_of_a_windowed_run_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, flushed, tmp_path, capsys, monkeypatch) -> None:
    from deltawheel.statestore.layout import StoreLayout
    from replay_source import INPUT_ENV

    store, zk, folder = flushed
    flush = _flush_sharing_its_id(spark, store)
    # the live store has productions of the flush under the id of the batch after it
    fired = spark.read.format("delta").load(f"{store}/streams/window_counts") \
        .where(f"commit_id = '{flush.meta['commit_id']}'").count()
    assert fired > 0
    monkeypatch.setenv(INPUT_ENV, folder)
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    into, out = tmp_path / "shadow", tmp_path / "diff.json"
    rc = main(["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "window_counter",
               "--from-version", str(flush.version), "--into", str(into), "--zk", zk.hosts, "--zk-chroot",
               zk.chroot, "--diff-out", str(out), "--source", "replay_source:pipeline"])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    d = json.loads(out.read_text())
    assert d["empty"], got.out
    # it replayed the batch that shares the flush's id: its productions are in the shadow store
    shadow = spark.read.format("delta").load(StoreLayout(str(into)).stream("window_counts"))
    assert shadow.where(f"commit_id like 'window_counter:{flush.batch_id}:%'").count() > 0


def test_the_diff_leaves_out_a_flush_outside_the_replay_that_shares_a_batch_id() -> None:
    """The live commits whose productions a replay's diff leaves out: outside the replayed range,
    with the batch id of a replayed commit (a flush before the start, the next micro-batch after
    the end), named by their commit ids."""
    from deltawheel.statestore.inspection.positions import ComputationCommit, outside_commit_ids

    def commit(version: int, batch: int | None, files: tuple[str, ...] | None, cid: str) -> ComputationCommit:
        return ComputationCommit(version=version, timestamp_ms=0, kind="commit", batch_id=batch, files=files,
                                 input_ms=None, late_ms=None, meta={"commit_id": cid})

    commits = [commit(1, 0, ("a",), "c:0:1"), commit(2, 1, (), "c:1:2"),  # a flush: id 1 ...
               commit(3, 1, ("b",), "c:1:3"),  # ... the query's next micro-batch: id 1 too
               commit(4, 2, ("c",), "c:2:4"), commit(5, 3, (), "c:3:5"), commit(6, 3, ("d",), "c:3:6"),
               commit(7, None, None, "claim")]
    assert outside_commit_ids(commits, 2) == {"c:1:2"}  # from the flush: its productions are before the start
    assert outside_commit_ids(commits, 1, to_version=2) == {"c:1:3"}  # up to the flush: the next batch is after
    assert outside_commit_ids(commits, 1, to_version=5) == {"c:3:6"}
    assert outside_commit_ids(commits, None) == frozenset()  # the whole run: nothing outside
    assert outside_commit_ids(commits, 3) == frozenset()
