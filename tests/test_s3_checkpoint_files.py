"""Spark's checkpoint files on the object store are written in place (one PUT), not written and
renamed: a streaming query's offset and commit logs and Delta's checksum files, with the same
atomicity (a cancelled file never appears) and the same refusal to overwrite."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from deltawheel.statestore.delta.jvm import jsession, jvm
from deltawheel.statestore.objectstore.logstore import DIRECT_CHECKPOINT_MANAGER_CLASS
from py4j.protocol import Py4JJavaError
from wire_util import Relay

pytestmark = [pytest.mark.objectstore, pytest.mark.spark, pytest.mark.zk]


def _fs(spark, uri: str):  # type: ignore[no-untyped-def]
    path = jvm(spark).org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(jsession(spark).sessionState().newHadoopConf())


def _stat(fs, name: str) -> int:  # type: ignore[no-untyped-def]
    v = fs.getStorageStatistics().getLong(name)
    return int(v) if v is not None else 0


def _stacks(j, names: tuple[str, ...]) -> str:  # type: ignore[no-untyped-def]
    """The JVM's threads whose names hold one of ``names``, with their stacks."""
    out = []
    for entry in j.java.lang.Thread.getAllStackTraces().entrySet().toArray():
        name = str(entry.getKey().getName())
        if any(n in name.lower() for n in names):
            frames = "\n    ".join(str(f) for f in entry.getValue())
            out.append(f"{name} ({entry.getKey().getState()})\n    {frames}")
    return "\n".join(out)


def _manager(spark, uri: str):  # type: ignore[no-untyped-def]
    """The session's checkpoint file manager for ``uri``, as Spark makes it."""
    j = jvm(spark)
    mgr = j.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return mgr.create(j.org.apache.hadoop.fs.Path(uri), jsession(spark).sessionState().newHadoopConf())


