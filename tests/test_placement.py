"""Placement of a computation's intervals on the image path's tasks (``images.place_intervals``)."""

from __future__ import annotations

import random

import pytest
from deltawheel.executor.tasks.image.job import place_intervals, spark_partition_of_int


def _loads(place: tuple[tuple[int, int], ...], work: dict[int, float], tasks: int) -> list[float]:
    out = [0.0] * tasks
    for iv, t in place:
        out[t] += work.get(iv, 0.0)
    return out


def test_round_robin_until_work_is_measured() -> None:
    assert place_intervals([3, 1, 0, 2], {}, 2) == ((0, 0), (1, 1), (2, 0), (3, 1))
    assert place_intervals([0, 1, 2], {}, 4) == ((0, 0), (1, 1), (2, 2))


def test_the_benchmark_split_is_balanced() -> None:
    # round-robin puts the hot key's interval 0 with 2: 56.7 % of the work on one task
    work = {0: 34.0, 1: 21.6, 2: 22.7, 3: 21.7}
    rr = place_intervals(work, {}, 2)
    place = place_intervals(work, work, 2)
    assert max(_loads(place, work, 2)) < max(_loads(rr, work, 2))
    assert max(_loads(place, work, 2)) == pytest.approx(55.6)


@pytest.mark.parametrize("seed", range(20))
def test_every_interval_runs_in_exactly_one_task_and_no_task_is_worse_than_lpt(seed: int) -> None:
    rng = random.Random(seed)
    ivs = rng.sample(range(64), rng.randint(1, 12))
    tasks = rng.randint(1, 5)
    work = {iv: rng.choice([0.0, rng.uniform(0, 100)]) for iv in ivs}
    place = place_intervals(ivs, work, tasks)
    assert [iv for iv, _t in place] == sorted(ivs)
    assert all(0 <= t < tasks for _iv, t in place)
    if any(work.values()):  # LPT bound: at most 4/3 of the optimum, never above the mean + the largest item
        assert max(_loads(place, work, tasks)) <= sum(work.values()) / tasks + max(work.values()) + 1e-9


def test_a_placement_is_kept_unless_the_new_one_is_clearly_better() -> None:
    work = {0: 30.0, 1: 25.0, 2: 25.0, 3: 20.0}
    first = place_intervals(work, work, 2)
    shifted = {0: 29.0, 1: 26.0, 2: 25.0, 3: 20.0}  # a slightly different batch: no change
    assert place_intervals(shifted, shifted, 2, first) == first
    skewed = {0: 5.0, 1: 60.0, 2: 25.0, 3: 10.0}  # the load moved: placed anew
    again = place_intervals(skewed, skewed, 2, first)
    assert again != first
    assert max(_loads(again, skewed, 2)) < 0.95 * max(_loads(first, skewed, 2))
    # a placement for other intervals or more tasks than there are now is never kept
    assert place_intervals([0, 1], {0: 1.0, 1: 1.0}, 2, first) == ((0, 0), (1, 1))
    assert all(t < 1 for _iv, t in place_intervals(work, work, 1, first))


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 7])
def test_the_routing_values_hash_where_spark_sends_them(spark, partitions: int) -> None:  # type: ignore[no-untyped-def]
    # the image plan routes each interval through a value that Spark's repartition sends to its
    # task; those values are computed in Python (no Spark job), so they must match Spark's placement
    from pyspark.sql import functions as F

    df = (spark.range(-40, 90).selectExpr("cast(id as int) AS v").repartition(partitions, F.col("v"))
          .withColumn("task", F.spark_partition_id()))
    got = {r["v"]: r["task"] for r in df.collect()}
    assert len(got) == 130
    assert {v: spark_partition_of_int(v, partitions) for v in got} == got
