"""Shared fixtures: one real SparkSession (with Delta) and one real ZooKeeper
server per test run; every test gets its own store folder and ZooKeeper chroot.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# the one per-user jars cache every entry point uses (statestore/jars.py, default_jars_dir), named for subprocesses
os.environ.setdefault("DELTAWHEEL_JARS_DIR", str(Path.home() / ".cache" / "deltawheel" / "jars"))
# every server a test starts (ZooKeeper, S3Proxy, Kafka, a Spark cluster), here or in a subprocess,
# is stopped by a watchdog once this run is gone, even when it was SIGKILLed (statestore/process.py)
os.environ.setdefault("DELTAWHEEL_SERVERS_DIE_WITH", str(os.getpid()))
# a Spark application a test starts in a subprocess lives a minute or two: compiled by the client
# compiler alone, with the serial collector, it spends about a third less CPU (as the servers' JVMs);
# the shared session below lives the whole run and keeps the JVM's defaults (``spark`` fixture)
SHORT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_JVM)


# The longest files first: pytest-xdist hands whole files (--dist loadfile) to its workers in the
# order collected, so a long file collected last would leave one worker running it alone at the end.
LONGEST_FIRST = ("test_chaos.py", "test_executor.py", "test_migrations.py", "test_sources.py", "test_direct.py",
                 "test_replay_shared.py", "test_windowing_settings.py", "test_status_report.py", "test_rescale.py",
                 "test_s3_logstore.py", "test_gc_sharded.py", "test_gc.py", "test_gc_complete.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def restart_zk_server(server: Any) -> None:
    """Start a stopped ZooKeeper server again on its data (its port may take a moment to be free)."""
    import time

    from deltawheel.statestore.exceptions import ZooKeeperServerError

    deadline = time.monotonic() + 30
    while True:
        try:
            server.start()
            return
        except ZooKeeperServerError as exc:
            if "in use" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    ours = os.environ.get("SPARK_SUBMIT_OPTS") == SHORT_JVM
    if ours:
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        session = build_spark(SparkSettings(master="local[2]", app_name="deltawheel-tests"))
    finally:
        if ours:
            os.environ["SPARK_SUBMIT_OPTS"] = SHORT_JVM
    yield session
    session.stop()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real ZooKeeper server from the jars in the pyspark wheel."""
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper

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


