"""Image tasks that claim the intervals their Python worker holds (executor/tasks/image/task.py).

The board is a real folder raced by real processes, and by the tasks of real Spark jobs
(local mode, the shared session): every interval is run exactly once, a task takes what its
worker holds first, a retried task runs its partition's earlier claims, and the driver refuses
a job whose summaries miss an interval or name one twice.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

import pytest
from deltawheel.executor.tasks.image.task import ClaimBoard, claim_board, claimed_intervals, drop_board
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _race(folder: str, intervals: tuple[int, ...], task: int, out: Any) -> None:
    board = ClaimBoard(folder, intervals)
    got = []
    for iv in claimed_intervals(board, task, (), lambda iv: iv % 3 == task):
        got.append(iv)
        time.sleep(0.001 * (iv % 4))
    out.put((task, got))


def test_racing_processes_claim_every_interval_exactly_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Four processes drain one board of 200 intervals at once: each interval is claimed by one of
    them, none is left."""
    board = claim_board("local[4]", range(200), root=str(tmp_path))
    assert board is not None
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(board.folder, board.intervals, t, out)) for t in range(4)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    runs = sorted(iv for ivs in got.values() for iv in ivs)
    assert runs == list(range(200))
    assert sum(1 for ivs in got.values() if ivs) >= 2  # a race indeed: more than one process got some
    drop_board(board)
    assert not os.path.exists(board.folder)


def test_a_task_takes_what_its_worker_holds_then_its_plan_then_the_rest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    board = claim_board("local[2]", [0, 1, 2, 3, 4, 5], root=str(tmp_path))
    assert board is not None
    held = {4}
    seen = []
    for iv in claimed_intervals(board, 1, (3, 1), lambda iv: iv in held):
        seen.append(iv)
        held.add(0 if iv == 3 else -1)  # after running 3, the worker holds 0's image (asked again)
        if iv == 1:  # another task takes 2 meanwhile
            assert claimed_intervals(board, 0, (2,), lambda iv: False).__next__() == 2
    assert seen == [4, 3, 0, 1, 5]


def test_a_retried_task_first_runs_what_its_partition_claimed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    board = claim_board("local[2]", [0, 1, 2, 3], root=str(tmp_path))
    assert board is not None
    first = claimed_intervals(board, 1, (2, 3), lambda iv: False)
    assert next(first) == 2  # the first attempt claimed 2, then failed
    other = claimed_intervals(board, 0, (0, 1), lambda iv: False)
    assert next(other) == 0
    retry = list(claimed_intervals(board, 1, (2, 3), lambda iv: False))
    assert retry == [2, 3, 1]  # its own claim again, then the free ones
    assert list(other) == []  # nothing left for the other task


def test_no_board_where_the_tasks_may_run_on_other_machines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert claim_board("spark://host:7077", [0, 1], root=str(tmp_path)) is None
    assert claim_board("local-cluster[2,1,1024]", [0, 1], root=str(tmp_path)) is None
    assert claim_board("local[2]", [0], root=str(tmp_path)) is None
    assert claim_board("local[*]", [0, 1], root=str(tmp_path)) is not None


def _job_fn(board: ClaimBoard, planned: tuple[tuple[int, ...], ...], held_dir: str) -> Any:
    def fn(t: int, _rows: Any) -> Any:
        mine = os.path.join(held_dir, f"held-{os.getpid()}")  # what this Python worker ran before
        held = set(map(int, open(mine).read().split())) if os.path.exists(mine) else set()
        for iv in claimed_intervals(board, t, planned[t], lambda iv: iv in held):
            held.add(iv)
            with open(mine, "w") as f:
                f.write(" ".join(map(str, held)))
            time.sleep(1.0)  # the other task claims meanwhile, even if it started a bit later
            yield iv, os.getpid()
    return fn


@pytest.mark.spark
def test_in_a_spark_job_each_interval_goes_back_to_the_worker_that_ran_it(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three jobs of two tasks over four intervals, whose placements split the intervals
    differently each time: in the later jobs, each interval is run by the Python worker that ran
    it in the first (the placement alone would split them as it says, whichever worker got which
    task)."""
    sc = spark.sparkContext
    placements = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((3, 0), (1, 2))]
    ran = []
    for planned in placements:
        board = claim_board(sc.master, [0, 1, 2, 3], root=str(tmp_path))
        assert board is not None
        try:
            rows = sc.parallelize(range(2), 2).mapPartitionsWithIndex(_job_fn(board, planned, str(tmp_path))).collect()
        finally:
            drop_board(board)
        assert sorted(iv for iv, _pid in rows) == [0, 1, 2, 3]
        by_worker: dict[int, set[int]] = {}
        for iv, pid in rows:
            by_worker.setdefault(pid, set()).add(iv)
        ran.append(sorted(map(sorted, by_worker.values())))
    if len(ran[0]) < 2:
        pytest.skip("Spark ran both tasks of the first job in one Python worker")
    assert ran[0] == [[0, 1], [2, 3]]
    assert ran[1] == ran[0] and ran[2] == ran[0]


@pytest.mark.spark
def test_the_driver_refuses_a_job_that_ran_an_interval_twice_or_never(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the tasks of a claimed job return must name each interval once (two attempts of one
    partition at once could both claim); the board's folder is gone afterwards either way."""
    from deltawheel.executor.tasks.image.task import ClaimError, TaskJob, collect

    sc = spark.sparkContext
    for got, ok in (([0, 2, 1], True), ([0, 1, 1, 2], False), ([0, 2], False)):
        board = claim_board(sc.master, [0, 1, 2], root=str(tmp_path))
        assert board is not None
        job = TaskJob(sc.parallelize([{"interval": iv} for iv in got] + [{"interval": None}], 2), board, (0, 1, 2))
        if ok:
            assert sorted(s.interval for s in collect(job).summaries if s.interval is not None) == [0, 1, 2]
        else:
            with pytest.raises(ClaimError, match=r"expected each of \[0, 1, 2\] once"):
                collect(job)
        assert not os.path.exists(board.folder)
