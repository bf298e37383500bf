"""Replay of a computation whose job instances share its intervals (docs/replay.md, "Instances
sharing intervals"): two instances each own half of the intervals and commit their own batches;
the replay runs every live commit in version order, each with its own batch's files and over the
intervals its instance held, so a replay of unchanged code gives an empty diff (state, timers,
pending productions, productions) and changed code the expected one. Real Spark, ZooKeeper and
Delta (slow); intervals moved between instances (one instance, then two reading the input from
the start) replay with the records their live batches skipped dropped again: an empty diff. The
fast tests check which intervals each replayed batch runs, the lateness marks a seed carries and
the skip sets on commit records, and the skip on real Parquet files.

Instances are pipeline runners with their own instance name and intervals, run one after the
other in this process on the shared Spark session (as in tests/test_rescale.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
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

from deltawheel.cli import main

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]

NAME = "shared_count"


class SharedCount(Computation):
    """Counts every record of its key and produces the running count at the record's time, and
    whether the record was late. Without record-id dedup: a record replayed twice, or never,
    changes the state and the productions; a record judged late by another mark than the live
    instance's changes its production."""

    name = NAME
    inputs = {"events": RECORD_KEY}
    outputs = ("counts",)
    num_intervals = 4
    exactly_once = False

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("counts", {"k": ctx.key, "n": ctx.state, "late": record.late})


def write_late_file(folder: Path, n: int) -> dict[str, int]:
    """Input file ``n`` as :func:`write_file` writes it, but with event times before file 0's: every
    record is behind the watermark the batches before it acted on (late, yet processed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    counts = write_file(folder, n)
    keys = [k for k, c in sorted(counts.items()) for _ in range(c)]
    path = folder / f"part-{n:05d}.parquet"
    stamp = path.stat().st_mtime
    tmp = folder / f".late-{n:05d}.parquet"
    pq.write_table(pa.table({"key": keys, "t": pa.array([900_000 + i for i in range(len(keys))], pa.int64())}), tmp)
    tmp.replace(path)
    os.utime(path, (stamp, stamp))  # the same place in the file source's order
    return counts


def _late_productions(spark: Any, layout: StoreLayout, *, after: int = 0) -> int:
    """How many productions of a late record there are, of counts above ``after``."""
    from executor_util import stream_rows

    return sum(1 for r in stream_rows(spark, layout, "counts") if json.loads(r[2])["late"]
               and json.loads(r[2])["n"] > after)


def injector(folder: Path) -> ParquetInjector:
    return ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                           watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)


def _live_commits(spark: Any, layout: StoreLayout) -> list[Any]:
    from deltawheel.statestore.inspection.positions import computation_commits

    return [c for c in computation_commits(spark, layout, NAME) if c.kind != "claim"]


class _SharingRun:
    """A live run of the sharing pipeline: its input folder, store and ZooKeeper chroot, and the
    count per key of every file added."""

    def __init__(self, spark: Any, zk_server: Any, base: Path) -> None:
        import uuid

        self.spark, self.folder, self.layout = spark, base / "in", StoreLayout(str(base / "store"))
        self.zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/{base.name}-{uuid.uuid4().hex[:8]}")
        self.expected: dict[str, int] = {}

    def add(self, n: int, *, late: bool = False) -> None:
        for k, c in (write_late_file if late else write_file)(self.folder, n).items():
            self.expected[k] = self.expected.get(k, 0) + c

    def run(self, instance: str, intervals: list[int]) -> None:
        PipelineRunner(self.spark, self.layout, Pipeline("sharing", (injector(self.folder),), (SharedCount(),)),
                       zk=self.zk, wait_s=20, instance=instance, intervals=intervals, warm_workers=False).run()


@pytest.fixture(scope="module")
def shared(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(folder, layout, ZkConfig, expected counts, the rows version after the first round): instance
    ``a`` owns intervals 0 and 1, ``b`` owns 2 and 3; each runs over files 0-1, then over 2-3
    (file 2 late)."""
    live = _SharingRun(spark, zk_server, tmp_path_factory.mktemp("shared"))
    for n in (0, 1):
        live.add(n)
    live.run("a", [0, 1])
    live.run("b", [2, 3])
    middle = _live_commits(spark, live.layout)[-1].version
    # file 2 is late: each instance judges it against the mark of its own last batch of the
    # first round (a replay from the middle must seed both instances' marks)
    live.add(2, late=True)
    live.add(3)
    live.run("a", [0, 1])
    live.run("b", [2, 3])
    return live.folder, live.layout, live.zk, live.expected, middle



