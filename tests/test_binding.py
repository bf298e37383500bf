"""A pipeline's ZooKeeper state belongs to one store: another store of the same pipeline name
must not inherit its watermarks and sequencers (statestore/zk/binding.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltawheel.statestore.exceptions import StoreMismatchError

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _owner(spark, layout, client, pipeline: str, who: str):  # type: ignore[no-untyped-def]
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.leases import LeaseManager

    return IntervalOwner(RowStore(spark, layout, writer=who), LeaseManager(client, pipeline=pipeline, owner=who),
                         "c", num_intervals=2)


def test_another_store_of_the_same_pipeline_is_refused_before_any_lease(
        spark, migrated_store, migrated_template, zk_config, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from conftest import copy_migrated_store
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.zk.binding import store_path
    from deltawheel.statestore.zk.client import connect

    other = StoreLayout(str(tmp_path / "other"))
    copy_migrated_store(migrated_template, tmp_path / "other")
    a_client, b_client, c_client = connect(zk_config), connect(zk_config), connect(zk_config)
    try:
        a = _owner(spark, migrated_store, a_client, "p", "a")
        a.acquire()
        held = json.loads(a_client.get(store_path("p"))[0])
        assert held["rows_table_id"] == a.store.table_id() and held["root"] == migrated_store.root
        # the id read from the local log is Delta's own table id
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{migrated_store.rows}`").first()
        assert held["rows_table_id"] == detail["id"]
        a.leases.release("c", [0, 1])

        b = _owner(spark, other, b_client, "p", "b")
        grants = "/pipelines/p/computations/c/intervals/00000/grants"
        before = sorted(b_client.get_children(grants))
        with pytest.raises(StoreMismatchError, match=r"holds pipeline 'p' of another store: .*own ZooKeeper chroot"):
            b.acquire()
        assert not b.intervals and sorted(b_client.get_children(grants)) == before  # no lease was taken
        # the same store again (another instance) and the other store under another pipeline name: fine
        again = _owner(spark, migrated_store, c_client, "p", "c")
        again.acquire()
        assert again.intervals == (0, 1)
        _owner(spark, other, b_client, "q", "b").acquire()
        assert json.loads(b_client.get(store_path("q"))[0])["root"] == other.root
    finally:
        for c in (a_client, b_client, c_client):
            c.stop()
            c.close()


def test_a_znode_that_is_not_a_binding_is_named(zk_config) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.zk.binding import bind_store, store_path
    from deltawheel.statestore.zk.client import connect

    client = connect(zk_config)
    try:
        assert bind_store(client, "p", table_id="t1", root="/s1") is True
        assert bind_store(client, "p", table_id="t1", root="/elsewhere") is False  # a copy of the same store
        client.set(store_path("p"), b"not json")
        with pytest.raises(StoreMismatchError, match="does not hold a deltawheel store binding"):
            bind_store(client, "p", table_id="t1", root="/s1")
    finally:
        client.stop()
        client.close()
