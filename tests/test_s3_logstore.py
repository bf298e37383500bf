"""Commits on the object store are exclusive across Spark applications (ZooKeeper-arbitrated
log store): two processes race, never two winners of one version, no lost commit; a writer that
dies mid-commit is completed by the next reader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import object_store_env
from deltawheel.statestore.delta.jvm import jsession, jvm
from deltawheel.statestore.objectstore.logstore import ZK_LOG_STORE_CLASS
from wire_util import Relay

pytestmark = [pytest.mark.objectstore, pytest.mark.spark, pytest.mark.zk]

WRITER = Path(__file__).with_name("s3_log_writer.py")
LOG_STORE_CHROOT = "/deltawheel-tests-logstore"  # the s3_bucket fixture's


def _writer(object_store, zk_server, *args: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    env = {**object_store_env(object_store), "DELTAWHEEL_ZK": zk_server.hosts, "DELTAWHEEL_ZK_CHROOT": LOG_STORE_CHROOT}
    return subprocess.Popen([sys.executable, str(WRITER), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)


def _child(object_store, zk_server, *args: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    proc = _writer(object_store, zk_server, *args)
    line = _line(proc, "its session up")
    assert line.strip() == "READY", line
    return proc


def _go(proc: subprocess.Popen[str], line: str = "go") -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _line(proc: subprocess.Popen[str], what: str, timeout: float = 300.0) -> str:
    """The other process's next line of output (it says ``what``); no timing is assumed."""
    assert proc.stdout is not None
    stdout = proc.stdout
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert box, f"the other process did not report {what} within {timeout:.0f} s"
    assert box[0].strip(), f"the other process ended before it reported {what} (rc {proc.poll()})"
    return box[0]


def _step(proc: subprocess.Popen[str], version: int) -> str:
    """Has a ``steps`` child write ``version`` and waits for its report (sent once its write
    returned): the outcome, "won" or the exception's class."""
    _go(proc, str(version))
    report = json.loads(_line(proc, f"on version {version}"))
    assert report["round"] == version, report
    return str(report["outcome"])


class _OtherApp:
    """Another Spark application (``s3_log_writer.py serve``) that the tests of this module hand one
    mode after another: one start-up for all of them. A test that fails while a mode runs leaves it
    busy: the next one gets a new application."""

    def __init__(self, object_store, zk_server) -> None:  # type: ignore[no-untyped-def]
        self.servers = (object_store, zk_server)
        self.proc: subprocess.Popen[str] | None = None
        self.idle = False

    def start(self) -> None:
        """Started now, its session comes up while the test prepares."""
        if self.proc is None or not self.idle or self.proc.poll() is not None:
            self.stop()
            self.proc = _writer(*self.servers, "serve")
            self.idle = True

    def command(self, *args: str) -> subprocess.Popen[str]:
        """Hands it ``mode ARGS...`` (``s3_log_writer.py``'s) and waits for its READY."""
        self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.idle = False
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        line = _line(self.proc, f"READY for {args[0]}")
        assert line.strip() == "READY", line
        return self.proc

    def result(self, timeout: float = 600.0) -> Any:
        """The mode's one JSON line at its end; the application waits for the next mode then."""
        assert self.proc is not None
        out = json.loads(_line(self.proc, "its result", timeout))
        self.idle = True
        return out

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # it ends
                try:
                    self.proc.wait(120)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def other_app(object_store, zk_server):  # type: ignore[no-untyped-def]
    app = _OtherApp(object_store, zk_server)
    app.start()
    yield app
    app.stop()


def _store(spark):  # type: ignore[no-untyped-def]
    cls = jvm(spark)
    for part in ZK_LOG_STORE_CLASS.split("."):
        cls = getattr(cls, part)
    return cls(jsession(spark).sessionState().newHadoopConf())