def _replay(spark: Any, folder: Path, layout: StoreLayout, zk: ZkConfig, into: Path, *,
            code: Computation | None = None, progress: Any = None, **start: Any) -> Any:
    from deltawheel.executor.drivers.replay import plan_replay, replay, shadow_chroot

    into_layout = StoreLayout(str(into))
    plan = plan_replay(spark, store=layout, into=into_layout, pipeline="sharing", computation=NAME, **start)
    return replay(spark, plan, code=code or SharedCount(), injectors=(injector(folder),), progress=progress,
                  zk=ZkConfig(hosts=zk.hosts, chroot=shadow_chroot(zk.chroot, into_layout)))


def _files_read(spark: Any, layout: StoreLayout, *, after: int | None = None) -> list[tuple[tuple[str, ...], Any]]:
    """The input files and the held intervals of each commit of a batch with input, in version
    order (after ``after``)."""
    return [(tuple(c.files), c.meta["late"]["intervals"]) for c in _live_commits(spark, layout)
            if c.files and (after is None or c.version > after)]


def _pending(spark: Any, layout: StoreLayout) -> dict[str, int]:
    """key -> number of pending (checkpointed, not yet cleared) productions of its row."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(layout.rows_of(NAME)).where(
        (F.col("computation") == NAME) & ~F.col("key").startswith("\x00"))
    return {r["key"]: len(r["pending"] or []) for r in df.collect() if r["pending"]}


@pytest.mark.slow  # four instance runs, then a replay (about 2-3 min)
@pytest.mark.timeout(1500)
def test_replay_of_instances_sharing_intervals_from_the_start_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    folder, layout, zk, expected, _ = shared
    # the live run is exact, and both instances committed batches of their own intervals
    assert {k: s for k, (s, _) in state_of(spark, layout, NAME).items()} == expected
    live = _live_commits(spark, layout)
    ran = [f for c in live for f in c.files or ()]
    assert sorted(set(ran)) == [f"part-{n:05d}.parquet" for n in range(4)]
    assert len(ran) == 2 * 4  # each file run by each instance's batch: two commits name it
    # instance a left checkpointed productions of its intervals that b's commits did not clear
    live_pending = _pending(spark, layout)
    assert live_pending
    late = _late_productions(spark, layout)
    assert late >= 3 * len(expected)  # file 2's records at least, in both instances
    lines: list[str] = []
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_start=True, progress=lines.append)
    shadow = StoreLayout(str(tmp_path / "shadow"))
    d = result.diff
    assert d is not None and d.empty, d.to_json()
    # the commits came from a, b, a, b: the replay started an executor per interval set, not per turn
    # (a start per turn made a promote's catch-up slower than instances committing in turn)
    assert sum(f"{NAME}: started in" in ln for ln in lines) == 2, [ln for ln in lines if "started" in ln]
    # the replay ran the live commits in version order, each with its own files and intervals
    assert _files_read(spark, shadow) == _files_read(spark, layout)
    assert {k: s for k, (s, _) in state_of(spark, shadow, NAME).items()} == expected
    assert _pending(spark, shadow) == live_pending
    assert _late_productions(spark, shadow) == late
    produced = spark.read.format("delta").load(shadow.stream("counts")).count()
    assert produced == sum(expected.values())  # one production per record, none twice


@pytest.mark.slow  # four instance runs, then a replay (about 2-3 min)
@pytest.mark.timeout(1500)
def test_replay_of_instances_sharing_intervals_from_the_middle_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    folder, layout, zk, expected, middle = shared
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_version=middle)
    later = [c for c in _live_commits(spark, layout) if c.version > middle]
    assert sorted({f for c in later for f in c.files or ()}) == ["part-00002.parquet", "part-00003.parquet"]
    shadow = StoreLayout(str(tmp_path / "shadow"))
    d = result.diff
    assert d is not None and d.empty, d.to_json()
    assert _files_read(spark, shadow) == _files_read(spark, layout, after=middle)
    assert {k: s for k, (s, _) in state_of(spark, shadow, NAME).items()} == expected
    assert _pending(spark, shadow) == _pending(spark, layout)
    # the late records after the middle (file 2's at least) judged by each instance's own mark
    late = _late_productions(spark, layout, after=1 + 2)
    assert late >= 3 * len(expected)
    assert _late_productions(spark, shadow) == late


def _pending_as_of(spark: Any, layout: StoreLayout, version: int | None) -> dict[str, int]:
    """:func:`_pending` of the rows as of ``version`` (None: newest)."""
    from pyspark.sql import functions as F

    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(layout.rows_of(NAME)).where((F.col("computation") == NAME) & ~F.col("key").startswith("\x00"))
    return {r["key"]: len(r["pending"] or []) for r in df.collect() if r["pending"]}


def _before_b_next(spark: Any, layout: Any, middle: int) -> tuple[list[Any], int]:
    """The live commits after ``middle`` and the newest version before b's (intervals 2-3) next
    commit after it: a replay up to there holds none of b's intervals after the middle."""
    later = [c for c in _live_commits(spark, layout) if c.version > middle]
    b_next = min(c.version for c in later if c.meta.get("late", {}).get("intervals") == [2, 3])
    return later, max(c.version for c in later if c.version < b_next)


