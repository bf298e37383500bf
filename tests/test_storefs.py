"""The fast path's file-system seam (statestore/delta/storefs.py) on a local folder and on the real
object store: the same calls, the same answers."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from deltawheel.statestore.delta.log import commit_info, json_commit_versions, read_snapshot
from deltawheel.statestore.delta.storefs import S3Settings, TableFiles, files_for, table_files

pytestmark = pytest.mark.spark


@pytest.fixture(params=["local", pytest.param("s3a", marks=pytest.mark.objectstore)])
def folder(request, spark, tmp_path) -> TableFiles:  # type: ignore[no-untyped-def]
    if request.param == "local":
        return TableFiles(str(tmp_path / "t"))
    files = table_files(spark, f"s3a://{request.getfixturevalue('s3_bucket')}/{uuid.uuid4().hex}/t")
    assert files is not None and not files.is_local and files.s3 is not None and files.s3.endpoint
    return files


def test_files_written_are_read_listed_and_sized_alike(folder: TableFiles) -> None:
    table = pa.table({"key": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.int64())})
    size = folder.write_parquet(table, "computation=c/interval=0/part-0.parquet")
    assert size > 0 and folder.size("computation=c/interval=0/part-0.parquet") == size
    assert folder.read_parquet("computation=c/interval=0/part-0.parquet").equals(table)
    assert folder.read_parquet("computation=c/interval=0/part-0.parquet", columns=["n"]).column_names == ["n"]
    assert folder.read_schema("computation=c/interval=0/part-0.parquet") == table.schema
    assert folder.parquet_file("computation=c/interval=0/part-0.parquet").read().equals(table)
    sub = folder.sub("computation=c/interval=0")
    assert sub.listdir() == ["part-0.parquet"]
    assert [(n, s) for n, s, _mtime in sub.list_files() or ()] == [("part-0.parquet", size)]
    assert folder.listdir("missing") is None and folder.read_text("missing.json") is None
    with pytest.raises(FileNotFoundError):
        folder.size("missing.parquet")


def test_a_delta_log_is_replayed_from_either_store(spark, folder: TableFiles) -> None:  # type: ignore[no-untyped-def]
    """The log written by Delta (through the JVM) is read back in Python: versions, live files,
    commit infos."""
    uri = folder.root if folder.is_local else f"s3a://{folder.root}"
    spark.range(3).selectExpr("id", "cast(id AS STRING) AS s").write.format("delta").save(uri)
    spark.range(3, 5).selectExpr("id", "cast(id AS STRING) AS s").write.format("delta").mode("append").save(uri)
    snap = read_snapshot(folder)
    assert snap is not None and snap.version == 1 and len(snap.adds) >= 2
    assert json_commit_versions(folder) == [0, 1]
    info = commit_info(folder, 1)
    assert info is not None and info["operation"] == "WRITE"
    live = {a["path"] for a in snap.adds}
    assert all(folder.size(p) > 0 for p in live)


def test_only_local_and_s3a_stores_are_reached() -> None:
    assert files_for("abfss://c@acct.dfs.core.windows.net/store") is None
    assert files_for("s3://bucket/store") is None
    s3 = files_for("s3a://bucket/store/rows/", S3Settings(endpoint="127.0.0.1:9000", scheme="http"))
    assert s3 is not None and s3.root == "bucket/store/rows" and s3.path("_delta_log") == "bucket/store/rows/_delta_log"
    assert files_for("file:///data/store") == TableFiles("/data/store")
    # per-bucket settings win over the general ones, as in s3a
    conf = {"fs.s3a.endpoint": "https://s3.example.com", "fs.s3a.bucket.b.endpoint": "http://127.0.0.1:9",
            "fs.s3a.bucket.b.path.style.access": "true", "fs.s3a.access.key": "general"}
    b = S3Settings.from_hadoop(conf.get, "b")
    other = S3Settings.from_hadoop(conf.get, "other")
    assert (b.endpoint, b.scheme, b.path_style, b.access_key) == ("127.0.0.1:9", "http", True, "general")
    assert (other.endpoint, other.scheme, other.path_style) == ("s3.example.com", "https", False)


def test_a_buckets_settings_are_read_once_and_again_after_they_change(spark) -> None:  # type: ignore[no-untyped-def]
    """A bucket's S3 settings come from the session's Hadoop configuration, read at its first use
    (not at every commit); a bucket configured again is read again, another bucket keeps its own."""
    from deltawheel.statestore.delta.jvm import jsession
    from deltawheel.statestore.objectstore.client import S3Endpoint
    from deltawheel.statestore.objectstore.s3a import configure_bucket, s3a_settings, set_hadoop

    a, b = f"cfg-{uuid.uuid4().hex[:8]}", f"cfg-{uuid.uuid4().hex[:8]}"
    configure_bucket(spark, S3Endpoint("http://127.0.0.1:9101", "ka", "sa"), a)
    configure_bucket(spark, S3Endpoint("http://127.0.0.1:9102", "kb", "sb"), b)
    first = table_files(spark, f"s3a://{a}/store")
    assert first is not None and first.s3 is not None
    assert (first.s3.endpoint, first.s3.access_key, first.root) == ("127.0.0.1:9101", "ka", f"{a}/store")
    conf = jsession(spark).sessionState().conf()
    conf.setConfString(f"fs.s3a.bucket.{a}.access.key", "set-behind-its-back")  # not through set_hadoop
    again = table_files(spark, f"s3a://{a}/rows")
    assert again is not None and again.s3 is first.s3  # the settings read before, not the Hadoop keys again
    configure_bucket(spark, S3Endpoint("https://127.0.0.1:9103", "ka2", "sa2"), a)
    moved = table_files(spark, f"s3a://{a}/store")
    assert moved is not None and moved.s3 is not None
    assert (moved.s3.endpoint, moved.s3.scheme, moved.s3.access_key) == ("127.0.0.1:9103", "https", "ka2")
    other = table_files(spark, f"s3a://{b}/store")
    assert other is not None and other.s3 is not None and other.s3.access_key == "kb"
    ep = S3Endpoint("http://127.0.0.1:9", "k", "s")
    set_hadoop(spark, {k: None for x in (a, b) for k in s3a_settings(ep, x)})  # the session as it was


@pytest.mark.objectstore
def test_an_s3_file_goes_up_in_one_put_and_a_failed_upload_still_raises(object_store, s3_bucket, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A new file goes up in one signed PUT without ``Expect: 100-continue`` (pyarrow's client waits
    for the server's ``100 Continue`` before the body: a round trip more), through a kept-alive
    connection that is opened again when it was dropped; a file above ``SIGNED_PUT_MAX`` goes
    through pyarrow. Seen on the wire between the writer and S3Proxy. A refused upload raises from
    ``write_parquet`` itself, so nothing names a file that did not land."""
    import re
    from urllib.parse import urlsplit

    from deltawheel.statestore.delta import storefs
    from wire_util import Relay

    ep = object_store.endpoint
    url = urlsplit(ep.url)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 80))
    s3 = S3Settings(endpoint=relay.address, scheme="http", access_key=ep.access_key, secret_key=ep.secret_key,
                    path_style=True)
    files = TableFiles(f"{s3_bucket}/{uuid.uuid4().hex}/t", s3)
    direct = TableFiles(files.root, S3Settings(endpoint=url.netloc, scheme="http", access_key=ep.access_key,
                                               secret_key=ep.secret_key, path_style=True))
    table = pa.table({"n": pa.array([1, 2, 3], pa.int64()), "s": pa.array(["a", "b=c", "d e"])})
    names = ["interval=3/part a%+b.parquet", "two.parquet"]
    assert files.write_parquet(table, names[0]) == direct.size(names[0]) > 0
    relay.cut()  # the kept-alive connection is gone: the next PUT opens one
    files.write_text("_delta_log/x.json", '{"add": 1}')
    files.write_parquet(table, names[1])
    monkeypatch.setattr(storefs, "SIGNED_PUT_MAX", 10)
    files.write_parquet(table, "big.parquet")
    for name in [*names, "big.parquet"]:
        assert direct.read_parquet(name).equals(table), name
    assert direct.read_text("_delta_log/x.json") == '{"add": 1}'
    heads = {m.group(1).decode(): m.group(2).lower() for m in
             re.finditer(rb"PUT /[^ ]*/t/([^ ?]+)[ ?][^\r]*\r\n(.*?)\r\n\r\n", bytes(relay.seen), re.S)}
    assert set(heads) == {"interval%3D3/part%20a%25%2Bb.parquet", "_delta_log/x.json", "two.parquet",
                          "big.parquet"}, bytes(relay.seen)[:3000]
    for name, head in heads.items():
        assert (b"expect: 100-continue" in head) is (name == "big.parquet"), name
    monkeypatch.setattr(storefs, "SIGNED_PUT_MAX", 16 << 20)
    # temporary credentials (fs.s3a.session.token): the token goes along, signed (S3Proxy has no tokens: it
    # refuses the header, at once; not tried again as a server error would be)
    with_token = TableFiles(files.root, S3Settings(endpoint=relay.address, scheme="http", access_key=ep.access_key,
                                                   secret_key=ep.secret_key, session_token="tok-1", path_style=True))
    before = len(relay.seen)
    with pytest.raises(OSError, match="HTTP 501"):
        with_token.write_text("token.json", "{}")
    assert bytes(relay.seen[before:]).count(b"PUT ") == 1
    head = re.search(rb"PUT /[^ ]*/t/token.json [^\r]*\r\n(.*?)\r\n\r\n", bytes(relay.seen), re.S)
    assert head is not None and b"x-amz-security-token: tok-1" in head.group(1).lower()
    assert re.search(rb"signedheaders=[^,]*x-amz-security-token", head.group(1).lower())
    wrong = TableFiles(files.root, S3Settings(endpoint=url.netloc, scheme="http", access_key=ep.access_key,
                                              secret_key="wrong", path_style=True))
    with pytest.raises(OSError, match=r"HTTP 403 \(check fs.s3a.access.key and fs.s3a.secret.key\)"):
        wrong.write_parquet(table, "x.parquet")
    with pytest.raises(FileNotFoundError):
        direct.size("x.parquet")
    missing = TableFiles(f"no-such-bucket-{uuid.uuid4().hex[:8]}/t", direct.s3)
    with pytest.raises(OSError, match="NoSuchBucket"):
        missing.write_parquet(table, "x.parquet")


