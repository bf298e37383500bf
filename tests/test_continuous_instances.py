"""Several instances of one continuous pipeline share its intervals (``drivers/sharing.py``).

Real Spark, ZooKeeper and Delta. The default test runs two instances in this process (two
engines, two runs, one Spark application: the fastest way to two live members); the slow one
runs ``deltawheel run --instance`` in child processes, SIGKILLs one mid-flow and restarts it under
its name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from continuous_pipeline import click_rows, closing_rows, expected, make, outputs, write_file
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.log import commit_infos, user_metadata
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect as connect_zk
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.members import live_members
from deltawheel.statestore.zk.turns import turns_path
from test_continuous import Child, run_cmd, wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]

COMPUTATIONS = ("user_minutes", "minute_totals")


def holders(zk: ZkConfig, pipeline: str) -> dict[str, list[str | None]]:
    """Per computation, the instance holding each interval (None: free)."""
    client = connect_zk(zk)
    try:
        out: dict[str, list[str | None]] = {c: [None] * 4 for c in COMPUTATIONS}
        for r in list_leases(client, pipeline=pipeline):
            if r["computation"] in out:
                out[r["computation"]][r["interval"]] = r["instance"] if r["owner"] is not None else None
        return out
    finally:
        client.stop()
        client.close()


def members(zk: ZkConfig, pipeline: str) -> list[str]:
    client = connect_zk(zk)
    try:
        return live_members(client, pipeline)
    finally:
        client.stop()
        client.close()


SPLIT = {c: ["a", "a", "b", "b"] for c in COMPUTATIONS}


@pytest.mark.timeout(900)
def _waiting_for_another(turns: Any) -> Any:
    """``turns`` (a ``CommitTurns.turn``) whose holder, at its first turn of each table, waits up to 10 s
    for another writer to queue behind it."""
    owner, first = turns.__self__, set()

    @contextlib.contextmanager
    def turn(computation: str, request: bytes | None = None) -> Iterator[Any]:
        with turns(computation, request) as t:
            if t and computation not in first:
                first.add(computation)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and len(owner.client.get_children(
                        turns_path(owner.pipeline, computation))) < 2:
                    time.sleep(0.02)
            yield t
    return turn


def _kinds(spark: Any, layout: StoreLayout, computation: str) -> list[str]:
    """The kind of each version of ``computation``'s rows table, oldest first."""
    files = table_files(spark, layout.rows_of(computation))
    assert files is not None
    return [str((user_metadata(i.get("userMetadata")) or {}).get("kind")) for _v, i in commit_infos(files, after=-1) or []]