@pytest.mark.slow  # four instance runs, then two replays (about 3-4 min)
@pytest.mark.timeout(1500)
def test_replay_up_to_a_version_before_the_other_instances_next_commit_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    from deltawheel.statestore.rowtable.rows import interval_of

    folder, layout, zk, expected, middle = shared
    later, to = _before_b_next(spark, layout, middle)  # a's last commit before b's next one
    assert any(c.files for c in later if c.version <= to)
    # at that version, b's keys still hold the productions b's commit up to the middle checkpointed
    live_pending = _pending_as_of(spark, layout, to)
    assert any(interval_of(k, 4) in (2, 3) for k in live_pending), live_pending
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_version=middle, to_version=to)
    d = result.diff
    assert d is not None and d.empty, d.to_json()
    shadow = StoreLayout(str(tmp_path / "shadow"))
    # the shadow has a's replayed pending productions, none of b's (the seed left them out)
    assert _pending(spark, shadow) == {k: n for k, n in live_pending.items() if interval_of(k, 4) in (0, 1)}
    assert _files_read(spark, shadow) == [(tuple(c.files), c.meta["late"]["intervals"]) for c in later
                                          if c.files and c.version <= to]
    # --to-version at the start: nothing replayed, every interval's pending compared with the start's
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow-0", from_version=middle, to_version=middle)
    assert not result.reports
    d = result.diff
    assert d is not None and d.empty, d.to_json()
    # `deltawheel diff` of the live store against each shadow store: empty as the replay's own; the
    # two stores compared as they are (--plain) differ in b's pending productions the seed left out
    for name in ("shadow", "shadow-0"):
        argv = ["diff", "--store", str(layout.root), "--store", str(tmp_path / name), "--computation", NAME,
                "--diff-out", str(tmp_path / "d.json")]
        assert main(argv) == 0, (name, (tmp_path / "d.json").read_text())
        assert main([*argv, "--plain", "--as-of", str(to if name == "shadow" else middle)]) == 1
        assert json.loads((tmp_path / "d.json").read_text())["counts"]["pending"] > 0, name


@pytest.mark.slow  # four instance runs, then a replay (about 2-3 min)
@pytest.mark.timeout(1500)
def test_the_stand_alone_diff_of_a_replay_with_changed_code_is_the_replays_own(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    folder, layout, zk, expected, middle = shared
    _later, to = _before_b_next(spark, layout, middle)  # b's intervals: no replayed commit held them
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_version=middle, to_version=to,
                     code=SharedCountTwice())
    d = result.diff
    assert d is not None and d.counts["changed"] > 0 and d.counts["productions_changed"] > 0, d.to_json()
    out = tmp_path / "d.json"
    assert main(["diff", "--store", str(layout.root), "--store", str(tmp_path / "shadow"), "--computation", NAME,
                 "--diff-out", str(out)]) == 1
    got = json.loads(out.read_text())
    assert got["counts"] == d.counts and got["version_a"] == to
    assert got["samples"] == json.loads(d.to_json())["samples"]


class SharedCountTwice(SharedCount):
    """The changed code: every record counts twice."""

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 2
        ctx.produce("counts", {"k": ctx.key, "n": ctx.state, "late": record.late})


@pytest.mark.slow  # four instance runs, then a replay (about 2-3 min)
@pytest.mark.timeout(1500)
def test_replay_of_instances_sharing_intervals_with_changed_code_gives_the_expected_diff(  # type: ignore[no-untyped-def]
        spark, shared, tmp_path) -> None:
    folder, layout, zk, expected, middle = shared
    result = _replay(spark, folder, layout, zk, tmp_path / "shadow", from_version=middle, code=SharedCountTwice())
    d = result.diff
    assert d is not None
    # every key counted records after the middle (files 2 and 3: 3 and 4 records each)
    shadow = StoreLayout(str(tmp_path / "shadow"))
    at_middle = {k: n - 3 - 4 for k, n in expected.items()}
    assert {k: s for k, (s, _) in state_of(spark, shadow, NAME).items()} == \
        {k: at_middle[k] + 2 * (n - at_middle[k]) for k, n in expected.items()}
    assert d.counts["changed"] == len(expected), d.to_json()
    assert d.counts["added"] == d.counts["removed"] == 0
    # every production after the middle has another count; none is missing or extra
    assert d.counts["productions_changed"] == len(expected) * (3 + 4), d.to_json()
    assert d.counts["productions_only_a"] == d.counts["productions_only_b"] == 0