@pytest.mark.objectstore
def test_behind_an_s3a_proxy_every_request_goes_through_it(object_store, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """With ``fs.s3a.proxy.host`` and ``.port`` set, as S3A is configured, the Python side reaches the store
    through that proxy too: small files (otherwise our own signed PUT, which takes no proxy) and large
    ones go up and are read back through it, in a proxy's absolute-form requests."""
    import re
    from urllib.parse import urlsplit

    from wire_util import Relay

    ep = object_store.endpoint
    url = urlsplit(ep.url)
    proxy = Relay((url.hostname or "127.0.0.1", url.port or 80))
    host, port = proxy.address.split(":")
    conf = {"fs.s3a.endpoint": ep.url, "fs.s3a.access.key": ep.access_key, "fs.s3a.secret.key": ep.secret_key,
            "fs.s3a.path.style.access": "true", f"fs.s3a.bucket.{s3_bucket}.proxy.host": host,
            f"fs.s3a.bucket.{s3_bucket}.proxy.port": port}
    files = TableFiles(f"{s3_bucket}/{uuid.uuid4().hex}/t", S3Settings.from_hadoop(conf.get, s3_bucket))
    table = pa.table({"n": pa.array(range(1000), pa.int64())})
    files.write_text("_delta_log/0.json", '{"add": 1}')
    files.write_parquet(table, "part-0.parquet")
    assert files.read_text("_delta_log/0.json") == '{"add": 1}' and files.read_parquet("part-0.parquet").equals(table)
    wire = bytes(proxy.seen)
    for name in ("_delta_log/0.json", "part-0.parquet"):
        # (a request may follow a body that ends without a line break)
        assert re.search(rb"PUT http://%s/\S*/t/%s " % (url.netloc.encode(), re.escape(name.encode())), wire), name
        assert re.search(rb"GET http://\S*/t/%s " % re.escape(name.encode()), wire), name


@pytest.mark.objectstore
def test_background_uploads_are_all_landed_when_the_block_ends(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """Inside ``background_uploads`` the S3 PUTs run while the caller goes on; leaving the block
    waits for every one, and a failed PUT is raised there (after the others landed), so what
    follows the block (an image task's summary, the driver's commit) names only complete files."""
    from deltawheel.statestore.delta.storefs import background_uploads

    files = table_files(spark, f"s3a://{s3_bucket}/{uuid.uuid4().hex}/t")
    assert files is not None
    tables = {f"f{i}.parquet": pa.table({"n": pa.array(range(i * 1000, (i + 1) * 1000), pa.int64())})
              for i in range(6)}
    with background_uploads():
        sizes = {rel: files.write_parquet(t, rel) for rel, t in tables.items()}
    for rel, t in tables.items():  # every file complete, of the size returned inside the block
        assert files.size(rel) == sizes[rel] and files.read_parquet(rel).equals(t)
    missing = TableFiles(f"no-such-bucket-{uuid.uuid4().hex[:8]}/t", files.s3)
    with pytest.raises(OSError), background_uploads():
        missing.write_parquet(tables["f0.parquet"], "x.parquet")  # returns: its PUT fails later
        files.write_parquet(tables["f1.parquet"], "after.parquet")
    assert files.read_parquet("after.parquet").equals(tables["f1.parquet"])  # waited for, though one failed
    with pytest.raises(ZeroDivisionError), background_uploads():  # the block's own error wins
        missing.write_parquet(tables["f0.parquet"], "y.parquet")
        raise ZeroDivisionError
    # a block inside another joins it (an image task running its claimed intervals one by one):
    # the inner block's end does not wait, the outer block's end waits for and raises its PUTs
    reached = []
    with pytest.raises(OSError), background_uploads():
        with background_uploads():
            missing.write_parquet(tables["f0.parquet"], "n.parquet")
        reached.append(True)
        files.write_parquet(tables["f2.parquet"], "nested-after.parquet")
    assert reached == [True]
    assert files.read_parquet("nested-after.parquet").equals(tables["f2.parquet"])
    # outside the block a write is synchronous again: its failure is raised by the call itself
    with pytest.raises(OSError):
        missing.write_parquet(tables["f0.parquet"], "z.parquet")
