"""The columnar path under SIGKILL: a job counting per key and 10-s window with ``process_columns``
(``restart_job.WinCount``, state in ``int64map``) is killed (its whole process group) after a
committed batch and restarted under its instance name to the end of its input; every window's
count is in the stream once, as the input files say; the rows the killed job left hold its open
windows whole, with their timers."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltawheel.statestore.codecs import get_codec
from restart_job import PIPELINE, WIN, WinCount, injector, write_files
from test_restart import kill, lines_until, start_job

pytestmark = [pytest.mark.spark, pytest.mark.zk]

M = get_codec("int64map")


def reference(folder: Path) -> dict[tuple[str, int], int]:
    """Each (key, window start)'s count, from the input files."""
    out: Counter[tuple[str, int]] = Counter()
    for f in sorted(folder.glob("part-*.parquet")):
        for r in pq.read_table(f).to_pylist():
            out[(r["key"], r["t"] - r["t"] % WIN)] += 1
    return dict(out)


def fired_and_open(spark: Any, layout: Any) -> tuple[list[tuple[str, int, int]], list[str], dict[tuple[str, int], int],
                                                      dict[tuple[str, int], int]]:
    """The stream's (key, start, count) productions and their record ids; the rows' open windows
    (state) and their timers (tag as the start, time)."""
    from pyspark.sql import functions as F

    prods = spark.read.format("delta").load(layout.stream("counts")).collect()
    fired = [tuple(M.decode(r["value"])) for r in prods]
    assert all(r["key"] == k for r, (k, _, _) in zip(prods, fired, strict=True))
    rows = spark.read.format("delta").load(layout.rows_of(WinCount.name)).where(
        (F.col("computation") == WinCount.name) & ~F.col("key").startswith("\x00")).collect()
    state: dict[tuple[str, int], int] = {}
    timers: dict[tuple[str, int], int] = {}
    for r in rows:
        for start, n in (M.decode(r["state"]) if r["state"] is not None else {}).items():
            state[(r["key"], start)] = n
        for t in r["timers"]:
            timers[(r["key"], int(t["tag"]))] = t["time_ms"]
    return fired, [r["record_id"] for r in prods], state, timers  # type: ignore[return-value]


@pytest.mark.timeout(900)
# on the object store in the slow run: the same kill and restart with the rows, the streams and the
# query's checkpoint on S3Proxy (commits arbitrated by the job's ZooKeeper chroot)
@pytest.mark.slow  # a SIGKILLed subprocess job restarted; SIGKILL mid-commit: test_crash.py, the columnar path: test_columnar.py
@pytest.mark.parametrize("where", ["local", pytest.param("s3a", marks=[pytest.mark.objectstore])])
def test_a_columnar_job_killed_and_restarted_counts_every_window_once(  # type: ignore[no-untyped-def]
        spark, zk_server, tmp_path, where: str, request: pytest.FixtureRequest) -> None:
    import uuid

    import deltawheel

    chroot = f"/colrestart-{uuid.uuid4().hex[:10]}"
    folder = tmp_path / "input"
    store: Path | str = tmp_path / "store"
    env = None
    if where == "s3a":
        from conftest import object_store_env

        store = request.getfixturevalue("s3_store_layout").root  # a fresh store below the test bucket
        env = {**object_store_env(request.getfixturevalue("object_store")),
               "RESTART_WITNESS": str(tmp_path / "columnar-calls")}
    records = write_files(folder, 8)
    proc = start_job(store, folder, zk_server.hosts, chroot, "a", columnar=True, env=env)
    seen: list[str] = []
    try:
        lines_until(proc, "wincount batch 3:", seen)  # window 0 fired in batch 3 (its end behind the watermark)
    finally:
        kill(proc)
    try:  # (connect arbitrates the object store's commits by the job's chroot: the killed job's too)
        with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, zk_chroot=chroot, pipeline=PIPELINE,
                                instance="a", owner="restarted", wait_s=0) as engine:
            engine.progress = False
            _, _, at_kill, timers_at_kill = fired_and_open(spark, engine.layout)  # what the killed job committed
            comp = WinCount()
            comp.witness = str(tmp_path / "restart-calls")
            reports = engine.run(injector(str(folder), columnar=True), comp)
            assert 0 < sum(r.processed for r in reports) < records  # the killed one's commits were kept
            fired, ids, state, timers = fired_and_open(spark, engine.layout)
    finally:
        if where == "s3a":  # the session's other object-store tests: the bucket's own chroot again
            from conftest import S3_TEST_LOGSTORE_CHROOT
            from deltawheel.statestore.objectstore.logstore import configure_log_store

            configure_log_store(spark, zk_server.hosts, chroot=S3_TEST_LOGSTORE_CHROOT)
    # the killed job's batches fired windows before the kill, the restarted one's after
    killed_produced = sum(int(m) for m in re.findall(r"wincount batch \d+: .*?, (\d+) produced", "".join(seen)))
    assert killed_produced > 0, "".join(seen)
    assert len(fired) > killed_produced
    # both jobs ran process_columns (the killed one's witness folder is beside its store)
    assert os.listdir(tmp_path / "columnar-calls") and os.listdir(tmp_path / "restart-calls")
    ref = reference(folder)
    # the killed job's rows: its open windows whole (a file is one window, read in one batch), each
    # with its timer at its end, the windows a run of consecutive files
    assert at_kill and all(n == ref[ks] for ks, n in at_kill.items()), at_kill
    assert timers_at_kill == {ks: ks[1] + WIN - 1 for ks in at_kill}
    starts = sorted({s for _, s in at_kill})
    assert starts == list(range(starts[0], starts[-1] + 1, WIN))
    assert {ks for ks in ref if ks[1] in starts} == at_kill.keys()
    assert len(ids) == len(set(ids))
    done = Counter((k, s) for k, s, _ in fired)
    assert max(done.values()) == 1, done  # no window produced twice
    got = {(k, s): n for k, s, n in fired}
    assert not got.keys() & state.keys()  # a fired window is no longer open
    assert {**got, **state} == ref  # none lost, none doubled
    # run to the end of its input (the watermark to the end of time): every window fired, none open
    assert state == {} and timers == {}