@pytest.fixture(scope="module")
def moved(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(folder, layout, ZkConfig, expected counts, the rows version of the first instance's last
    commit): instance ``solo`` holds every interval over files 0-1; then ``a`` (intervals 0, 1) and
    ``b`` (2, 3), new instances reading the input from the start, run over files 0-2: their
    batches over files 0 and 1 skip every record (solo processed them)."""
    live = _SharingRun(spark, zk_server, tmp_path_factory.mktemp("moved"))
    for n in (0, 1):
        live.add(n)
    live.run("solo", [0, 1, 2, 3])
    middle = _live_commits(spark, live.layout)[-1].version
    live.add(2)
    live.run("a", [0, 1])
    live.run("b", [2, 3])
    return live.folder, live.layout, live.zk, live.expected, middle


@pytest.mark.slow  # three instance runs, then two replays (about 3-4 min)
@pytest.mark.timeout(1500)
def test_replay_over_intervals_moved_between_instances_gives_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, moved, tmp_path) -> None:
    folder, layout, zk, expected, middle = moved
    # the live run is exact: a and b ran files 0 and 1 again and skipped every record of them (a
    # batch with nothing to commit, file 1's, makes no commit; file 0's clears solo's pending)
    assert {k: s for k, (s, _) in state_of(spark, layout, NAME).items()} == expected
    later = [c for c in _live_commits(spark, layout) if c.version > middle and c.files]
    assert {"part-00000.parquet", "part-00002.parquet"} <= {f for c in later for f in c.files}
    assert {tuple(c.meta["late"]["intervals"]) for c in later} == {(0, 1), (2, 3)}
    live_produced = spark.read.format("delta").load(layout.stream("counts")).count()
    assert live_produced == sum(expected.values())  # one production per record, none twice
    # the plan says which records of which files each batch drops, as its live run did
    from deltawheel.executor.drivers.replay import plan_replay

    text = plan_replay(spark, store=layout, into=StoreLayout(str(tmp_path / "plan")), pipeline="sharing",
                       computation=NAME, from_start=True).describe()
    for ivs in ([0, 1], [2, 3]):
        assert f"skips the records of intervals {ivs} in part-00000.parquet" in text, text
    assert "reads part-00002.parquet" in text and "in part-00002" not in text, text
    for name, start in (("from-start", {"from_start": True}), ("from-middle", {"from_version": middle})):
        result = _replay(spark, folder, layout, zk, tmp_path / name, **start)
        d = result.diff
        assert d is not None and d.empty, (name, d.to_json())
        shadow = StoreLayout(str(tmp_path / name))
        assert {k: s for k, (s, _) in state_of(spark, shadow, NAME).items()} == expected, name
        assert _pending(spark, shadow) == _pending(spark, layout), name
        produced = spark.read.format("delta").load(shadow.stream("counts")).count()
        # from the start: every record once; from the middle: file 2's records (three per key) once
        assert produced == (sum(expected.values()) if name == "from-start" else 3 * len(expected)), name


# ---------------------------------------------------------------- fast: on commit records

def _commit(version: int, intervals: list[int] | None, *, batch_id: int = 0, files: tuple[int, ...] = (0,),
            ran: bool = True) -> Any:
    """A batch commit's record; ``ran``: its positions name the intervals held (an instance with the
    skip rule on, ``inputfiles.ran_of``; not: a single instance's)."""
    from deltawheel.statestore.inspection.positions import ComputationCommit
    from deltawheel.statestore.rowtable.inputfiles import commit_entry

    names = tuple(f"part-{n:05d}.parquet" for n in files)
    meta: dict[str, Any] = {"computation": NAME, "kind": "batch", "batch_id": batch_id}
    if intervals is not None:
        meta["late"] = {"v": 1, "batch_id": batch_id, "late_ms": version, "input_ms": version,
                        "intervals": intervals, "injectors": {}}
        meta.update(commit_entry(batch_id, names, intervals=intervals if ran else None))
    return ComputationCommit(version=version, timestamp_ms=0, kind="batch", batch_id=batch_id, files=names,
                             input_ms=version, late_ms=version, meta=meta)


def test_each_replayed_batch_runs_over_the_intervals_its_instance_held() -> None:
    from deltawheel.executor.drivers.replay_shared import batch_intervals

    a, b, alone = _commit(3, [0, 1]), _commit(4, [2, 3]), _commit(5, [0, 1, 2, 3])
    assert batch_intervals(a, num_intervals=4) == (0, 1)
    assert batch_intervals(b, num_intervals=4) == (2, 3)
    assert batch_intervals(alone, num_intervals=4) is None  # one instance: every interval, as before
    # a partial replay of intervals 1 and 2: each batch within both
    assert batch_intervals(a, num_intervals=4, scope=(1, 2)) == (1,)
    assert batch_intervals(b, num_intervals=4, scope=(1, 2)) == (2,)
    assert batch_intervals(b, num_intervals=4, scope=(0, 1)) == ()  # not re-run
    assert batch_intervals(alone, num_intervals=4, scope=(2, 1)) == (1, 2)


def test_a_seed_carries_the_newest_lateness_mark_of_every_instance() -> None:
    from deltawheel.executor.drivers.replay_shared import seed_marks

    commits = [_commit(1, [0, 1]), _commit(2, [2, 3]), _commit(3, [0, 1]), _commit(4, [2, 3]), _commit(5, [0, 1])]
    # as of version 4: a's newest (3) and b's (4), oldest first (a reader takes the newest on its intervals)
    assert [m["late_ms"] for m in seed_marks(commits, 4)] == [3, 4]
    assert [m["late_ms"] for m in seed_marks(commits, 5)] == [4, 5]
    assert [m["late_ms"] for m in seed_marks([_commit(1, [0, 1, 2, 3]), _commit(2, [0, 1, 2, 3])], 2)] == [2]
    assert seed_marks(commits, 0) == []


def test_each_replayed_batch_skips_what_the_commits_before_it_ran_for_its_intervals() -> None:
    from deltawheel.executor.drivers.replay_shared import skip_sets

    f0, f1, f2, f3 = (f"part-{n:05d}.parquet" for n in range(4))
    # one instance held every interval over files 0 and 1, then two split them; each read the files
    # from the start: their batches over files 0 and 1 skipped what the first had processed
    commits = [_commit(1, [0, 1, 2, 3], files=(0,), batch_id=0), _commit(2, [0, 1, 2, 3], files=(1,), batch_id=1),
               _commit(3, [0, 1], files=(0,), batch_id=0), _commit(4, [0, 1], files=(1,), batch_id=1),
               _commit(5, [0, 1], files=(2,), batch_id=2), _commit(6, [2, 3], files=(0, 1), batch_id=0),
               _commit(7, [2, 3], files=(2,), batch_id=1), _commit(8, [0, 1], files=(3,), batch_id=3)]
    both = frozenset({f0, f1})
    sets = skip_sets(commits, commits[2:])
    assert sets[0] == {0: both, 1: both, 2: both, 3: both}  # version 3: file 0 skipped whole
    assert sets[2] == sets[0]  # version 5: file 2 not run before: nothing skipped
    assert sets[3] == {0: both | {f2}, 1: both | {f2}, 2: both, 3: both}  # version 6: files 0 and 1 skipped
    assert sets[4][2] == both  # version 7: file 2 ran for intervals 0 and 1 only: processed for 2 and 3
    assert sets[5] == {iv: both | {f2} for iv in range(4)}  # version 8: file 3 is new everywhere
    # the seeded commits count as well as the replayed ones: a replay from version 5 sees the same
    assert skip_sets(commits, commits[5:]) == sets[3:]
    # two instances from the start: nothing before their first batches
    assert skip_sets(commits[2:], commits[2:])[0] == {}
    # a batch Spark ran again after its commit (the same id and intervals): everything skipped, as live
    again = commits[:2] + [_commit(3, [0, 1, 2, 3], files=(1,), batch_id=1)]
    assert skip_sets(again, again)[2] == {iv: both for iv in range(4)}
    # a single instance (its commits name no intervals) never skips, nor do its commits count
    alone = [_commit(1, [0, 1, 2, 3], files=(0,), ran=False), _commit(2, [0, 1, 2, 3], files=(0,), ran=False)]
    assert skip_sets(alone, alone) == [None, None]
    assert skip_sets(alone + commits[2:3], commits[2:3]) == [{}]


def test_the_skip_drops_the_records_of_the_files_each_interval_ran_from_real_parquet_files(  # type: ignore[no-untyped-def]
        spark, tmp_path) -> None:
    from deltawheel.executor.protocol.rescale import shared_input
    from deltawheel.statestore.rowtable.rows import interval_of

    folder = tmp_path / "in"
    per = {n: write_file(folder, n) for n in (0, 1)}  # each key once in file 0, twice in file 1
    f0, f1 = "part-00000.parquet", "part-00001.parquet"
    inputs = shared_input(SharedCount(), {"events": injector(folder)}, table_of=lambda s: str(tmp_path / s),
                          checkpoint=str(tmp_path / "unused"))
    df = inputs.files_df(spark, [f0, f1])

    def kept(done: dict[int, frozenset[str]], intervals: list[int]) -> tuple[dict[str, int], int, list[str]]:
        inputs.done = done
        out, skipped = inputs.skip_frame(df, [f0, f1], intervals)
        rows = out.collect()
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["key"]] = counts.get(r["key"], 0) + 1
        return counts, int(skipped), out.columns  # counted by the collect above

    total = {k: per[0][k] + per[1][k] for k in per[0]}
    counts, skipped, columns = kept({0: frozenset({f0}), 2: frozenset({f0, f1}), 3: frozenset({"other"})}, [0, 1, 2, 3])
    assert columns == df.columns  # the position column is dropped again
    want = {k: n - (per[0][k] if interval_of(k, 4) == 0 else 0) - (n if interval_of(k, 4) == 2 else 0)
            for k, n in total.items()}
    assert counts == {k: n for k, n in want.items() if n}
    assert skipped == sum(total.values()) - sum(want.values()) > 0
    # only the intervals the batch held are skipped (the executor leaves the others' records out)
    counts, skipped, _ = kept({0: frozenset({f0}), 2: frozenset({f0, f1})}, [0, 1])
    assert skipped == sum(per[0][k] for k in total if interval_of(k, 4) == 0)
    assert counts == {k: n - (per[0][k] if interval_of(k, 4) == 0 else 0) for k, n in total.items()}
    # nothing run before: nothing dropped
    assert kept({}, [0, 1, 2, 3])[:2] == (total, 0)