def test_the_session_commits_s3a_tables_through_the_zookeeper_store(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    assert spark.conf.get("spark.delta.logStore.s3a.impl") == ZK_LOG_STORE_CLASS


@pytest.mark.timeout(900)
def test_two_processes_racing_one_version_never_both_win(spark, other_app, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """Round r: this process and another Spark application write version r of one log at the
    same moment (a shared start time). Exactly one wins each round; the file is the winner's."""
    from py4j.protocol import Py4JJavaError

    rounds, slot = 16, 0.5  # 16 races of one version each: enough to see both sides win and lose
    log_dir = f"s3a://{s3_bucket}/race-{uuid.uuid4().hex[:8]}/_delta_log"
    child = other_app.command("raw", log_dir, str(slot), str(rounds), "child")
    store = _store(spark)
    conf = jsession(spark).sessionState().newHadoopConf()
    j = jvm(spark)
    start = time.time() + 1.0
    _go(child, repr(start))
    won: list[int] = []
    lost: list[tuple[int, str]] = []
    t0 = time.monotonic()
    for r in range(rounds):
        time.sleep(max(0.0, start + r * slot - time.time()))
        try:
            store.write(j.org.apache.hadoop.fs.Path(f"{log_dir}/{r:020d}.json"),
                        j.java.util.ArrayList([json.dumps({"writer": "parent", "round": r})]).iterator(), False, conf)
            won.append(r)
        except Py4JJavaError as exc:
            lost.append((r, str(exc.java_exception.getClass().getName())))
    theirs = other_app.result()
    elapsed = time.monotonic() - t0
    assert sorted(won + theirs["won"]) == list(range(rounds)), (won, theirs)  # one winner per round
    losses = [c for _, c in lost] + [c for _, c in theirs["lost"]]
    assert losses == ["java.nio.file.FileAlreadyExistsException"] * rounds
    fs_path = j.org.apache.hadoop.fs.Path(log_dir)
    fs = fs_path.getFileSystem(conf)
    for r in range(rounds):
        stream = fs.open(j.org.apache.hadoop.fs.Path(f"{log_dir}/{r:020d}.json"))
        body = j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        stream.close()
        assert json.loads(body) == {"writer": "parent" if r in won else "child", "round": r}
    print(f"\n{rounds} rounds in {elapsed:.1f}s: this process won {len(won)}, the other {len(theirs['won'])}")


@pytest.mark.timeout(900)
def test_two_applications_appending_lose_no_commit(spark, other_app, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """This session and another Spark application append to one Delta table at once: every append
    that returned is in the table and the log once, each writer's in its own order."""
    count = 8  # per writer: enough for their commits to race (the retried ones are printed)
    table = f"s3a://{s3_bucket}/appends-{uuid.uuid4().hex[:8]}"
    spark.sql("SELECT 'init' AS writer, 0 AS i").write.format("delta").save(table)
    child = other_app.command("appends", table, "child", str(count))
    _go(child)
    ours: list[str] = []
    t0 = time.monotonic()
    for i in range(count):
        spark.sql(f"SELECT 'parent' AS writer, {i} AS i").write.format("delta").mode("append") \
            .option("userMetadata", f"parent-{i}").save(table)
        ours.append(f"parent-{i}")
    theirs = other_app.result()
    elapsed = time.monotonic() - t0
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "userMetadata", "readVersion").collect()
    hist.sort(key=lambda r: r.version)
    assert [r.version for r in hist] == list(range(2 * count + 1))  # no gap, no doubled version
    tags = [r.userMetadata for r in hist[1:]]
    assert sorted(tags) == sorted(ours + theirs)  # every returned commit is in the log, once
    for writer, mine in (("parent", ours), ("child", theirs)):
        assert [t for t in tags if t.startswith(writer + "-")] == mine  # in the order they returned
    rows = spark.read.format("delta").load(table).where("writer != 'init'").collect()
    assert sorted(f"{r.writer}-{r.i}" for r in rows) == sorted(ours + theirs)
    retried = sum(1 for r in hist[1:] if r.readVersion is not None and r.readVersion < r.version - 1)
    print(f"\n{2 * count} appends by two applications in {elapsed:.1f}s; {retried} commits retried after losing a version")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("entry", [pytest.param("inline", marks=pytest.mark.slow), "temporary file"])  # inline: slow suite (time)
def test_a_writer_dying_after_its_entry_is_completed_by_the_next_reader(spark, other_app,  # type: ignore[no-untyped-def]
                                                                         s3_bucket, entry) -> None:
    """The dead writer's bytes wait in its ZooKeeper entry (a small commit) or in a temporary
    file the entry names (a commit above the inline limit: here the limit is 0)."""
    table = f"s3a://{s3_bucket}/crash-{uuid.uuid4().hex[:8]}"
    spark.sql("SELECT 'init' AS writer, 0 AS i").write.format("delta").save(table)
    # the other application dies in it: the last of this module's tests to use it (the next gets a new one)
    child = other_app.command("crash", table, "dead", *(["0"] if entry != "inline" else []))
    _go(child)
    out, _ = child.communicate(timeout=300)
    assert child.returncode != 0 and "NOT REACHED" not in out
    j = jvm(spark)
    conf = jsession(spark).sessionState().newHadoopConf()
    v1 = j.org.apache.hadoop.fs.Path(f"{table}/_delta_log/{1:020d}.json")
    fs = v1.getFileSystem(conf)
    assert not fs.exists(v1)  # it died between its entry and N.json
    assert len(_temporary_files(spark, table)) == (0 if entry == "inline" else 1)
    # the next reader finishes the commit from the entry: nothing is lost
    rows = spark.read.format("delta").load(table).collect()
    assert sorted(r.writer for r in rows) == ["dead", "init"]
    assert fs.exists(v1)
    spark.sql("SELECT 'after' AS writer, 1 AS i").write.format("delta").mode("append").save(table)
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "userMetadata").collect()
    assert sorted((r.version, r.userMetadata) for r in hist) == [(0, None), (1, "dead-crash"), (2, None)]


def _temporary_files(spark, table: str) -> list[str]:  # type: ignore[no-untyped-def]
    j = jvm(spark)
    conf = jsession(spark).sessionState().newHadoopConf()
    tmp = j.org.apache.hadoop.fs.Path(f"{table}/_delta_log/.tmp")
    fs = tmp.getFileSystem(conf)
    return [str(s.getPath().getName()) for s in fs.listStatus(tmp)] if fs.exists(tmp) else []


@pytest.mark.timeout(600)
def test_small_commits_write_no_temporary_file_and_their_checksums_land(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """A commit's bytes travel in its ZooKeeper entry: N.json is the only file a small commit
    PUTs besides Delta's checksum of it (written by Delta's post-commit hook through the
    checkpoint file manager, or by this store in the background when handed to it)."""
    table = f"s3a://{s3_bucket}/inline-{uuid.uuid4().hex[:8]}"
    for i in range(3):
        spark.sql(f"SELECT {i} AS i").write.format("delta").mode("append").save(table)
    assert _temporary_files(spark, table) == []
    assert sorted(r.i for r in spark.read.format("delta").load(table).collect()) == [0, 1, 2]
    j = jvm(spark)
    conf = jsession(spark).sessionState().newHadoopConf()
    crc = j.org.apache.hadoop.fs.Path(f"{table}/_delta_log/{2:020d}.crc")
    deadline = time.monotonic() + 30
    while not crc.getFileSystem(conf).exists(crc):
        assert time.monotonic() < deadline, "the checksum of version 2 never landed"
        time.sleep(0.1)
    stream = crc.getFileSystem(conf).open(crc)
    body = json.loads(j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    stream.close()
    assert body["numFiles"] == 3  # Delta's own figures for version 2: one file per append


@pytest.mark.timeout(600)
def test_an_unfinished_entry_of_the_earlier_format_is_still_completed(spark, zk_server, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """An entry left by the log store's earlier format (temporary file, no inline bytes), e.g.
    by a writer that died before an upgrade, is completed like today's."""
    from urllib.parse import quote_plus

    from kazoo.client import KazooClient

    table = f"s3a://{s3_bucket}/v1-{uuid.uuid4().hex[:8]}"
    spark.sql("SELECT 'init' AS writer").write.format("delta").save(table)
    j = jvm(spark)
    conf = jsession(spark).sessionState().newHadoopConf()
    log = f"{table}/_delta_log"
    body = "\n".join([json.dumps({"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE",
                                                   "userMetadata": "from-v1"}})]) + "\n"
    tmp_name = f".tmp/{1:020d}.json.{uuid.uuid4()}"
    path = j.org.apache.hadoop.fs.Path(f"{log}/{tmp_name}")
    out = path.getFileSystem(conf).create(path, True)
    out.write(bytearray(body.encode()))
    out.close()
    zk = KazooClient(hosts=zk_server.hosts)
    zk.start()
    try:
        node = f"{LOG_STORE_CHROOT}/delta-log/{quote_plus(table)}/{1:020d}.json"
        zk.create(node, f"v1\n{tmp_name}\nfalse\n0".encode(), makepath=True)
        spark.sql("SELECT 'after' AS writer").write.format("delta").mode("append").save(table)
        done, _ = zk.get(node)
    finally:
        zk.stop()
        zk.close()
    assert done.startswith(b"v2\n") and b"\ntrue\n" in done  # completed, in today's format
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "userMetadata").collect()
    assert sorted((r.version, r.userMetadata) for r in hist) == [(0, None), (1, "from-v1"), (2, None)]


@pytest.mark.timeout(600)
def test_with_a_digest_the_entries_are_guarded_and_a_writer_without_it_commits_nothing(
        spark, zk_server, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """Pipelines configured with a ZooKeeper digest (``--zk-digest``) get log entries only that
    user may change; a process without the digest reads them but cannot commit."""
    from urllib.parse import quote_plus

    from deltawheel.statestore.objectstore.logstore import DIGEST_KEY, NAMESPACE_KEY
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    from py4j.protocol import Py4JJavaError

    j = jvm(spark)
    namespace = f"deltawheel-tests-acl-{uuid.uuid4().hex[:8]}/delta-log"
    table = f"s3a://{s3_bucket}/acl-{uuid.uuid4().hex[:8]}"

    def store(digest: str | None):  # type: ignore[no-untyped-def]
        conf = jsession(spark).sessionState().newHadoopConf()
        conf.set(NAMESPACE_KEY, namespace)
        if digest is None:
            conf.unset(DIGEST_KEY)
        else:
            conf.set(DIGEST_KEY, digest)
        cls = j
        for part in ZK_LOG_STORE_CLASS.split("."):
            cls = getattr(cls, part)
        return cls(conf), conf

    def write(digest: str | None, version: int) -> None:
        s, conf = store(digest)
        s.write(j.org.apache.hadoop.fs.Path(f"{table}/_delta_log/{version:020d}.json"),
                j.java.util.ArrayList([json.dumps({"writer": digest or "none", "v": version})]).iterator(), False, conf)

    write("dw:secret", 0)
    zk = KazooClient(hosts=zk_server.hosts)
    zk.start()
    try:
        node = f"/{namespace}/{quote_plus(table)}/{0:020d}.json"
        acls, _ = zk.get_acls(node)
        assert sorted((a.id.scheme, a.perms) for a in acls) == [("digest", 31), ("world", 1)]
        assert zk.get(node)[0].startswith(b"v2\n")  # everyone reads
        with pytest.raises(NoAuthError):
            zk.set(node, b"v2\n\nfalse\n0\n-1\n")  # nobody else changes it
    finally:
        zk.stop()
        zk.close()
    with pytest.raises(Py4JJavaError, match=f"digest ACL.*{DIGEST_KEY}"):
        write(None, 1)
    write("dw:secret", 1)
    path = j.org.apache.hadoop.fs.Path(f"{table}/_delta_log/{1:020d}.json")
    conf = jsession(spark).sessionState().newHadoopConf()
    stream = path.getFileSystem(conf).open(path)
    body = j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    stream.close()
    assert json.loads(body) == {"writer": "dw:secret", "v": 1}


@pytest.mark.timeout(300)
def test_a_writer_overtaken_while_creating_a_table_loses_with_file_already_exists(spark, s3_bucket, zk_server
                                                                                 ) -> None:  # type: ignore[no-untyped-def]
    """Two writers create one table at once. The slow one probes for 00000000000000000000.json
    before the fast one writes it, and looks at the version's entry after the fast one completed
    it: it lost the race (FileAlreadyExistsException, which Delta answers by reading the winner),
    not "the table was deleted by hand"."""
    from kazoo.client import KazooClient
    from py4j.protocol import Py4JJavaError

    j = jvm(spark)
    log_dir = f"s3a://{s3_bucket}/overtaken-{uuid.uuid4().hex[:8]}/_delta_log"
    v0 = j.org.apache.hadoop.fs.Path(f"{log_dir}/{0:020d}.json")
    slow_conf = jsession(spark).sessionState().newHadoopConf()
    release = j.org.apache.hadoop.fs.Path(f"{log_dir}/../release-{uuid.uuid4().hex[:8]}")
    slow_conf.set("deltawheel.logstore.test.pauseAfterProbeMs", "600000")  # until released
    slow_conf.set("deltawheel.logstore.test.pauseReleasePath", str(release))
    outcome: list[str] = []
    fs = v0.getFileSystem(slow_conf)

    def heads() -> int:  # the store's existence probes (HEAD requests) so far
        v = fs.getStorageStatistics().getLong("object_metadata_request")
        return int(v) if v is not None else 0

    def slow() -> None:
        try:
            _store(spark).write(v0, j.java.util.ArrayList([json.dumps({"writer": "slow"})]).iterator(), False,
                                slow_conf)
            outcome.append("won")
        except Py4JJavaError as exc:
            outcome.append(str(exc.java_exception.getClass().getName()))

    before = heads()
    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + 120
    while heads() == before:  # the slow writer has probed (nothing there) and now waits for release
        assert time.monotonic() < deadline and t.is_alive(), "the slow writer never probed"
        time.sleep(0.02)
    conf = jsession(spark).sessionState().newHadoopConf()
    _store(spark).write(v0, j.java.util.ArrayList([json.dumps({"writer": "fast"})]).iterator(), False, conf)
    zk = KazooClient(hosts=zk_server.hosts)
    zk.start()
    try:  # the fast writer's entry is complete (its acknowledgement runs after the write returned)
        node = f"{LOG_STORE_CHROOT}/delta-log/" + urllib.parse.quote(log_dir.rsplit("/_delta_log", 1)[0], safe="")
        deadline = time.monotonic() + 120
        while zk.get(f"{node}/{0:020d}.json")[0].split(b"\n")[2] != b"true":
            assert time.monotonic() < deadline, "the fast writer's entry was never completed"
            time.sleep(0.05)
    finally:
        zk.stop()
        zk.close()
    release.getFileSystem(conf).create(release, True).close()  # the slow writer goes on now
    t.join(120)
    assert outcome == ["java.nio.file.FileAlreadyExistsException"]
    stream = v0.getFileSystem(conf).open(v0)
    assert json.loads(j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")) == {"writer": "fast"}
    stream.close()


@pytest.mark.timeout(600)
@pytest.mark.slow  # the losing writer of two processes: test_two_processes_racing_one_version_never_both_win
def test_a_writer_that_committed_the_version_before_still_loses_one_another_process_took(
        spark, object_store, zk_server, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """This process commits version 0, another application commits 1 (unseen here), and this
    process then writes 1 as if it were next: it loses (FileAlreadyExistsException, Delta's cue
    to read the winner) and the file stays the other's. It skips the probes after its own commit
    of the version before, so ZooKeeper's entry decides; once that shortcut's window has passed
    (half the entries' expiry), it probes the store again: with the other's entry removed as an
    expired one would be, the probe still finds the file."""
    from kazoo.client import KazooClient
    from py4j.protocol import Py4JJavaError

    j = jvm(spark)
    name = f"follow-{uuid.uuid4().hex[:8]}"
    log_dir = f"s3a://{s3_bucket}/{name}/_delta_log"
    conf = jsession(spark).sessionState().newHadoopConf()
    short = jsession(spark).sessionState().newHadoopConf()
    short.set("deltawheel.logstore.expirationDelaySeconds", "2")  # the shortcut's window: 1 s
    zk = KazooClient(hosts=zk_server.hosts)
    zk.start()
    node = (f"{LOG_STORE_CHROOT}/delta-log/"
            + urllib.parse.quote(f"s3a://{s3_bucket}/{name}", safe=""))

    def write(version: int, c: Any) -> str:
        try:
            _store(spark).write(j.org.apache.hadoop.fs.Path(f"{log_dir}/{version:020d}.json"),
                                j.java.util.ArrayList([json.dumps({"writer": "parent", "v": version})]).iterator(),
                                False, c)
            return "won"
        except Py4JJavaError as exc:
            return str(exc.java_exception.getClass().getName())

    def body(version: int) -> Any:
        stream = fs.open(j.org.apache.hadoop.fs.Path(f"{log_dir}/{version:020d}.json"))
        try:
            return json.loads(j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    fs = j.org.apache.hadoop.fs.Path(log_dir).getFileSystem(conf)
    lost = "java.nio.file.FileAlreadyExistsException"
    child = _child(object_store, zk_server, "steps", log_dir, "child")
    try:
        _go(child)
        assert write(0, conf) == "won"
        assert _step(child, 0) == lost
        assert _step(child, 1) == "won"  # reported once its write of version 1 returned
        assert write(1, conf) == lost
        assert body(1) == {"writer": "child", "round": 1}
        assert write(2, conf) == "won"  # (probing: this process did not commit 1)
        committed_2 = time.monotonic()
        # this process's entries are complete: 0 before 1 was written, 2 soon after its commit
        assert zk.get(f"{node}/{0:020d}.json")[0].split(b"\n")[2] == b"true"
        deadline = time.monotonic() + 10
        while zk.get(f"{node}/{2:020d}.json")[0].split(b"\n")[2] != b"true":
            assert time.monotonic() < deadline, "the entry of version 2 was never completed"
            time.sleep(0.05)
        assert _step(child, 2) == lost
        assert _step(child, 3) == "won"
        out, _ = child.communicate(timeout=300)  # (closes its stdin: it ends)
        assert child.returncode == 0, out
        zk.delete(f"{node}/{3:020d}.json")  # as if version 3's entry had expired and been removed
        # the shortcut's window (1 s after this process's commit of version 2) has closed: a lower
        # bound, waiting longer changes nothing
        time.sleep(max(0.0, committed_2 + 1.5 - time.monotonic()))
        assert write(3, short) == lost
        assert body(3) == {"writer": "child", "round": 3}
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        zk.stop()
        zk.close()


def test_a_commit_after_this_process_s_own_makes_one_put_and_no_probe(spark, s3_bucket, object_store) -> None:  # type: ignore[no-untyped-def]
    """Versions 1 and 2 of a log, each written right after this process wrote the one before:
    one PUT each and no HEAD (ZooKeeper's entry decides); version 0 and a version written with
    the shortcut's window closed are probed first. Seen on the wire: the PUT is the log store's
    own, signed with the bucket's keys, without ``Expect: 100-continue``; the log reads back. A PUT
    the store refuses (a wrong key) leaves the version to its ZooKeeper entry: the next reader writes
    it. A PUT answered 503 is sent again."""
    j = jvm(spark)
    url = urllib.parse.urlsplit(object_store.endpoint.url)
    relay = Relay((url.hostname or "127.0.0.1", url.port or 80))
    log_dir = f"s3a://{s3_bucket}/own-{uuid.uuid4().hex[:8]}/_delta_log"

    def conf(window: bool = True) -> Any:
        c = jsession(spark).sessionState().newHadoopConf()
        c.set(f"fs.s3a.bucket.{s3_bucket}.endpoint", f"http://{relay.address}")
        c.set("fs.s3a.impl.disable.cache", "true")
        if not window:
            c.set("deltawheel.logstore.expirationDelaySeconds", "0")  # no window: probe every time
        return c

    def write(version: int, c: Any = None) -> tuple[int, list[bytes]]:
        seen = len(relay.seen)
        _store(spark).write(j.org.apache.hadoop.fs.Path(f"{log_dir}/{version:020d}.json"),
                            j.java.util.ArrayList([json.dumps({"v": version})]).iterator(), False, c or conf())
        wire = bytes(relay.seen[seen:])
        puts = re.findall(rb"^PUT [^ ]*/_delta_log/[^\r]*\r\n(.*?)\r\n\r\n", wire, re.M | re.S)
        return len(re.findall(rb"^HEAD ", wire, re.M)), [p.lower() for p in puts]

    heads, puts = write(0)
    assert heads >= 1 and len(puts) == 1
    for version in (1, 2):
        heads, puts = write(version)
        assert heads == 0 and len(puts) == 1
        assert b"authorization: aws4-hmac-sha256 credential=" in puts[0] and b"java-http-client" in puts[0]
        assert b"expect:" not in puts[0]
    heads, puts = write(3, conf(window=False))
    assert heads >= 1 and len(puts) == 1
    wrong = conf()
    wrong.set(f"fs.s3a.bucket.{s3_bucket}.secret.key", "not-the-secret")
    assert write(4, wrong)[1]  # refused (403): version 4 is the entry's, N.json not written yet
    fs = j.org.apache.hadoop.fs.Path(log_dir).getFileSystem(jsession(spark).sessionState().newHadoopConf())
    last = j.org.apache.hadoop.fs.Path(f"{log_dir}/{4:020d}.json")
    assert not fs.exists(last)
    listed = _store(spark).listFrom(j.org.apache.hadoop.fs.Path(f"{log_dir}/{0:020d}.json"), conf())
    names = []
    while listed.hasNext():
        names.append(listed.next().getPath().getName())
    assert names[-1] == last.getName()  # a reader completes it from the entry
    relay.refuse(rb"PUT \S*/_delta_log/0{19}5\.json ", 2)  # the store sheds load twice: the PUT is sent again
    assert len(write(5)[1]) == 3
    for version in range(6):
        stream = fs.open(j.org.apache.hadoop.fs.Path(f"{log_dir}/{version:020d}.json"))
        assert json.loads(j.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")) == {"v": version}
        stream.close()


def test_behind_a_proxy_the_log_store_leaves_its_put_to_s3a(spark, s3_bucket, object_store) -> None:  # type: ignore[no-untyped-def]
    """With ``fs.s3a.proxy.host`` set, S3A reaches the store through that proxy, which the log
    store's own signed PUT would not take: N.json goes up by S3A, through the proxy."""
    j = jvm(spark)
    url = urllib.parse.urlsplit(object_store.endpoint.url)
    proxy = Relay((url.hostname or "127.0.0.1", url.port or 80))  # S3A sends it absolute-form requests
    conf = jsession(spark).sessionState().newHadoopConf()
    host, port = proxy.address.split(":")
    conf.set(f"fs.s3a.bucket.{s3_bucket}.proxy.host", host)
    conf.set(f"fs.s3a.bucket.{s3_bucket}.proxy.port", port)
    conf.set("fs.s3a.impl.disable.cache", "true")
    log_dir = f"s3a://{s3_bucket}/proxied-{uuid.uuid4().hex[:8]}/_delta_log"
    _store(spark).write(j.org.apache.hadoop.fs.Path(f"{log_dir}/{0:020d}.json"),
                        j.java.util.ArrayList([json.dumps({"v": 0})]).iterator(), False, conf)
    put = re.search(rb"^PUT \S*/_delta_log/0{20}\.json[^\r]*\r\n(.*?)\r\n\r\n", bytes(proxy.seen), re.M | re.S)
    assert put is not None and b"amz-sdk-invocation-id" in put.group(1).lower()


def test_delta_takes_a_commit_file_s_status_from_the_log_store_not_a_head(spark, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """After writing ``N.json`` Delta asks for its status. The session's S3A answers that once from
    what the log store wrote (no HEAD); asked again, or for another file, it asks the store. The
    table's snapshot after the commit carries the file's true length."""
    j = jvm(spark)
    path = f"s3a://{s3_bucket}/status-{uuid.uuid4().hex[:8]}"
    spark.range(3).write.format("delta").save(path)
    log = j.org.apache.spark.sql.delta.DeltaLog.forTable(jsession(spark), path)
    fs = j.org.apache.hadoop.fs.Path(path).getFileSystem(log.newDeltaHadoopConf())
    assert fs.getClass().getName() == "io.deltawheel.storage.CommitStatusS3AFileSystem"

    def heads() -> int:
        v = fs.getStorageStatistics().getLong("object_metadata_request")
        return int(v) if v is not None else 0

    from deltawheel.statestore.delta.txn import TableLog

    before, started = heads(), int(time.time() * 1000)
    # the writers' way: on the snapshot of their last commit, without listing the log
    assert TableLog(spark, path).commit(app_versions={"status-test": 1}, known_version=0) == 1
    assert heads() - before == 0
    commit = j.org.apache.hadoop.fs.Path(f"{path}/_delta_log/{1:020d}.json")
    segment = log.unsafeVolatileSnapshot().logSegment()
    held = segment.deltas().last()
    assert held.getPath().getName() == commit.getName()
    assert started <= segment.lastCommitFileModificationTimestamp() <= int(time.time() * 1000)
    before = heads()
    stored = fs.getFileStatus(commit)  # handed over once: now the store's answer
    assert heads() - before == 1 and stored.getLen() == held.getLen() > 0
