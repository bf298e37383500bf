"""``deltawheel history --store s3a://...``: the same versions as for a local store, read from the
object store without Spark (its settings from ``$DELTAWHEEL_S3_ENDPOINT`` and its keys); a store
whose object store refuses is a typed error. Real S3Proxy (tests/conftest.py), real Spark and
ZooKeeper to write the rows."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.objectstore import s3a
from history_util import expected_states, run_batches

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk, pytest.mark.objectstore]


def _env(monkeypatch: Any, endpoint: Any, *, secret: str | None = None) -> None:
    monkeypatch.setenv(s3a.ENV_ENDPOINT, endpoint.url)
    monkeypatch.setenv(s3a.ENV_ACCESS_KEY, endpoint.access_key)
    monkeypatch.setenv(s3a.ENV_SECRET_KEY, secret or endpoint.secret_key)


def _history(capsys: Any, store: str, key: str, *more: str) -> tuple[int, str, str]:
    rc = main(["history", "--store", store, "--computation", "summer", "--key", key, *more])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def copied(spark, zk_server, object_store, tmp_path_factory) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """(a local store the Summer batches ran on, the same store copied to S3Proxy as ``s3a://``)."""
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from pyarrow import fs as pafs

    from deltawheel import migrations

    layout = StoreLayout(str(tmp_path_factory.mktemp("hist-s3") / "store"))
    migrations.apply(spark, layout, dry_run=False)
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)
    run_batches(spark, layout, zk, write_path="image")
    bucket = "dw-history"
    object_store.create_bucket(bucket)
    prefix = f"{bucket}/{uuid.uuid4().hex}"
    files = s3a.files_from_env(f"s3a://{prefix}", {s3a.ENV_ENDPOINT: object_store.endpoint.url,
                                                   s3a.ENV_ACCESS_KEY: object_store.endpoint.access_key,
                                                   s3a.ENV_SECRET_KEY: object_store.endpoint.secret_key})
    assert files is not None and not files.is_local
    pafs.copy_files(layout.root, prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=files.fs)
    return layout.root, f"s3a://{prefix}"


def test_history_of_an_s3a_store_is_the_local_one(copied, object_store, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    local, remote = copied
    _env(monkeypatch, object_store.endpoint)
    for key in "bcf":
        rc, out_local, err = _history(capsys, local, key, "--json")
        assert rc == 0, err
        rc, out_remote, err = _history(capsys, remote, key, "--json")
        assert rc == 0, err
        # a commit's time is its log file's modification time: the copy's are the upload's
        drop = ("commit_time", "commit_time_ms")
        want = [{k: v for k, v in json.loads(line).items() if k not in drop} for line in out_local.splitlines()]
        got = [{k: v for k, v in json.loads(line).items() if k not in drop} for line in out_remote.splitlines()]
        assert got == want and len(got) >= 2, key
    rc, out, err = _history(capsys, remote, "b", "--limit", "2")
    assert rc == 0 and out.splitlines()[-1] == "(2 rows)" and '{"n": 1, "sum": 9}' in out, out + err
    assert "summer/b: 2 version(s) shown" in err


def test_history_of_an_s3a_store_says_what_is_wrong(copied, object_store, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import BucketMissingError, ObjectStoreAuthError, ObjectStoreError
    from deltawheel.statestore.objectstore.errors import pyarrow_error

    _local, remote = copied
    _env(monkeypatch, object_store.endpoint)
    rc, _out, err = _history(capsys, f"{remote}-none", "b")
    assert rc == 3 and "NotAStoreError" in err and "holds no rows table" in err, err
    rc, _out, err = _history(capsys, "s3a://no-such-bucket-dw/store", "b")
    assert rc == 5 and "BucketMissingError" in err and "'no-such-bucket-dw'" in err, err
    _env(monkeypatch, object_store.endpoint, secret="not-the-secret")
    rc, _out, err = _history(capsys, remote, "b")
    assert rc == 5 and "ObjectStoreAuthError" in err and "refused the credentials" in err, err
    monkeypatch.setenv(s3a.ENV_ENDPOINT, "http://127.0.0.1:1")  # nothing listens there
    rc, _out, err = _history(capsys, remote, "b")
    assert rc == 5 and "ObjectStoreUnreachableError: no object store answers for" in err, err
    with pytest.raises(BucketMissingError, match="bucket 'b' of s3a://b/s does not exist"):
        raise pyarrow_error(OSError("AWS Error NO_SUCH_BUCKET during ListObjectsV2"), "s3a://b/s")
    with pytest.raises(ObjectStoreAuthError, match="refused the credentials for s3a://b/s"):
        raise pyarrow_error(OSError("AWS Error ACCESS_DENIED during ListObjectsV2"), "s3a://b/s")
    with pytest.raises(ObjectStoreError, match="reading s3a://b/s failed: AWS Error SLOW_DOWN"):
        raise pyarrow_error(OSError("AWS Error SLOW_DOWN"), "s3a://b/s")


@pytest.mark.slow  # the batches committed to the object store, and a Spark read of the state_history view
@pytest.mark.timeout(1200)
def test_history_of_a_pipeline_run_on_an_s3a_store(spark, zk_server, migrated_s3_store, object_store,  # type: ignore[no-untyped-def]
                                                   capsys, monkeypatch) -> None:
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.delta.storefs import table_files
    from deltawheel.statestore.inspection.sqlviews import register_views

    layout = migrated_s3_store
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)
    after = run_batches(spark, layout, zk, write_path="image")
    capsys.readouterr()  # the executor's progress lines
    expected = expected_states()
    _env(monkeypatch, object_store.endpoint)
    rc, out, err = _history(capsys, layout.root, "c", "--json")
    assert rc == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    # c: 3, 9, 11, then reset in batch 5 (newest first)
    states = [None if g["row"] is None else g["row"]["state"] for g in got]
    assert [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]] == [
        None, expected[3]["c"][0], expected[1]["c"][0], expected[0]["c"][0]]
    assert got[0]["change"] == "delete" and got[-1]["change"] == "insert" and got[0]["version"] <= after[-1]
    # the state_history view (Spark's read of the same log) lists the same versions
    assert table_files(spark, layout.rows_of("summer")) is not None
    register_views(spark, layout)
    rows = spark.sql("SELECT version, change FROM state_history WHERE computation = 'summer' AND key = 'c' "
                     "ORDER BY version DESC").collect()
    assert [(r["version"], r["change"]) for r in rows] == [(g["version"], g["change"]) for g in got]


def test_files_from_env_reaches_what_the_session_reaches(tmp_path: Path) -> None:
    env = {s3a.ENV_ENDPOINT: "https://s3.example:9443", s3a.ENV_ACCESS_KEY: "k", s3a.ENV_SECRET_KEY: "s"}
    f = s3a.files_from_env("s3a://bkt/a/b", env)
    assert f is not None and f.s3 is not None and (f.root, f.s3.scheme, f.s3.endpoint) == ("bkt/a/b", "https", "s3.example:9443")
    f = s3a.files_from_env("s3a://bkt/a", {})
    assert f is not None and f.s3 is not None and f.s3.endpoint is None  # AWS, pyarrow's credential chain
    assert s3a.files_from_env("abfss://c@a.dfs.core.windows.net/x", env) is None
    from deltawheel.statestore.exceptions import ConfigError

    with pytest.raises(ConfigError, match="DELTAWHEEL_S3_ENDPOINT is set but"):
        s3a.files_from_env("s3a://bkt/a", {s3a.ENV_ENDPOINT: "http://x:1"})