def test_the_plan_says_which_intervals_each_batch_runs_over() -> None:
    from deltawheel.executor.drivers.replay import ReplayPlan

    def plan(*batches: Any) -> str:
        return ReplayPlan(store="live", into="shadow", pipeline="sharing", computation=NAME, from_version=None,
                          to_version=batches[-1].version, horizon=None, batches=tuple(batches), input_files=1,
                          input_bytes=None).describe()

    text = plan(_commit(3, [0, 1], batch_id=2), _commit(4, [2, 3], batch_id=2))
    assert "batch 2 (live version 3): 1 input files, input watermark 1970-01-01 00:00:00 UTC (3 ms), over " \
           "intervals [0, 1] (those its instance held)" in text
    assert "batch 2 (live version 4): 1 input files, input watermark 1970-01-01 00:00:00 UTC (4 ms), over " \
           "intervals [2, 3]" in text
    assert "over intervals" not in plan(_commit(3, [0, 1, 2, 3]), _commit(4, [0, 1, 2, 3]))  # one instance


def test_the_plan_shows_watermarks_as_times_and_the_end_of_time_as_such() -> None:
    """A bounded run's last batch has the input watermark at the end of time (Long.MaxValue): the plan
    says so instead of printing the number."""
    from deltawheel.executor.drivers.replay import ReplayPlan
    from deltawheel.executor.protocol.reports import describe_watermark
    from deltawheel.statestore.zk.watermarks import END_OF_TIME

    last = dataclasses.replace(_commit(5, [0, 1, 2, 3], batch_id=3), input_ms=END_OF_TIME)
    text = ReplayPlan(store="live", into="shadow", pipeline="sharing", computation=NAME, from_version=None,
                      to_version=5, horizon=None, batches=(last,), input_files=1, input_bytes=None).describe()
    assert "batch 3 (live version 5): 1 input files, input watermark end of time" in text
    assert str(END_OF_TIME) not in text
    assert describe_watermark(1_735_689_696_647) == "2025-01-01 00:01:36 UTC (1735689696647 ms)"
    assert describe_watermark(None) == "unknown" and describe_watermark(0) == "unknown (0 ms)"


