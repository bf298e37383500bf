"""The interval owner's lease check (statestore/ownership/owner.py): nothing held, nothing passes."""

from __future__ import annotations

import pytest
from deltawheel.statestore.exceptions import LeaseLostError
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager


@pytest.mark.spark
@pytest.mark.zk
def test_an_owner_holding_no_interval_fails_its_lease_check(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    client = connect(zk_config)
    try:
        owner = IntervalOwner(RowStore(spark, migrated_store, writer="a"), LeaseManager(client, pipeline="p", owner="a"),
                              "c", num_intervals=2)
        with pytest.raises(LeaseLostError, match="no intervals of 'c' are held; acquire them first"):
            owner.check()
        owner.acquire()
        owner.check()  # held and valid: passes
        assert owner.intervals == (0, 1) and set(owner.sequencers) == {0, 1}
        owner.release()
        with pytest.raises(LeaseLostError, match="no intervals of 'c' are held"):
            owner.check()
    finally:
        client.stop()
        client.close()
