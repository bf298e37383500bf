"""The object store: a real S3-compatible server (S3Proxy), Spark on s3a://, typed errors."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import free_port
from deltawheel.statestore.exceptions import (
    BucketMissingError,
    ObjectStoreAuthError,
    ObjectStoreServerError,
    ObjectStoreUnreachableError,
)
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.objectstore.client import S3Client, S3Endpoint
from deltawheel.statestore.objectstore.s3a import configure_bucket

from deltawheel import migrations
from deltawheel.servers.s3proxy import S3ProxyServer

pytestmark = [pytest.mark.objectstore]


def test_server_serves_buckets_and_keeps_its_credential(object_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    st = object_store.status()
    assert st.running and st.pid is not None
    name = f"b-{uuid.uuid4().hex[:10]}"
    assert object_store.create_bucket(name) is True
    assert object_store.create_bucket(name) is False  # already there, ours
    assert name in object_store.client().list_buckets()
    assert object_store.client().bucket_exists(name) and not object_store.client().bucket_exists(name + "-x")
    # a second server on the same port is refused with the next step
    other = S3ProxyServer(tmp_path / "other", port=object_store.port)
    with pytest.raises(ObjectStoreServerError, match="in use by another process"):
        other.start()


def test_bucket_client_errors_are_typed(object_store) -> None:  # type: ignore[no-untyped-def]
    ep = object_store.endpoint
    with pytest.raises(ObjectStoreAuthError, match="refused the credentials"):
        S3Client(S3Endpoint(ep.url, ep.access_key, "wrong")).bucket_exists("deltawheel-tests")
    with pytest.raises(ObjectStoreUnreachableError, match="deltawheel objectstore start"):
        S3Client(S3Endpoint(f"http://127.0.0.1:{free_port()}", "a", "b")).list_buckets()


@pytest.mark.slow  # the default suite migrates s3a stores already: the migrate CLI test, migrated_s3_store
def test_migrations_run_on_the_object_store(spark, s3_store_layout) -> None:  # type: ignore[no-untyped-def]
    ran = migrations.apply(spark, s3_store_layout, dry_run=False)
    assert ran and migrations.check_store(spark, s3_store_layout) == migrations.CODE_SCHEMA_VERSION
    assert migrations.apply(spark, s3_store_layout, dry_run=False) == []
    assert spark.read.format("delta").load(s3_store_layout.rows).count() == 0


def test_wrong_credentials_missing_bucket_and_stopped_server_are_typed(spark, object_store, s3_bucket,  # type: ignore[no-untyped-def]
                                                                       tmp_path: Path) -> None:
    ep = object_store.endpoint
    # a missing bucket (Hadoop keeps one file system per bucket: each case gets a bucket of its own)
    missing = f"missing-{uuid.uuid4().hex[:10]}"
    configure_bucket(spark, ep, missing)
    with pytest.raises(BucketMissingError, match=rf"bucket '{missing}' .* does not exist.*create-bucket"):
        migrations.apply(spark, StoreLayout(f"s3a://{missing}/store"), dry_run=False)
    # wrong credentials on an existing bucket
    denied = f"denied-{uuid.uuid4().hex[:10]}"
    object_store.create_bucket(denied)
    configure_bucket(spark, S3Endpoint(ep.url, ep.access_key, "not-the-credential"), denied)
    with pytest.raises(ObjectStoreAuthError, match="refused the credentials.*fs.s3a.secret.key"):
        migrations.apply(spark, StoreLayout(f"s3a://{denied}/store"), dry_run=False)
    # a server that was stopped: its own data, its own port
    gone = S3ProxyServer(tmp_path / "gone", port=free_port())
    gone.start()
    down = f"down-{uuid.uuid4().hex[:10]}"
    gone.create_bucket(down)
    configure_bucket(spark, gone.endpoint, down)
    assert gone.stop() is True
    assert not gone.status().running
    with pytest.raises(ObjectStoreUnreachableError, match="no object store answers.*objectstore start"):
        migrations.check_store(spark, StoreLayout(f"s3a://{down}/store"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deltawheel.cli", *args],
                          capture_output=True, text=True, timeout=180)


def test_objectstore_cli_start_status_bucket_stop(tmp_path: Path) -> None:
    data, port = str(tmp_path / "s3"), str(free_port())
    started = _cli("objectstore", "start", "--data", data, "--port", port)
    try:
        assert started.returncode == 0, started.stderr
        assert f"http://127.0.0.1:{port}" in started.stdout
        assert "spark.hadoop.fs.s3a.endpoint" in started.stdout and "DELTAWHEEL_S3_SECRET_KEY" in started.stdout
        status = _cli("objectstore", "status", "--data", data)  # the port is read back from the data folder
        assert status.returncode == 0 and "running" in status.stdout, status.stdout + status.stderr
        made = _cli("objectstore", "create-bucket", "trial-bucket", "--data", data)
        assert made.returncode == 0 and "created bucket 'trial-bucket'" in made.stdout, made.stderr
        assert (tmp_path / "s3" / "blobs" / "trial-bucket").is_dir()  # the filesystem backend's folder
    finally:
        stopped = _cli("objectstore", "stop", "--data", data)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    after = _cli("objectstore", "status", "--data", data)
    assert after.returncode == 1 and "not running" in after.stdout


def test_objectstore_cli_says_when_the_port_belongs_to_another_data_folder(tmp_path: Path) -> None:
    """A user starts the server with --data A, then asks for a bucket without --data (the default
    folder, same default port): the answer names the cause instead of a credential error."""
    a, b, port = str(tmp_path / "a"), str(tmp_path / "b"), str(free_port())
    nothing = _cli("objectstore", "create-bucket", "early", "--data", b, "--port", port)
    assert nothing.returncode != 0 and "objectstore start --data" in nothing.stderr, nothing.stderr
    started = _cli("objectstore", "start", "--data", a, "--port", port)
    try:
        assert started.returncode == 0, started.stderr
        status = _cli("objectstore", "status", "--data", b, "--port", port)
        assert status.returncode == 1 and "answered by another process" in status.stdout, status.stdout
        made = _cli("objectstore", "create-bucket", "mine", "--data", b, "--port", port)
        assert made.returncode != 0, made.stdout
        assert "ObjectStoreServerError" in made.stderr and "pass the --data folder" in made.stderr, made.stderr
        assert not (tmp_path / "a" / "blobs" / "mine").exists()
        wrong = _cli("objectstore", "stop", "--data", b, "--port", port)  # stops nothing, and says why
        assert "answered by another process" in wrong.stdout, wrong.stdout
        assert _cli("objectstore", "status", "--data", a).returncode == 0  # still running
    finally:
        _cli("objectstore", "stop", "--data", a)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
@pytest.mark.slow  # the object-store set; migrate's ZooKeeper options: test_migrations.py
def test_migrate_on_an_s3a_store_takes_its_zookeeper_from_the_command_line(object_store, s3_bucket,  # type: ignore[no-untyped-def]
                                                                          zk_server) -> None:
    from conftest import object_store_env
    from kazoo.client import KazooClient

    store, chroot = f"s3a://{s3_bucket}/{uuid.uuid4().hex}", f"/cli-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in object_store_env(object_store).items() if not k.startswith("DELTAWHEEL_ZK")}

    def migrate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "deltawheel.cli", "migrate", "--store", store, *args],
                              capture_output=True, text=True, timeout=500, env=env)

    refused = migrate("--apply")  # no ZooKeeper anywhere: refused before anything is written
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "ConfigError: store s3a://" in refused.stderr and "pass --zk host:port" in refused.stderr
    done = migrate("--apply", "--zk", zk_server.hosts, "--zk-chroot", chroot)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "store is now at schema version" in done.stdout
    client = KazooClient(hosts=zk_server.hosts)
    client.start(timeout=15)
    try:  # its commits went through that ZooKeeper: the log store's entries are below the chroot
        def entries(path: str) -> int:
            return sum(1 + entries(f"{path}/{c}") for c in client.get_children(path))

        assert entries(f"{chroot}/delta-log") >= 2  # at least the _meta and rows tables' first commits
    finally:
        client.stop()
        client.close()


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_engines_of_one_application_share_the_log_stores_zookeeper_or_are_refused(  # type: ignore[no-untyped-def]
        spark, zk_server, s3_bucket, migrated_s3_store) -> None:
    """The log store is one per Spark application: a second engine on an object-store store with
    another chroot is refused while the first is open (its tables would have no one arbiter), one
    with the same chroot is not; once both close, the session's log store is as it was before."""
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.objectstore.logstore import CONNECT_KEY, NAMESPACE_KEY

    import deltawheel

    def setting(key: str) -> str | None:
        value = spark.sparkContext._jsc.hadoopConfiguration().get(key)
        return None if value is None else str(value)

    before = (setting(CONNECT_KEY), setting(NAMESPACE_KEY))
    chroot = f"/a-{uuid.uuid4().hex[:8]}"
    with deltawheel.connect(spark, store=migrated_s3_store.root, zk=zk_server.hosts, zk_chroot=chroot, pipeline="a"):
        assert setting(NAMESPACE_KEY) == f"{chroot[1:]}/delta-log"
        with pytest.raises(ConfigError, match=rf"ZooKeeper {zk_server.hosts} under {chroot}/delta-log .* "
                                              rf"{zk_server.hosts} under /b-"):
            deltawheel.connect(spark, store=migrated_s3_store.root, zk=zk_server.hosts,
                               zk_chroot=f"/b-{uuid.uuid4().hex[:8]}", pipeline="b")
        with deltawheel.connect(spark, store=migrated_s3_store.root, zk=zk_server.hosts, zk_chroot=chroot,
                                pipeline="b"):
            assert setting(NAMESPACE_KEY) == f"{chroot[1:]}/delta-log"
        assert setting(NAMESPACE_KEY) == f"{chroot[1:]}/delta-log"  # the first engine is still open
    assert (setting(CONNECT_KEY), setting(NAMESPACE_KEY)) == before