def test_the_plan_says_which_files_each_batch_reads_and_which_records_it_skips() -> None:
    from deltawheel.executor.drivers.replay import ReplayPlan
    from deltawheel.executor.drivers.replay_shared import skip_sets, skipped_files

    f0, f1, f2 = (f"part-{n:05d}.parquet" for n in range(3))
    # one instance held every interval over files 0 and 1; then a (0, 1) and b (2, 3) read the
    # input from the start: their batches over files 0 and 1 skip what the first had processed
    commits = [_commit(1, [0, 1, 2, 3], files=(0,), batch_id=0), _commit(2, [0, 1, 2, 3], files=(1,), batch_id=1),
               _commit(3, [0, 1], files=(0, 1, 2), batch_id=0), _commit(4, [2, 3], files=(0, 1, 2, 3, 4), batch_id=0)]

    def plan(batches: list[Any], scope: tuple[int, ...] | None = None) -> str:
        skips = tuple(skipped_files(c, done, scope=scope) for c, done in
                      zip(batches, skip_sets(commits, batches), strict=True))
        return ReplayPlan(store="live", into="shadow", pipeline="sharing", computation=NAME, from_version=2,
                          to_version=batches[-1].version, horizon=None, batches=tuple(batches), input_files=5,
                          input_bytes=None, intervals=scope, skips=skips).describe()

    text = plan(commits[2:])
    assert f"batch 0 (live version 3): 3 input files, input watermark 1970-01-01 00:00:00 UTC (3 ms), over " \
           f"intervals [0, 1] (those its instance held)\n    reads {f0}, {f1}, {f2}\n    skips the records of intervals [0, 1] in {f0}, {f1}: " \
           "earlier commits processed them for those intervals (the live batch skipped them too)\n" in text
    # many files: the first few named, the rest counted; file 2 ran for a's intervals only
    assert f"    reads 5 files: {f0}, {f1}, {f2} and 2 more\n    skips the records of intervals [2, 3] in {f0}, {f1}: " \
        in text
    # a partial replay of interval 1: a's batch skips only its records, b's batch is not re-run
    text = plan(commits[2:], scope=(1,))
    assert f"skips the records of intervals [1] in {f0}, {f1}" in text
    assert "batch 0 (live version 4): not re-run: its instance held intervals [2, 3], none of the replay's" in text
    assert "intervals [2, 3] in" not in text
    # a single instance (its commits name no intervals) skips nothing
    alone = [_commit(5, [0, 1, 2, 3], files=(0,), ran=False)]
    assert "skips" not in plan(alone) and f"reads {f0}" in plan(alone)


