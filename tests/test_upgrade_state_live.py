"""``deltawheel upgrade-state`` while the pipeline runs (version 2 code, following its input): the
running owner hands the intervals over at a batch boundary, the tool upgrades every version 1 row
in one fenced commit, the pipeline takes them back and counts on. The final rows equal an
uninterrupted run's with the upgrade applied, every production once. Real Spark, ZooKeeper, Delta."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from test_state_ttl_pipeline import J, T, injector, rows_of, write_clicks
from ttl_util import TotalsV1, TotalsV2

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]


@pytest.mark.slow  # a bounded run, a following run and the tool racing it: minutes on a loaded machine
@pytest.mark.timeout(2400)
def test_upgrade_state_racing_a_running_pipeline(spark, zk_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.surgery.audit import read_audit

    folder, store = tmp_path / "clicks", tmp_path / "store"
    layout = StoreLayout(str(store))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/upgrade-{uuid.uuid4().hex[:8]}")
    first = [("ann", T + 1_000), ("ann", T + 2_000), ("bob", T + 3_000), ("bob", T + 3_500), ("cy", T + 4_000),
             ("dan", T + 4_500)]
    write_clicks(folder, "part-0.parquet", first, mtime=1_000_000)
    PipelineRunner(spark, layout, Pipeline("upg", (injector(folder),), (TotalsV1(),)), zk=zk,
                   progress=lambda line: None).run()
    assert rows_of(spark, store, "totals") == {"ann": (2, "json"), "bob": (2, "json"), "cy": (1, "json"),
                                               "dan": (1, "json")}
    later = [[("ann", T + 5_000)], [("eve", T + 6_000), ("cy", T + 6_500)], [("ann", T + 7_000)],
             [("fay", T + 8_000)]]
    stop, failed, lines = threading.Event(), [], []
    runner = PipelineRunner(spark, layout, Pipeline("upg", (injector(folder),), (TotalsV2(),)), zk=zk,
                            end_of_input=False, progress=lines.append, follow=stop.is_set, poll_s=0.3)

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:  # the test fails on it below
            failed.append(exc)

    def wait_for(what: Any, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            assert time.monotonic() < deadline and not failed, (failed, lines[-20:])
            time.sleep(1)

    t = threading.Thread(target=run, name="live-pipeline")
    t.start()
    try:
        write_clicks(folder, "part-1.parquet", later[0], mtime=1_000_100)
        wait_for(lambda: rows_of(spark, store, "totals")["ann"][1] == "json@2")  # ann upgraded on first touch
        write_clicks(folder, "part-2.parquet", later[1], mtime=1_000_200)  # the batch in flight as the tool runs
        assert main(["upgrade-state", "--store", str(store), "--pipeline", "upg", "--computation", "totals",
                     "--code", "ttl_util:TotalsV2", "--zk", zk.hosts, "--zk-chroot", zk.chroot, "--wait", "600"]) == 0
        out = capsys.readouterr().out
        assert "upgraded " in out and " rows of totals to state_version 2" in out, out
        for i, clicks in enumerate(later[2:], start=3):
            write_clicks(folder, f"part-{i}.parquet", clicks, mtime=1_000_000 + 100 * i)
        wait_for(lambda: "fay" in rows_of(spark, store, "totals")
                 and rows_of(spark, store, "totals")["ann"][0] == {"n": 4, "last": T + 7_000})
    finally:
        stop.set()
        t.join(timeout=600)
    assert not failed, failed
    assert any("handing intervals over to upgrade-state" in line for line in lines), lines[-20:]
    # an uninterrupted run with the upgrade applied: v1 counts upgraded, then counted on by v2
    every = first + [c for part in later for c in part]
    v1_counts = Counter(u for u, _ in first)
    want: dict[str, tuple[Any, str]] = {}
    for user in {u for u, _ in every}:
        mine = sorted(ts for u, ts in every if u == user)
        after = [ts for u, ts in every if u == user and (u, ts) not in first]
        state = TotalsV2().upgrade_state(v1_counts[user], 1) if user in v1_counts else {"n": 0, "last": None}
        want[user] = ({"n": len(mine), "last": max(after) if after else state["last"]}, "json@2")
    assert rows_of(spark, store, "totals") == want
    (audit,) = read_audit(spark, layout)
    assert (audit["tool"], audit["computation"]) == ("upgrade-state", "totals") and audit["commit_version"] is not None
    totals = spark.read.format("delta").load(layout.stream("totals")).collect()
    got = sorted((r["key"], J.decode(bytes(r["value"]))["n"]) for r in totals)
    assert got == sorted((u, n) for u in want for n in range(1, want[u][0]["n"] + 1))  # each once, none lost
