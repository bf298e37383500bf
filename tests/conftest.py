"""Shared fixtures: one real SparkSession (with Delta) and one real ZooKeeper
server per test run; every test gets its own store folder and ZooKeeper chroot.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("DELTAWHEEL_JARS_DIR", str(REPO / ".cache" / "jars"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from deltawheel.statestore.delta.sparkenv import SparkSettings, build_spark

    session = build_spark(SparkSettings(master="local[2]", app_name="deltawheel-tests"))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real ZooKeeper server from the jars in the pyspark wheel."""
    from deltawheel.statestore.zk.server import EmbeddedZooKeeper

    server = EmbeddedZooKeeper(tmp_path_factory.mktemp("zk"), port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk_config(zk_server):  # type: ignore[no-untyped-def]
    """A ZkConfig on the shared server with a chroot of this test's own."""
    from deltawheel.statestore.config import ZkConfig

    return ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)


@pytest.fixture
def store_layout(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A fresh, not yet migrated store folder."""
    from deltawheel.statestore.layout import StoreLayout

    return StoreLayout(str(tmp_path / "store"))


@pytest.fixture
def migrated_store(spark, store_layout):  # type: ignore[no-untyped-def]
    """A fresh store with every migration applied."""
    from deltawheel import migrations

    migrations.apply(spark, store_layout, dry_run=False)
    return store_layout


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Spark standalone cluster (master + 2 workers) and a 3-server ZooKeeper ensemble, started
    once for the tests that ask for it (``deltawheel cluster up``'s LocalCluster)."""
    from deltawheel.executor.runtime.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    cluster.up()
    yield cluster
    cluster.down()