def test_the_stand_alone_diff_of_a_replay_compares_as_the_replay_does(spark, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel diff --store LIVE --store SHADOW`` of a replay's shadow store (its marker names
    the live store): the pending productions of the intervals no replayed commit held are compared
    with the live ones at the start, as the replay's own diff does; a changed state still shows."""
    from deltawheel.executor.drivers.replay_marker import MARKER
    from deltawheel.statestore.rowtable.rows import interval_of

    keys = [f"k{i}" for i in range(40)]
    mine = next(k for k in keys if interval_of(k, 4) in (0, 1))  # instance a's, replayed
    other = next(k for k in keys if interval_of(k, 4) in (2, 3))  # instance b's: no commit after the start
    live, shadow = tmp_path / "live", tmp_path / "shadow"
    # live version 0: b's batch (both keys hold checkpointed productions); version 1: a's batch
    _write_rows(spark, StoreLayout(str(live)), {mine: (1, ["p1"]), other: (1, ["p2"])},
                meta={**_commit(0, [2, 3], batch_id=0).meta, "commit_id": f"{NAME}:0:b"})
    _write_rows(spark, StoreLayout(str(live)), {mine: (2, ["p3"]), other: (1, ["p2"])},
                meta={**_commit(1, [0, 1], batch_id=1).meta, "commit_id": f"{NAME}:1:a"})
    # the replay from version 0 to 1: the seed left every pending production out, a's batch re-ran
    _write_rows(spark, StoreLayout(str(shadow)), {mine: (2, ["p3"]), other: (1, [])})
    marker = {"store": os.path.realpath(live), "pipeline": "sharing", "computation": NAME, "from_version": 0,
              "reached": 1, "intervals": None, "keys": None, "num_intervals": 4, "outputs": ["counts"]}
    (shadow / MARKER).write_text(json.dumps(marker))
    out = tmp_path / "d.json"
    argv = ["diff", "--store", str(live), "--store", str(shadow), "--computation", NAME, "--diff-out", str(out)]
    rc = main(argv)
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "store B is a replay from rows version 0 up to rows version 1 of store A" in text
    assert json.loads(out.read_text())["version_a"] == 1
    # the stores as they are: b's key lacks the pending productions the seed left out
    assert main([*argv, "--plain"]) == 1
    assert json.loads(out.read_text())["counts"]["pending"] == 1
    # the shadow store first: compared as they are, saying which order compares as the replay does
    assert main(["diff", "--store", str(shadow), "--store", str(live), "--computation", NAME]) == 1
    assert "store A is a replay of store B: compared as they are (give the live store first" in capsys.readouterr().out
    # another version than the one the replay reached: refused, saying what to give
    assert main([*argv, "--as-of", "0"]) == 3
    assert "compares A as of that version; leave --as-of out (or give --as-of 1)" in capsys.readouterr().err
    # a changed computation still shows: a's key's state, and b's key's pending when the replay wrote one
    _write_rows(spark, StoreLayout(str(shadow)), {mine: (3, ["p3"]), other: (1, ["p9"])})
    assert main(argv) == 1
    counts = json.loads(out.read_text())["counts"]
    assert counts["changed"] == 1 and counts["pending"] == 1, counts
    # a marker of an older deltawheel (no intervals nor outputs): the plain comparison, with a note
    (shadow / MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k not in ("num_intervals", "outputs")}))
    _write_rows(spark, StoreLayout(str(shadow)), {mine: (2, ["p3"]), other: (1, [])})
    assert main(argv) == 1
    assert "its marker (_replay.json, an older deltawheel's) does not record" in capsys.readouterr().out