def test_a_streaming_query_on_the_object_store_keeps_its_checkpoint_without_renames(
        spark, s3_bucket, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A user's own query: JSON files in, a Delta table on the store out, its checkpoint on the
    store. Its logs and the table's checksums land without a single rename or copy, and a
    restart goes on from the checkpoint (the second run reads only the new file)."""
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == DIRECT_CHECKPOINT_MANAGER_CLASS
    base = f"s3a://{s3_bucket}/cfm-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "in"
    src.mkdir()
    fs = _fs(spark, base)

    def run(name: str, rows: list[dict[str, int]]) -> None:
        (src / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        q = (spark.readStream.schema("k long, v long").json(str(src)).writeStream.format("delta")
             .option("checkpointLocation", f"{base}/_checkpoint").trigger(availableNow=True).start(f"{base}/out"))
        q.awaitTermination(300)
        assert q.exception() is None

    renames, copies = _stat(fs, "op_rename"), _stat(fs, "object_copy_requests")
    run("a", [{"k": 1, "v": 10}, {"k": 2, "v": 20}])
    run("b", [{"k": 3, "v": 30}])
    assert (_stat(fs, "op_rename"), _stat(fs, "object_copy_requests")) == (renames, copies)
    out = sorted((r.k, r.v) for r in spark.read.format("delta").load(f"{base}/out").collect())
    assert out == [(1, 10), (2, 20), (3, 30)]  # the second run did not read a.json again
    for f in ("offsets/0", "offsets/1", "commits/0", "commits/1"):
        assert fs.exists(jvm(spark).org.apache.hadoop.fs.Path(f"{base}/_checkpoint/{f}")), f
    crc = jvm(spark).org.apache.hadoop.fs.Path(f"{base}/out/_delta_log/{1:020d}.crc")
    assert fs.exists(crc)


def test_a_cancelled_file_never_appears_and_an_existing_one_is_not_overwritten(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    uri = f"s3a://{s3_bucket}/cfm-{uuid.uuid4().hex[:8]}/offsets/0"
    j = jvm(spark)
    path = j.org.apache.hadoop.fs.Path(uri)
    mgr = _manager(spark, uri)
    assert mgr.getClass().getName() == DIRECT_CHECKPOINT_MANAGER_CLASS
    out = mgr.createAtomic(path, False)
    out.write(bytearray(b"half a file"))
    out.cancel()
    assert not mgr.exists(path)
    out = mgr.createAtomic(path, False)
    out.write(bytearray(b"v1"))
    out.close()
    assert mgr.exists(path)
    refused = mgr.createAtomic(path, False)
    refused.write(bytearray(b"v0"))
    with pytest.raises(Py4JJavaError) as err:  # the upload's If-None-Match refuses it
        refused.close()
    assert "FileAlreadyExistsException" in str(err.value.java_exception.getClass().getName())
    again = mgr.createAtomic(path, True)  # overwriting is allowed when asked for
    again.write(bytearray(b"v2"))
    again.close()
    stream = mgr.open(path)
    assert j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8") == "v2"
    stream.close()


def test_of_two_writers_of_one_offset_file_only_the_first_lands(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """A zombie query and its successor both write ``offsets/7`` (the zombie paused between its
    checks and its upload): the object store refuses the second upload, as a local folder's link
    refuses it, and the file keeps the first writer's content."""
    uri = f"s3a://{s3_bucket}/cfm-{uuid.uuid4().hex[:8]}/offsets/7"
    j = jvm(spark)
    path = j.org.apache.hadoop.fs.Path(uri)
    first, second = _manager(spark, uri), _manager(spark, uri)
    a, b = first.createAtomic(path, False), second.createAtomic(path, False)  # both checks pass
    a.write(bytearray(b"successor"))
    b.write(bytearray(b"zombie"))
    a.close()
    with pytest.raises(Py4JJavaError) as err:
        b.close()
    assert "FileAlreadyExistsException" in str(err.value.java_exception.getClass().getName())
    stream = first.open(path)
    assert j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8") == "successor"
    stream.close()


def test_a_store_without_conditional_writes_gets_the_probe(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """``fs.s3a.create.conditional.enabled=false``: the file is written, and one that is there is
    refused before the upload, by S3A's existence probe."""
    j = jvm(spark)
    uri = f"s3a://{s3_bucket}/cfm-{uuid.uuid4().hex[:8]}/offsets/0"
    conf = jsession(spark).sessionState().newHadoopConf()
    conf.set("fs.s3a.create.conditional.enabled", "false")
    conf.set("fs.s3a.impl.disable.cache", "true")  # a file system of its own, with the setting
    path = j.org.apache.hadoop.fs.Path(uri)
    mgr = j.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(path, conf)
    out = mgr.createAtomic(path, False)
    out.write(bytearray(b"v1"))
    out.close()
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        mgr.createAtomic(path, False)
    mgr.fs().close()


def test_a_delta_checksum_file_is_one_put_without_probes(spark, s3_bucket, object_store) -> None:  # type: ignore[no-untyped-def]
    """Delta's N.crc is written once, after commit N, from that version's state: it is one PUT
    with no existence probe (a HEAD and a LIST on S3A), uploaded in the background, signed by the
    log store (seen on the wire). A file that must not be overwritten (a query's offset log, a
    table log's file that is not a checksum) is one PUT too, refused by the store when the file is
    there. Spark's check that a log's next file is not there yet is one HEAD."""
    j = jvm(spark)
    base = f"s3a://{s3_bucket}/cfm-{uuid.uuid4().hex[:8]}"
    # the session's S3A first: made after the relay's, its PUT count stayed 0 (run alone)
    _manager(spark, base).fs()
    url = urlsplit(object_store.endpoint.url)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 80))
    conf = jsession(spark).sessionState().newHadoopConf()
    conf.set(f"fs.s3a.bucket.{s3_bucket}.endpoint", f"http://{relay.address}")
    conf.set("fs.s3a.impl.disable.cache", "true")

    def checksum(body: bytes = b'{"tableSizeBytes": 1}', version: int = 3) -> tuple[int, int, list[bytes]]:
        """HEADs, LISTs and the PUTs' headers on the wire for one N.crc (waiting for its upload)."""
        seen, path = len(relay.seen), j.org.apache.hadoop.fs.Path(f"{base}/t/_delta_log/{version:020d}.crc")
        out = j.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
            path, conf).createAtomic(path, False)
        out.write(bytearray(body))
        out.close()
        deadline = time.monotonic() + 90
        while (len(relay.seen) - seen < len(body) or b"\r\nPUT " not in b"\r\n" + bytes(relay.seen[seen:])) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the store's answer; a request after it would show
        wire = bytes(relay.seen[seen:])
        puts = re.findall(rb"^PUT [^ ]*\.crc[^\r]*\r\n(.*?)\r\n\r\n", wire, re.M | re.S)
        return (len(re.findall(rb"^HEAD ", wire, re.M)), len(re.findall(rb"^GET [^ ]*list-type", wire, re.M)),
                [p.lower() for p in puts])

    def write(rel: str, body: bytes) -> tuple[int, int, int]:
        uri = f"{base}/{rel}"
        counts = ("object_metadata_request", "object_list_request", "object_put_request")
        mgr = _manager(spark, uri)
        fs = mgr.fs()  # the manager's own file system: its requests are counted there
        before = [_stat(fs, c) for c in counts]
        out = mgr.createAtomic(j.org.apache.hadoop.fs.Path(uri), False)
        out.write(bytearray(body))
        out.close()
        # a checksum's upload: its count lands when the upload ends; in two of five suite runs one took
        # longer than 20 s (what it waited on is reported below when it does not end at all)
        deadline = time.monotonic() + 90
        while _stat(fs, counts[2]) == before[2] and time.monotonic() < deadline:
            time.sleep(0.02)
        after = [_stat(fs, c) for c in counts]
        if after[2] == before[2]:  # what the upload waits on, for the failure's report
            failed = j.io.deltawheel.storage.DirectCheckpointFileManager.lastChecksumFailure()
            uploads.append(f"last failed checksum upload: {failed}\n" + _stacks(j, ("checksum", "s3a", "aws", "sdk")))
        return after[0] - before[0], after[1] - before[1], after[2] - before[2]

    uploads: list[str] = []
    heads, lists, puts = checksum()
    assert (heads, lists, len(puts)) == (0, 0, 1), j.io.deltawheel.storage.DirectCheckpointFileManager.lastChecksumFailure()
    assert b"java-http-client" in puts[0] and b"authorization: aws4-hmac-sha256" in puts[0]
    threads = j.java.lang.Thread.getAllStackTraces().keySet().toArray()
    assert "deltawheel-checksum-upload" in {str(t.getName()) for t in threads}  # not the committing thread
    heads, lists, puts = checksum()  # rewritten, not refused
    assert (heads, lists, len(puts)) == (0, 0, 1)
    assert write("q/offsets/0", b"v1") == (0, 0, 1)
    assert write("t/_delta_log/_last_checkpoint", b"{}") == (0, 0, 1)
    for rel in ("q/offsets/0", "t/_delta_log/_last_checkpoint"):  # refused, not rewritten as a checksum is
        out = _manager(spark, f"{base}/{rel}").createAtomic(j.org.apache.hadoop.fs.Path(f"{base}/{rel}"), False)
        out.write(bytearray(b"again"))
        with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
            out.close()
    mgr = _manager(spark, f"{base}/q/offsets/1")
    for rel, there in (("q/offsets/1", False), ("q/offsets/0", True)):
        before = [_stat(mgr.fs(), c) for c in ("object_metadata_request", "object_list_request")]
        assert mgr.exists(j.org.apache.hadoop.fs.Path(f"{base}/{rel}")) is there
        after = [_stat(mgr.fs(), c) for c in ("object_metadata_request", "object_list_request")]
        assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0], rel  # one HEAD, no LIST
    assert mgr.exists(j.org.apache.hadoop.fs.Path(f"{base}/q/offsets"))  # a folder: S3A's own probes
    assert write("q/sources/0/0", b"v1") == (0, 0, 1)
    assert mgr.exists(j.org.apache.hadoop.fs.Path(f"{base}/q/sources/0"))  # a source log's folder, named 0
    stream = _fs(spark, base).open(j.org.apache.hadoop.fs.Path(f"{base}/t/_delta_log/{3:020d}.crc"))
    assert j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8") == '{"tableSizeBytes": 1}'
    stream.close()
    heads, lists, puts = checksum(b"x" * (17 << 20), 4)  # over the signed PUT's 16 MiB: S3A's
    assert (heads, lists, len(puts)) == (0, 0, 1) and b"amz-sdk-invocation-id" in puts[0]
    assert _fs(spark, base).getFileStatus(j.org.apache.hadoop.fs.Path(f"{base}/t/_delta_log/{4:020d}.crc")).getLen() == 17 << 20


