"""An executor whose start fails after its leases were granted (its recovery read the store while
the object store did not serve) gives the leases back: a live pipeline starts the stage again in the
same process (its ZooKeeper session goes on), and a lease kept by the failed start would hold the
intervals from everyone, itself included. Found by a chaos run on ``s3a://``: two intervals of
``ledger`` stayed held by a driver's session with no executor behind them, and the stage's low
watermark stopped. Real ZooKeeper, Spark and Delta; the failure is raised in deltawheel's recovery."""

from __future__ import annotations

from typing import Any

import pytest
from deltawheel.executor.windowing.windowed import windowed


@pytest.mark.zk
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_a_start_that_fails_in_its_recovery_gives_the_leases_back(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, monkeypatch, write_path) -> None:
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.executor.windowing.windows import FixedWindows
    from deltawheel.statestore.ownership import owner as owner_module
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.lease_tools import list_leases
    from deltawheel.statestore.zk.leases import LeaseManager

    comp = windowed(name="wstart", inputs={"events": "q"}, output="panes", windowing=FixedWindows(10_000),
                    combine="count", num_intervals=2)
    client = connect(zk_config)
    try:
        def executor() -> Any:
            owner = IntervalOwner(RowStore(spark, migrated_store, writer="a"),
                                  LeaseManager(client, pipeline="test", owner="a"), comp.name, num_intervals=2)
            return ComputationExecutor(spark, migrated_store, comp, owner=owner, write_path=write_path,
                                       manual_watermarks=True)

        def gone(*_args: Any, **_kwargs: Any) -> Any:
            raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7, Could not connect")

        with monkeypatch.context() as m:  # the recovery scan reads the store, which does not answer
            m.setattr(owner_module, "recover", gone)
            m.setattr(owner_module, "rebuild", gone)
            with pytest.raises(OSError, match="NETWORK_CONNECTION"):
                executor().start(wait_s=5)
        held = [r for r in list_leases(client, pipeline="test") if r["computation"] == comp.name and r["owner"]]
        assert held == [], held
        again = executor()  # the same session starts the stage again at once, as the live run does
        again.start(wait_s=5)
        assert again.owner.intervals == (0, 1)
        again.stop()
    finally:
        client.stop()
        client.close()
