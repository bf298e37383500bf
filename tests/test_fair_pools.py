"""Live stages sharing one Spark application run their micro-batch jobs in FAIR pools of their own
(``executor/drivers/pools.py``): read back from Spark's own record of the jobs it ran."""

from __future__ import annotations

import time
from typing import Any

import pytest
from continuous_pipeline import click_rows, closing_row, make, write_file
from deltawheel.executor.drivers.pools import POOL_PROPERTY, SchedulerModeWarning, warn_unless_fair

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def seq(scala: Any) -> list[Any]:
    """A Scala ``Seq`` from Py4J as a list."""
    return [scala.apply(i) for i in range(scala.length())]


def pools_of_job_groups(spark: Any) -> dict[str, set[str]]:
    """Job group (a streaming query's run id) -> the scheduler pools of the stages its jobs ran,
    from the application's status store (the data the Spark UI shows)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    defaults = [getattr(store, f"stageList$default${i}")() for i in range(2, 6)]
    # a stage never submitted (SKIPPED: its shuffle output was there; PENDING: its job ended first, as
    # when a query stops) has no pool: the store says "default"
    pool = {int(s.stageId()): str(s.schedulingPool()) for s in seq(store.stageList(None, *defaults))
            if str(s.status()) not in ("SKIPPED", "PENDING")}
    out: dict[str, set[str]] = {}
    for job in seq(store.jobsList(None)):
        group = job.jobGroup()
        if group.isDefined():
            out.setdefault(str(group.get()), set()).update(pool[int(i)] for i in seq(job.stageIds()) if int(i) in pool)
    return out


@pytest.mark.timeout(600)
def test_each_live_stage_runs_its_jobs_in_a_fair_pool_of_its_own(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """A two-stage pipeline started with ``engine.start_pipeline``, run until the first stage's
    ``foreachBatch`` ran on the input and both queries' jobs are on Spark's record: every job each
    query ran is in one pool, named after the query, and no two stages share a pool; the thread
    that started them is left in the pool it was in."""
    assert str(spark.sparkContext._jsc.sc().getSchedulingMode()) == "FAIR"  # the sessions deltawheel builds
    rows = click_rows(60)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows + [closing_row(rows)])
    before = spark.sparkContext.getLocalProperty(POOL_PROPERTY)
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        run = engine.start_pipeline(make(str(folder)))
        queries = {name: (q.name, str(q.runId)) for name, q in run.queries.items()}
        deadline = time.monotonic() + 240
        # the status store hears of jobs through Spark's listener bus, a little after they ran
        while run.executors["user_minutes"].records_in_total == 0 or not all(
                run_id in pools_of_job_groups(spark) for _, run_id in queries.values()):
            run.check()
            assert time.monotonic() < deadline, "no batch of stage 1, or no job of a query, within 240 s"
            time.sleep(0.5)
        run.stop()
    assert spark.sparkContext.getLocalProperty(POOL_PROPERTY) == before
    seen = pools_of_job_groups(spark)
    pools = {name: seen.get(run_id, set()) for name, (_, run_id) in queries.items()}
    assert pools == {name: {query_name} for name, (query_name, _) in queries.items()}, pools
    assert len({query_name for query_name, _ in queries.values()}) == 2


@pytest.mark.parametrize(("fifo", "fair"), [("FIFO", "FAIR"), ("fifo", "fair")])
def test_several_live_stages_on_a_fifo_scheduler_are_warned_of(fifo: str, fair: str) -> None:
    """Spark reads the mode in any case; two or more stages not under FAIR are warned of, once."""
    lines: list[str] = []
    with pytest.warns(SchedulerModeWarning, match=r"3 live stages share this Spark application with "
                                                   r"spark.scheduler.mode=(FIFO|fifo): .*set spark.scheduler.mode="
                                                   r"FAIR before the session starts"):
        assert warn_unless_fair(fifo, 3, lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning: 3 live stages")
    assert not warn_unless_fair(fifo, 1, lines.append) and not warn_unless_fair(fair, 3, lines.append)
    assert len(lines) == 1