def test_a_small_upload_goes_without_waiting_for_100_continue(spark, s3_bucket, object_store) -> None:  # type: ignore[no-untyped-def]
    """The AWS SDK asks for ``Expect: 100-continue`` on every upload, a round trip before the body.
    deltawheel's sessions drop it from uploads up to 1 MiB (a commit's files, a query's offsets) and
    keep it for larger ones: seen on the wire, between S3A and S3Proxy."""
    j = jvm(spark)
    url = urlsplit(object_store.endpoint.url)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 80))
    conf = jsession(spark).sessionState().newHadoopConf()
    conf.set(f"fs.s3a.bucket.{s3_bucket}.endpoint", f"http://{relay.address}")
    conf.set("fs.s3a.impl.disable.cache", "true")
    base = f"s3a://{s3_bucket}/expect-{uuid.uuid4().hex[:8]}"
    fs = j.org.apache.hadoop.fs.Path(base).getFileSystem(conf)
    for name, size in (("small", 1000), ("large", 2 << 20)):
        out = fs.create(j.org.apache.hadoop.fs.Path(f"{base}/{name}"), True)
        out.write(bytearray(b"x" * size))
        out.close()
    fs.close()
    heads = {m.group(1).decode(): m.group(2).lower() for m in
             re.finditer(rb"PUT /[^ ]*?/(small|large)[ ?][^\r]*\r\n(.*?)\r\n\r\n", bytes(relay.seen), re.S)}
    assert set(heads) == {"small", "large"}, bytes(relay.seen)[:2000]
    assert b"expect: 100-continue" in heads["large"]
    assert b"expect:" not in heads["small"]