def test_two_instances_of_a_continuous_pipeline_split_its_intervals_and_give_every_row_once(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """Instance ``a`` starts alone and takes every interval; ``b`` joins while it runs: ``a`` gives
    back ``b``'s share between batches and ``b`` takes it (catching up on what its query read
    meanwhile). Files arrive while both run (closing records in every interval: each instance's
    estimate of the injector's watermark comes from the records of its intervals); each stage's
    rows are exactly the count made here, each once, and every interval is held by one live
    instance, as the members' split says."""
    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    write_file(folder, "part-0.parquet", rows[:40])
    # a Pipeline each: an injector's watermark estimate is its instance's own (what it read)
    pipelines = {name: make(str(folder)) for name in "ab"}
    lines: dict[str, list[str]] = {"a": [], "b": []}

    def engine(instance: str) -> Any:
        e = deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                               pipeline="clicks", instance=instance, wait_s=30)
        e.progress = lines[instance].append
        return e

    with engine("a") as ea, engine("b") as eb:
        with pytest.raises(ConfigError, match=r"start_pipeline: instance 'b' on an engine connected as instance "
                                              r"'a': .*connect with deltawheel.connect\(\.\.\., instance='b'\)"):
            ea.start_pipeline(pipelines["a"], instance="b")
        run_a = ea.start_pipeline(pipelines["a"], trigger="200 milliseconds")
        assert holders(zk_config, "clicks") == {c: ["a"] * 4 for c in COMPUTATIONS}
        wait_for("a read the first file", lambda: run_a.executors["user_minutes"].records_in_total > 0,
                 runs=(run_a,))
        run_b = eb.start_pipeline(pipelines["b"], trigger="200 milliseconds")
        assert members(zk_config, "clicks") == ["a", "b"]
        wait_for("the intervals split between a and b", lambda: holders(zk_config, "clicks") == SPLIT,
                 runs=(run_a, run_b), timeout_s=180)
        # each instance's first turn at a table from here waits for the other to queue behind it: the
        # holder then commits both batches in one version (group commit, ``delta/group.py``)
        ea.store.turns, eb.store.turns = _waiting_for_another(ea.store.turns), _waiting_for_another(eb.store.turns)
        write_file(folder, "part-1.parquet", rows[40:] + closing_rows(rows))  # arrives while both run
        layout = StoreLayout(str(store))
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
                 runs=(run_a, run_b), timeout_s=300)
        time.sleep(2.0)  # a duplicate would land by now
        assert outputs(spark, layout) == (want_users, want_totals)
        assert "group" in _kinds(spark, layout, "user_minutes")  # both instances' batches in one version
        reader = RowStore(spark, layout, writer="reader")  # every interval's rows in the table, fence and all
        assert {c: sorted(reader.fences(c)) for c in COMPUTATIONS} == {c: [0, 1, 2, 3] for c in COMPUTATIONS}
        assert holders(zk_config, "clicks") == SPLIT
        for name, run in (("a", run_a), ("b", run_b)):
            assert sorted(run.queries) == sorted(COMPUTATIONS)
            assert {c: list(ex.owner.intervals) for c, ex in run.executors.items()} == \
                {c: [0, 1] if name == "a" else [2, 3] for c in COMPUTATIONS}
        assert any("instance a moved from intervals [0, 1, 2, 3] to [0, 1]" in ln for ln in lines["a"]), lines["a"]
        run_b.stop()
        run_a.stop()
        assert members(zk_config, "clicks") == []
        assert holders(zk_config, "clicks") == {c: [None] * 4 for c in COMPUTATIONS}
    assert os.path.isdir(store / "_checkpoints" / "clicks" / "user_minutes" / "b")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_instances_of_deltawheel_run_one_killed_and_restarted_under_its_name(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path) -> None:
    """``deltawheel run --instance a`` and ``--instance b`` in child processes (session timeout
    6 s). ``b`` is SIGKILLed mid-flow: ``a`` takes its intervals after the session timeout plus
    a batch; more files arrive; ``b`` restarted under its name takes its share back at once. Both
    streams end with exactly the rows of an uninterrupted run (counted here), each once."""
    rows = click_rows(240)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:60])
    env = {**os.environ, "CLICKS_INPUT": str(folder),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    zk = ZkConfig(hosts=zk_config.hosts, chroot=zk_config.chroot)
    a = Child(run_cmd(store, zk_config, "--instance", "a"), env)
    b = Child(run_cmd(store, zk_config, "--instance", "b"), env)
    procs = [a, b]
    try:
        wait_for("both run and split the intervals", lambda: a.saw("running") and b.saw("running")
                 and holders(zk, "clicks") == SPLIT, timeout_s=600)
        write_file(folder, "part-1.parquet", rows[60:120])
        wait_for("b committed a batch of the second file", lambda: b.saw(r"user_minutes batch [1-9]"), timeout_s=300)
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait(timeout=60)
        killed = time.monotonic()
        wait_for("a took b's intervals", lambda: holders(zk, "clicks") == {c: ["a"] * 4 for c in COMPUTATIONS},
                 timeout_s=300)
        takeover_s = time.monotonic() - killed
        write_file(folder, "part-2.parquet", rows[120:180])
        restarted = Child(run_cmd(store, zk_config, "--instance", "b"), env)
        procs.append(restarted)
        wait_for("the restarted b took its share back", lambda: restarted.saw("running")
                 and holders(zk, "clicks") == SPLIT, timeout_s=600)
        write_file(folder, "part-3.parquet", rows[180:] + closing_rows(rows))
        layout = StoreLayout(str(store))
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
                 timeout_s=600)
        time.sleep(3.0)
        assert outputs(spark, layout) == (want_users, want_totals)
        for child in (a, restarted):
            os.killpg(child.proc.pid, signal.SIGTERM)
        for child in (a, restarted):
            assert child.proc.wait(timeout=180) == 0, "\n".join(child.lines[-40:])
        assert holders(zk, "clicks") == {c: [None] * 4 for c in COMPUTATIONS}
        print(f"\nb's intervals taken by a {takeover_s:.1f}s after the SIGKILL (session timeout 6 s)")
    finally:
        for child in procs:
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(timeout=60)

