"""The skip rule's count of records an earlier owner processed (``rescale.SkipCount``): the batch's
own job observes it; a job of its own counts only when nothing ran the frame."""

from __future__ import annotations

import random

import pytest
from deltawheel.executor.protocol.rescale import SkipCount

pytestmark = pytest.mark.spark

@pytest.mark.parametrize("seed", [3, 4])
def test_the_count_comes_from_the_job_that_runs_the_kept_frame(spark, seed: int) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    rng = random.Random(seed)
    rows = [(i, rng.randrange(5)) for i in range(rng.randrange(50, 400))]
    df = spark.createDataFrame(rows, "id long, part int").repartition(3)
    done = set(rng.sample(range(5), 2))
    count = SkipCount(df, F.col("part").isin(sorted(done)))
    kept = sorted(r["id"] for r in count.kept.collect())  # the batch's job
    assert kept == sorted(i for i, p in rows if p not in done)
    spark.sparkContext.setJobGroup("after", "after")
    try:
        n = int(count)
        ran_after = spark.sparkContext.statusTracker().getJobIdsForGroup("after")
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert n == sum(p in done for _i, p in rows)
    assert not ran_after  # no job of its own

def test_a_frame_no_job_ran_is_counted_by_a_job_of_its_own(spark) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i, i % 3) for i in range(30)], "id long, part int")
    count = SkipCount(df, F.col("part") == 0)
    count.WAIT_S = 0.2
    assert int(count) == 10 and int(count) == 10
    assert int(SkipCount.none()) == 0 and SkipCount.none().kept is None