def test_the_intervals_no_replayed_batch_held_are_those_whose_pending_the_seed_left_out() -> None:
    from deltawheel.executor.drivers.replay_shared import unheld_intervals

    a, b, alone = _commit(3, [0, 1]), _commit(4, [2, 3]), _commit(5, [0, 1, 2, 3])
    assert unheld_intervals([a], num_intervals=4) == (2, 3)  # b makes no commit in the range
    assert unheld_intervals([a, b], num_intervals=4) == ()
    assert unheld_intervals([], num_intervals=4) == (0, 1, 2, 3)  # --to-version = the start
    assert unheld_intervals([alone], num_intervals=4) == ()
    assert unheld_intervals([b], num_intervals=4, scope=(1, 2)) == (1,)


def _write_rows(spark: Any, layout: StoreLayout, rows: dict[str, tuple[int, list[str]]],
                meta: dict[str, Any] | None = None) -> None:
    """A rows table version of ``NAME``: key -> (state, the production ids of its pending list);
    ``meta``: its commit's metadata (a batch commit's: :func:`_commit`)."""
    from deltawheel.statestore.rowtable.rows import interval_of, rows_schema_ddl

    data = [(NAME, interval_of(k, 4), k, json.dumps(n).encode(), "json", [], None, None, [],
             [(p, "counts", k, b"1", 0, "json") for p in pending], None, 0, None, 0, 1, 0)
            for k, (n, pending) in sorted(rows.items())]
    writer = spark.createDataFrame(data, rows_schema_ddl()).write.format("delta").mode("overwrite")
    if meta is not None:
        writer = writer.option("userMetadata", json.dumps(meta))
    writer.save(layout.rows_of(NAME))


def test_a_replay_diff_compares_the_pending_of_intervals_no_replayed_commit_held_with_the_live_at_the_seed(  # type: ignore[no-untyped-def]
        spark, tmp_path) -> None:
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.inspection.diff import diff_stores
    from deltawheel.statestore.rowtable.rows import interval_of

    keys = [f"k{i}" for i in range(40)]
    mine = next(k for k in keys if interval_of(k, 4) in (0, 1))  # instance a's, replayed
    other = next(k for k in keys if interval_of(k, 4) in (2, 3))  # instance b's: no commit after the seed
    live, shadow = StoreLayout(str(tmp_path / "live")), StoreLayout(str(tmp_path / "shadow"))
    # live version 0 (the seed version): both keys hold checkpointed productions; version 1: a's
    # commit cleared its key's and checkpointed a new one, b's key is as it was
    _write_rows(spark, live, {mine: (1, ["p1"]), other: (1, ["p2"])})
    _write_rows(spark, live, {mine: (2, ["p3"]), other: (1, ["p2"])})
    # the replay: the seed left every pending production out; a's batch re-ran, b's intervals not
    _write_rows(spark, shadow, {mine: (2, ["p3"]), other: (1, [])})

    def diff(**seed: Any) -> Any:
        return diff_stores(spark, live, shadow, NAME, version_a=1, **seed)

    assert diff().counts["pending"] == 1  # without the seed's pending: b's key differs
    d = diff(seed_version=0, seed_intervals=(2, 3))
    assert d.empty, d.to_json()
    # still able to fail: a live commit after the seed that changed b's key's pending ...
    _write_rows(spark, live, {mine: (2, ["p3"]), other: (1, ["p4"])})
    d = diff_stores(spark, live, shadow, NAME, version_a=2, seed_version=0, seed_intervals=(2, 3))
    assert d.counts["pending"] == 1 and d.samples["pending"][0]["key"] == other, d.to_json()
    # ... or a shadow that wrote pending productions of its own into those intervals
    _write_rows(spark, shadow, {mine: (2, ["p3"]), other: (1, ["p5"])})
    assert diff(seed_version=0, seed_intervals=(2, 3)).counts["pending"] == 1
    # the replayed intervals are compared as they are: a's key without its pending differs
    _write_rows(spark, shadow, {mine: (2, []), other: (1, [])})
    d = diff(seed_version=0, seed_intervals=(2, 3))
    assert d.counts["pending"] == 1 and d.samples["pending"][0]["key"] == mine, d.to_json()
    with pytest.raises(ConfigError, match=r"seed_intervals need the version B was seeded from"):
        diff(seed_intervals=(2, 3))
