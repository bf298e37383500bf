"""A command whose object store stops answering exits 5 with ``ObjectStoreUnreachableError`` naming
the store, at whatever step it was, not with a traceback: found by a chaos run on ``s3a://``, where
``repair`` and a driver died with exit 1 while S3Proxy was down. Real S3Proxy, ZooKeeper and Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import free_port
from deltawheel.statestore.exceptions import ObjectStoreUnreachableError
from deltawheel.statestore.objectstore.errors import store_failure
from deltawheel.statestore.objectstore.s3a import ENV_ACCESS_KEY, ENV_ENDPOINT, ENV_SECRET_KEY, files_from_env

from deltawheel.servers.s3proxy import S3ProxyServer

pytestmark = [pytest.mark.objectstore, pytest.mark.zk]


@pytest.fixture
def stopped_store(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A store URI on a bucket of a server that was stopped (its own bucket: Hadoop keeps a file system
    per bucket), and the environment naming that server."""
    server = S3ProxyServer(tmp_path / "s3", port=free_port())
    server.start()
    bucket = f"gone-{uuid.uuid4().hex[:10]}"
    server.create_bucket(bucket)
    ep = server.endpoint
    assert server.stop() is True
    env = {**os.environ, ENV_ENDPOINT: ep.url, ENV_ACCESS_KEY: ep.access_key, ENV_SECRET_KEY: ep.secret_key}
    return f"s3a://{bucket}/store", env


def test_status_on_a_store_whose_object_store_is_down_exits_5_naming_it(stopped_store, zk_server) -> None:  # type: ignore[no-untyped-def]
    store, env = stopped_store
    done = subprocess.run([sys.executable, "-m", "deltawheel.cli", "status", "--store", store, "--zk", zk_server.hosts],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 5, done.stderr[-3000:]
    assert f"ObjectStoreUnreachableError: no object store answers for {store}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_pyarrow_read_of_a_stopped_object_store_is_typed(stopped_store) -> None:  # type: ignore[no-untyped-def]
    store, env = stopped_store
    files = files_from_env(store, env)
    assert files is not None
    with pytest.raises(OSError) as raised:
        files.fs.get_file_info(files.path("rows/_delta_log"))
    typed = store_failure(raised.value, store)
    assert isinstance(typed, ObjectStoreUnreachableError) and store in str(typed)
    assert store_failure(ValueError("not the store"), store) is None
    # a Spark task's pyarrow error, inside the batch's own typed error (seen in a live pipeline's outage)
    from deltawheel.executor.exceptions import BatchFailedError

    try:
        raise BatchFailedError("user_minutes batch 1 failed in a Spark task") from raised.value
    except BatchFailedError as in_task:
        assert isinstance(store_failure(in_task, store), ObjectStoreUnreachableError)
    # the server answering 500 while its disk was full (the text pyarrow gave in a chaos run)
    full = OSError("When uploading object with key 'store/rows/part-1.parquet' in bucket 'b': AWS Error "
                   "INTERNAL_FAILURE during PutObject operation: An internal error occurred. Try again.")
    typed = store_failure(full, store)
    assert isinstance(typed, ObjectStoreUnreachableError) and "failed a request" in str(typed)


@pytest.mark.spark
def test_a_replay_or_diff_of_a_store_that_does_not_answer_is_not_told_it_is_no_store(  # type: ignore[no-untyped-def]
        spark, stopped_store) -> None:
    """Before, the replay tool read its store's history, failed, and said "has no rows table: not a
    deltawheel store" of a store whose server was down for seconds; a diff took a stream table it
    could not read for one that received nothing."""
    from deltawheel.statestore.inspection.diff import _read
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.objectstore.s3a import configure_bucket, endpoint_from_env

    store, env = stopped_store
    ep = endpoint_from_env(env)
    assert ep is not None
    layout = StoreLayout(store)
    configure_bucket(spark, ep, store.split("/")[2])
    with pytest.raises(ObjectStoreUnreachableError, match=f"no object store answers for {store}"):
        computation_commits(spark, layout, "model")
    with pytest.raises(ObjectStoreUnreachableError, match="no object store answers"):
        _read(spark, layout.stream("out"), None, "the live store")
    # a pipeline's start makes the stream tables it reads: not "clear that path" (a ConfigError, exit 3)
    from deltawheel.statestore.writepath.streams import ensure_stream_table

    with pytest.raises(ObjectStoreUnreachableError, match="no object store answers"):
        ensure_stream_table(spark, layout, "changes")


def test_a_commit_whose_log_entry_the_store_lost_is_a_store_failure(spark) -> None:  # type: ignore[no-untyped-def]
    """Delta's check of a commit file the store just took (S3Proxy over a full disk lost it) ends
    in Hadoop's FileNotFoundException: a store failure (exit 5, run again), not a traceback; the
    same exception about another table's log, or a data file, stays untyped."""
    from deltawheel.statestore.objectstore.errors import translate
    from py4j.protocol import Py4JJavaError

    def java(message: str) -> Py4JJavaError:
        return Py4JJavaError("An error occurred while calling o724.commit.\n",
                             spark._jvm.java.io.FileNotFoundException(message))

    lost = java("No such file or directory: s3a://chaos/store/rows/_delta_log/00000000000000000161.json")
    typed = translate(lost, "s3a://chaos/store")
    assert isinstance(typed, ObjectStoreUnreachableError) and "00000000000000000161.json" in str(typed)
    assert translate(java("No such file or directory: s3a://other/t/_delta_log/00000000000000000001.json"),
                     "s3a://chaos/store") is None
    assert translate(java("No such file or directory: s3a://chaos/store/rows/computation=a/part-0.parquet"),
                     "s3a://chaos/store") is None
    # a live query's error keeps the batch's Java error as text only (a chaos run's window_sums ended so)
    ended = Exception("An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
                      "call last):\n  ...\npy4j.protocol.Py4JJavaError: An error occurred while calling "
                      "o23816.commit.\n: java.io.FileNotFoundException: No such file or directory: "
                      "s3a://chaos/store/computations/window_sums/rows/_delta_log/00000000000000000052.json\n"
                      "\tat org.apache.hadoop.fs.s3a.S3AFileSystem.s3GetFileStatus(S3AFileSystem.java:4091)")
    typed = translate(ended, "s3a://chaos/store")
    assert isinstance(typed, ObjectStoreUnreachableError) and "00000000000000000052.json" in str(typed)
    assert "S3AFileSystem" not in str(typed)