@pytest.mark.spark
@pytest.mark.zk
def test_a_command_run_in_process_leaves_the_sessions_log_store_settings_as_they_were(  # type: ignore[no-untyped-def]
        spark, s3_store_layout, zk_server, capsys) -> None:
    """``deltawheel.cli.main`` inside a process that goes on (a notebook, a test): a command on an
    s3a:// store with another ``--zk-chroot`` points the session's log store there while it runs,
    and puts the settings back after it, so the process's later commits keep their one arbiter
    (the replay command left them behind: the next writer of a table in this process then won a
    version another process also won)."""
    from deltawheel.statestore.delta.jvm import jcontext
    from deltawheel.statestore.objectstore.logstore import CONNECT_KEY, DIGEST_KEY, NAMESPACE_KEY

    from deltawheel.cli import main

    def settings() -> dict[str, str | None]:
        conf = jcontext(spark).hadoopConfiguration()
        return {k: conf.get(k) for k in (CONNECT_KEY, NAMESPACE_KEY, DIGEST_KEY)}

    before = settings()
    assert before[NAMESPACE_KEY] and before[CONNECT_KEY] == zk_server.hosts
    other = f"/elsewhere-{uuid.uuid4().hex[:8]}"
    assert main(["migrate", "--store", s3_store_layout.root, "--zk", zk_server.hosts, "--zk-chroot", other]) == 0
    assert "migrat" in capsys.readouterr().out  # the plan was printed: the command ran on the store
    assert settings() == before