@pytest.fixture(scope="session")
def migrated_template(spark, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """A store folder with every migration applied, made once per run; never handed to a test
    (``migrated_store`` copies it)."""
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel import migrations

    root = tmp_path_factory.mktemp("migrated-template") / "store"
    migrations.apply(spark, StoreLayout(str(root)), dry_run=False)
    return root


def copy_migrated_store(template: Path, dest: Path) -> None:
    """Copy a migrated store's folder to ``dest`` as a store of its own: each table gets a new
    Delta table id (a pipeline's ZooKeeper binding tells stores apart by the rows table's id), and
    its commit files the copy's time. A copy takes milliseconds where the migrations take seconds."""
    import json
    import shutil

    shutil.copytree(template, dest, copy_function=shutil.copyfile, dirs_exist_ok=True)
    for log in sorted(dest.rglob("_delta_log")):
        first = log / f"{0:020d}.json"
        old = next(json.loads(line)["metaData"]["id"] for line in first.read_text().splitlines()
                   if '"metaData"' in line)
        fresh = str(uuid.uuid4())
        for f in sorted(log.iterdir()):
            if f.name.startswith("."):  # Hadoop's checksum files of the log files: left out, they are optional
                f.unlink()
                continue
            if f.is_file():
                assert f.suffix in (".json", ".crc"), f"{f}: a log file the store copy does not know"
                f.write_text(f.read_text().replace(old, fresh))


@pytest.fixture
def migrated_store(store_layout, migrated_template):  # type: ignore[no-untyped-def]
    """A fresh store with every migration applied (a copy of ``migrated_template``)."""
    copy_migrated_store(migrated_template, Path(store_layout.root))
    return store_layout


@pytest.fixture
def migrated_at(migrated_template):  # type: ignore[no-untyped-def]
    """``migrated_at(folder)``: a fresh migrated store (a copy of ``migrated_template``) at ``folder``,
    as its StoreLayout. For tests whose pipeline runs would otherwise first migrate a new store
    (seconds of Delta commits each) where the migration is not what they test."""
    from deltawheel.statestore.layout import StoreLayout

    def make(folder: Path) -> Any:
        copy_migrated_store(migrated_template, Path(folder))
        return StoreLayout(str(folder))

    return make


S3_TEST_BUCKET = "deltawheel-tests"
S3_TEST_LOGSTORE_CHROOT = "/deltawheel-tests-logstore"  # the chroot arbitrating the test bucket's commits


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real S3-compatible server (S3Proxy on a filesystem backend) for the whole run."""
    from deltawheel.servers.s3proxy import S3ProxyServer

    server = S3ProxyServer(tmp_path_factory.mktemp("s3"), port=free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_bucket(spark, object_store, zk_server) -> str:  # type: ignore[no-untyped-def]
    """The test bucket, created on ``object_store`` and configured in the shared session.

    The ``spark`` fixture does not start the object store (most tests never touch it): the S3A
    jars are on its classpath from the start (build_spark adds them when cached), and the
    bucket's endpoint and credentials are set at run time, per bucket, before its first use.
    Commits to it are arbitrated by ``zk_server`` (docs/objectstore.md, "Multi-writer commits").
    """
    from deltawheel.statestore.objectstore.logstore import configure_log_store
    from deltawheel.statestore.objectstore.s3a import configure_bucket

    object_store.create_bucket(S3_TEST_BUCKET)
    configure_bucket(spark, object_store.endpoint, S3_TEST_BUCKET)
    configure_log_store(spark, zk_server.hosts, chroot=S3_TEST_LOGSTORE_CHROOT)
    return S3_TEST_BUCKET


@pytest.fixture
def s3_store_layout(s3_bucket):  # type: ignore[no-untyped-def]
    """A fresh, not yet migrated store below the test bucket (``s3a://<bucket>/<uuid>``)."""
    from deltawheel.statestore.layout import StoreLayout

    return StoreLayout(f"s3a://{s3_bucket}/{uuid.uuid4().hex}")


@pytest.fixture
def migrated_s3_store(spark, s3_store_layout):  # type: ignore[no-untyped-def]
    """A fresh store on the object store with every migration applied."""
    from deltawheel import migrations

    migrations.apply(spark, s3_store_layout, dry_run=False)
    return s3_store_layout


@pytest.fixture(params=["local", pytest.param("s3a", marks=pytest.mark.objectstore)])
def any_migrated_store(request):  # type: ignore[no-untyped-def]
    """A migrated store in a local folder, then on the object store (the same test runs on both)."""
    return request.getfixturevalue("migrated_store" if request.param == "local" else "migrated_s3_store")


def object_store_env(object_store) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Environment for a child process that builds its own session on ``object_store``."""
    from deltawheel.statestore.objectstore import s3a

    ep = object_store.endpoint
    return {**os.environ, s3a.ENV_ENDPOINT: ep.url, s3a.ENV_ACCESS_KEY: ep.access_key,
            s3a.ENV_SECRET_KEY: ep.secret_key}


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[object]:
    """A three-server ZooKeeper ensemble of this test's own (stopped, every server, after it)."""
    from deltawheel.servers.ensemble import ZooKeeperEnsemble

    ens = ZooKeeperEnsemble(tmp_path / "ens")
    ens.start()
    yield ens
    ens.stop()
    assert ens.status().servers and all(s.pid is None for s in ens.status().servers)


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Spark standalone cluster (master + 2 workers) and a 3-server ZooKeeper ensemble, started
    once for the tests that ask for it (``deltawheel cluster up``'s LocalCluster)."""
    from deltawheel.servers.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    cluster.up()
    yield cluster
    cluster.down()


@pytest.fixture
def hosts_available() -> Iterator[None]:
    """Skip, with the reason, where this machine cannot make namespaces; the bed's names are fixed, so
    the tests that make one take turns (a lock file: the two pytest workers would meet otherwise)."""
    import fcntl
    import tempfile

    from deltawheel.executor.exceptions import HostsUnavailableError

    from deltawheel.servers.netns import check_namespaces, leftovers

    try:
        check_namespaces()
    except HostsUnavailableError as exc:
        pytest.skip(str(exc))
    with open(Path(tempfile.gettempdir()) / "deltawheel-hosts-bed.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if leftovers():
            pytest.skip(f"a hosts test bed is already up on this machine ({'; '.join(leftovers())}); "
                        "take it down with: deltawheel cluster down --hosts")
        yield
