"""Watching a pipeline: the per-batch metrics table, ``deltawheel status``, ``deltawheel report``
(loaded in a real headless Chromium) and the figures Spark's StreamingQueryListeners see."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from executor_util import BucketCounter, J, events, start_executor, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]

REPO = Path(__file__).resolve().parent.parent
SCREENSHOT_DIR = REPO / "bench-out" / "report-screenshots"  # git-ignored


def _bad_record(spark: Any, rid: str, ts: int) -> Any:
    """A record whose value has no field ``q``: a dead letter of BucketCounter."""
    return spark.createDataFrame([(rid, "", J.encode({"other": 1}), "json", ts, None, "t", f"pos-{rid}", 1)],
                                 schema=events(spark, []).schema)


def _run_pipeline(spark: Any, layout: Any, zk_config: Any, *, keep_running: bool = False,
                  before_flush: Any = None) -> tuple[Any, Any]:
    """Three batches of BucketCounter fed by injector ``events`` (a dead letter in batch 1),
    with watermarks declared and published, as a pipeline would. ``before_flush(ex)`` runs
    after the batches, before the metrics rows are flushed."""
    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), watermarks=True)
    ex.metrics.interval_s = 600.0  # the three batches' rows wait for flush (and go in one append)
    now = int(time.time() * 1000)
    ex.authority.declare("buckets", upstream=["injector:events"], num_intervals=4, replace=True)
    ex.upstream = ("injector:events",)
    t0 = now - 60_000
    ex.authority.publish_injector("events", t0)
    ex.run_batch(events(spark, [("r1", "cats", t0 + 1_000), ("r2", "dogs", t0 + 2_000)]), 0)
    ex.authority.publish_injector("events", t0 + 20_000)
    ex.run_batch(events(spark, [("r3", "cats", t0 + 21_000)]).unionByName(_bad_record(spark, "bad1", t0 + 22_000)), 1)
    ex.authority.publish_injector("events", t0 + 40_000)
    ex.run_batch(events(spark, [("r4", "emus", t0 + 41_000), ("r1", "cats", t0 + 1_000)]), 2)
    if before_flush is not None:
        before_flush(ex)
    assert ex.metrics.flush()  # rows are written in the background
    if not keep_running:
        stop_executor(ex, client)
    return ex, client


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``deltawheel ARGS`` as a user runs it (a fresh process, its exit code and output)."""
    return subprocess.run([sys.executable, "-m", "deltawheel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def finished(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    """One :func:`_run_pipeline`, stopped (its last delivery landed, its leases given back), for the
    tests that only read what it left: (its executor, store, ZooKeeper config, the metrics rows
    waiting when it flushed)."""
    import uuid

    from conftest import copy_migrated_store
    from deltawheel.executor.protocol.metrics import read_batches
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    layout = StoreLayout(str(tmp_path_factory.mktemp("finished") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)
    assert read_batches(layout) == []  # no table yet: nothing recorded, no error
    waiting: list[int] = []
    ex, _ = _run_pipeline(spark, layout, zk, before_flush=lambda ex: waiting.append(ex.metrics._queue.unfinished_tasks))
    return ex, layout, zk, waiting


def test_each_committed_batch_appends_one_metrics_row(spark, finished) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.metrics import read_batches

    ex, migrated_store, _zk, waiting = finished
    assert waiting == [3]  # gathered, not yet written: one append for the interval's rows
    log = Path(migrated_store.metrics_of("buckets")) / "_delta_log"  # the computation's own table
    assert len(list(log.glob("*.json"))) == 2  # the table's creation and the one append of three rows
    assert not Path(migrated_store.metrics_batches).exists()  # the store-wide table of older deltawheels
    rows = read_batches(migrated_store)
    assert [(r["pipeline"], r["computation"], r["instance"], r["batch_id"]) for r in rows] == [
        ("test", "buckets", "w", 0), ("test", "buckets", "w", 1), ("test", "buckets", "w", 2)]
    assert [(r["records_in"], r["processed"], r["duplicates"], r["dead_letters"]) for r in rows] == [
        (2, 2, 0, 0), (2, 1, 0, 1), (2, 1, 1, 0)]
    reports = ex.reports
    for row, rep in zip(rows, reports, strict=True):
        assert row["wall_s"] == pytest.approx(rep.wall_s, abs=0.001)
        assert set(row["steps_s"]) == {k for k, _ in rep.steps_s} and "commit" in row["steps_s"]
        assert row["input_watermark_ms"] == rep.input_watermark_ms is not None
        assert row["low_watermark_ms"] == rep.low_watermark_ms
        assert row["write_path"] == "image" and row["state_bytes"] > 0 and row["state_rows"] >= 1
    # the table is a Delta table like the others: Spark reads the same rows
    assert spark.read.format("delta").load(migrated_store.metrics_of("buckets")).count() == 3


def test_a_metrics_failure_never_fails_the_batch(spark, migrated_store, zk_config, caplog) -> None:  # type: ignore[no-untyped-def]
    """A plain file where the metrics table should be: the batch commits, a warning says why."""
    os.makedirs(os.path.dirname(migrated_store.metrics_of("buckets")))
    Path(migrated_store.metrics_of("buckets")).write_text("not a table")
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    try:
        with caplog.at_level("WARNING"):
            r = ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0, input_watermark_ms=None)
            assert ex.metrics.flush()  # the row is written (here: fails) in the background
        assert r.processed == 1
        assert any("could not append batch metrics" in m and "the batch itself is committed" in m
                   for m in caplog.messages)
    finally:
        stop_executor(ex, client)
    assert spark.read.format("delta").load(migrated_store.rows_of("buckets")).where("computation = 'buckets'").count() >= 1


def test_status_reads_the_store_wide_metrics_table_of_an_older_deltawheel_beside_the_computations_own(
        spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A store an older deltawheel wrote keeps its ``_metrics/batches`` rows: they are read with the
    rows of each computation's own table, in time order, and gc collects and expires all of them."""
    from deltawheel.executor.protocol.metrics import BatchMetrics, read_batches
    from deltawheel.gc.passes import run_gc

    assert BatchMetrics(spark, migrated_store).append({"batch_id": 0, "computation": "a", "recorded_ms": 1})
    assert BatchMetrics(spark, migrated_store, "a").append({"batch_id": 1, "computation": "a", "recorded_ms": 2})
    assert BatchMetrics(spark, migrated_store, "b").append({"batch_id": 0, "computation": "b", "recorded_ms": 3},
                                                          {"batch_id": 1, "computation": "b", "recorded_ms": 9_000_000_000_000})
    assert [(r["computation"], r["batch_id"]) for r in read_batches(migrated_store)] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    gc = run_gc(spark, migrated_store, now_ms=10_000_000, apply=True, metrics_retention_ms=1_000_000)
    expired = {a.table for a in gc.actions if a.pass_name == "metrics_retention"}
    assert expired == {"_metrics/batches", "_metrics/computations/a", "_metrics/computations/b"}, gc.lines()
    assert [(r["computation"], r["batch_id"]) for r in read_batches(migrated_store)] == [("b", 1)]


def test_metrics_land_from_the_writer_thread_when_the_jvm_has_no_default_session(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """Seen in a long chaos run: every metrics append of a driver failed after its commit with
    Delta's ``DELTA_SPARK_SESSION_NOT_SET`` (the writer thread had no active session, the JVM no
    default one) once the table had a checkpoint. The writer sets its thread's session itself."""
    from deltawheel.executor.protocol.metrics import BatchMetrics, read_batches
    from deltawheel.gc.logs import checkpoint_newest

    jss = spark._jsparkSession
    spark_cls = spark._jvm.org.apache.spark.sql.SparkSession
    first = BatchMetrics(spark, migrated_store)
    assert first.append(*({"batch_id": b, "computation": "c"} for b in range(2)))
    checkpoint_newest(spark, migrated_store.metrics_batches)  # Delta's post-commit stats read it
    spark_cls.clearDefaultSession()
    try:
        writer = BatchMetrics(spark, migrated_store)  # a new writer thread: a new JVM thread
        for b in range(2, 5):
            writer.submit({"batch_id": b, "computation": "c"})
            assert writer.flush()
    finally:
        spark_cls.setDefaultSession(jss)
    assert sorted(r["batch_id"] for r in read_batches(migrated_store)) == list(range(5))


def test_status_shows_owners_watermarks_batches_and_dead_letters(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    ex, client = _run_pipeline(spark, migrated_store, zk_config, keep_running=True)
    try:
        out = _cli("status", "--store", migrated_store.root, "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot)
        # the output low watermark as ZooKeeper has it now (batch 2's delivery may have moved it since)
        low = max(m for m in (ex.authority.low_watermark("buckets"), ex.authority.published_low_watermark("buckets"))
                  if m is not None)
    finally:
        stop_executor(ex, client)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    print(text)
    assert "test / buckets" in text
    assert "intervals  4, 4 held" in text and "w: 0 (seq " in text
    assert "input watermark" in text and "lag " in text
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(low / 1000)) in text  # the output watermark
    assert "dead letters      1 " in text
    # keys, not physical rows (each interval's fence row and the record-id rows are rows too)
    from pyspark.sql import functions as F

    rows = spark.read.format("delta").load(migrated_store.rows_of("buckets")).where("computation = 'buckets'")
    keys, physical = rows.where(~F.col("key").startswith("\x00")).count(), rows.count()
    assert 0 < keys < physical
    assert (f"state             {keys} key{'' if keys == 1 else 's'} ({physical} physical rows with the fence and "
            "record-id rows, ") in text
    assert "batches           3 recorded, 6 records in" in text
    assert "batch     2 at" in text and "1 dup" in text
    # --json carries the same figures for scripts
    js = _cli("status", "--store", migrated_store.root, "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot,
              "--json")
    data = json.loads(js.stdout)
    assert len(data["batches"]) == 3 and len(data["dead_letters"]) == 1
    assert (data["state"]["buckets"]["keys"], data["state"]["buckets"]["rows"]) == (keys, physical)
    assert {r["owner"] for r in data["leases"]} == {None}  # stopped since: leases given back


def _status_and_scan(spark: Any, layout: Any, zk_config: Any) -> tuple[str, int, int]:
    """``status``'s text, and what ``recover``'s dry run finds in the rows and streams: the
    productions still checkpointed, and how many of them are not in their stream."""
    from deltawheel.executor.drivers.recover import scan
    from deltawheel.executor.drivers.status import gather
    from deltawheel.executor.drivers.statustext import render
    from deltawheel.statestore.zk.client import connect

    client = connect(zk_config)
    try:
        text = render(gather(layout, client))
        found = scan(spark, layout, client, pipeline="test")
    finally:
        client.stop()
        client.close()
    print(text)
    return (text, sum(sum(s.checkpointed.values()) for s in found), sum(sum(s.undelivered.values()) for s in found))


def _pending_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("pending productions")]
    assert len(lines) == 1, text
    return lines[0]


def test_status_of_a_finished_pipeline_says_its_checkpointed_productions_landed(spark, finished) -> None:  # type: ignore[no-untyped-def]
    """Its last batch's delivery was under way when the batch ended (the metrics row says so), and
    landed when the executor stopped: status must not say it is still being delivered."""
    from deltawheel.executor.protocol.metrics import read_batches

    _ex, migrated_store, zk_config, _ = finished  # stopped: the last delivery landed, the leases given back
    assert read_batches(migrated_store)[-1]["pending_productions"] > 0  # in flight when the batch ended
    text, checkpointed, undelivered = _status_and_scan(spark, migrated_store, zk_config)
    assert checkpointed > 0 and undelivered == 0  # still in the rows (the next commit clears them), all landed
    assert _pending_line(text) == (f"pending productions none: the {checkpointed} still checkpointed in the rows "
                                   "are in their streams (the next batch's commit clears them)")


class _Died(Exception):
    pass


def test_status_says_to_recover_the_undelivered_productions_of_a_stopped_pipeline(spark, migrated_store,  # type: ignore[no-untyped-def]
                                                                                  zk_config) -> None:
    """The process died between a batch's commit and its delivery, and nothing runs now: status
    names the productions that have not landed and the command that delivers them."""

    def die_after_commit(point: Any, batch_id: int) -> None:
        from deltawheel.executor.protocol.faults import FaultPoint

        if point is FaultPoint.AFTER_COMMIT and batch_id == 1:
            raise _Died(point)

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), faults=die_after_commit)
    ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 2_000)]), 0, input_watermark_ms=None)
    with pytest.raises(_Died):  # closes the buckets of r1 and r2: two productions checkpointed, not delivered
        ex.run_batch(events(spark, [("r3", "cats", 12_000)]), 1, input_watermark_ms=11_000)
    assert ex.metrics.flush()
    client.stop()  # its leases go with its session
    client.close()
    text, checkpointed, undelivered = _status_and_scan(spark, migrated_store, zk_config)
    assert checkpointed == undelivered == 2
    assert _pending_line(text) == (
        f"pending productions 2 checkpointed have not landed in their streams, and no instance holds an interval: "
        f"deliver them with `deltawheel recover --store {migrated_store.root} --pipeline test --apply` (or run the "
        "pipeline again: its start delivers them)")


def test_status_of_an_empty_store_says_so(migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    out = _cli("status", "--store", migrated_store.root, "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot)
    assert out.returncode == 0, out.stderr
    assert "no pipeline has run on this store yet" in out.stdout



def test_status_and_report_of_a_store_that_does_not_exist_say_so(tmp_path: Path) -> None:
    """A mistyped --store is refused (NotAStoreError, exit 3) instead of being reported as a store no
    pipeline ran on, and no folder (nor an embedded ZooKeeper's) is made there."""
    missing = tmp_path / "no-such-store"
    for cmd in (["status"], ["report", "--out", str(tmp_path / "r.html")]):
        out = _cli(*cmd, "--store", str(missing))
        assert out.returncode == 3, (cmd, out.stdout, out.stderr)
        assert f"NotAStoreError: --store {missing} does not exist" in out.stderr, out.stderr
        assert not missing.exists()
    assert not (tmp_path / "r.html").exists()


# ------------------------------------------------------------------ the report in Chromium

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class _Cdp:
    """Chrome DevTools Protocol over ``--remote-debugging-pipe`` (fds 3 and 4, NUL-framed JSON):
    no WebSocket library needed."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, fd 4 writes the answers
            import fcntl

            high_r, high_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_r, from_w))
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        # fds 3 and 4 are kept open in the child (set by ``fds`` after the parent's are inherited)
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--no-first-run", "--hide-scrollbars", "about:blank"],
            pass_fds=(3, 4, to_r, from_w), preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self._next(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise AssertionError(f"{method}: {m['error']}")
                return dict(m.get("result", {}))
            self.events.append(m)
        raise AssertionError(f"{method}: no answer in {timeout}s")

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while time.monotonic() < deadline:
            m = self._next(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m
        raise AssertionError(f"no {method} in {timeout}s")

    def _next(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_r], [], [], left)[0]:
                raise AssertionError("Chromium did not answer")
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise AssertionError("Chromium closed its DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return dict(json.loads(raw))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except AssertionError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)
        os.close(self._from_r)


def test_report_page_loads_in_headless_chromium_with_every_plot(finished, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.report import PLOTS

    binary = _chromium()
    if binary is None:
        pytest.skip("no Chromium: install Debian's package ('apt-get install chromium'); the report test "
                    "loads the page in a real headless browser")
    _ex, migrated_store, zk_config, _ = finished
    page = tmp_path / "out" / "report.html"
    out = _cli("report", "--store", migrated_store.root, "--out", str(page), "--zk", zk_config.hosts,
               "--zk-chroot", zk_config.chroot)
    assert out.returncode == 0, out.stderr
    assert f"wrote {page}" in out.stdout and "3 batches" in out.stdout
    text = page.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained

    cdp = _Cdp(binary, tmp_path / "profile")
    try:
        target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
        sid = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.call(f"{domain}.enable", sid)
        cdp.call("Emulation.setDeviceMetricsOverride", sid, width=1100, height=900, deviceScaleFactor=1, mobile=False)
        cdp.call("Page.navigate", sid, url=page.as_uri())
        cdp.wait_event("Page.loadEventFired")
        found = cdp.call("Runtime.evaluate", sid, returnByValue=True, expression="""JSON.stringify(
            Array.from(document.querySelectorAll('figure')).map(f => {
              const img = f.querySelector('img'); const r = img.getBoundingClientRect();
              return {caption: f.querySelector('figcaption').textContent, title: img.title,
                      complete: img.complete, natural: [img.naturalWidth, img.naturalHeight],
                      shown: [r.width, r.height]}; }))""")
        figures = json.loads(found["result"]["value"])
        height = cdp.call("Runtime.evaluate", sid, returnByValue=True,
                          expression="document.documentElement.scrollHeight")["result"]["value"]
        cdp.call("Emulation.setDeviceMetricsOverride", sid, width=1100, height=int(height), deviceScaleFactor=1,
                 mobile=False)
        shot = cdp.call("Page.captureScreenshot", sid, format="png", timeout=60)["data"]
    finally:
        cdp.close()
    errors = [e for e in cdp.events
              if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
              or e.get("method") == "Network.loadingFailed"]
    assert errors == []
    fetched = {e["params"]["request"]["url"].split(":", 1)[0] for e in cdp.events
               if e.get("method") == "Network.requestWillBeSent"}
    assert fetched <= {"file", "data"}  # the page itself and its embedded images, nothing else
    assert [f["caption"] for f in figures] == list(PLOTS)
    for f in figures:
        assert f["complete"] and f["title"] == f["caption"]
        assert min(f["natural"]) > 100 and min(f["shown"]) > 100, f  # a decoded image, laid out visibly
    png = base64.b64decode(shot)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    dest = SCREENSHOT_DIR / "report.png"
    dest.write_bytes(png)
    print(f"report screenshot: {dest}")


# ------------------------------------------------------------ Spark's own listener channel

def _spark_jobs(spark: Any) -> dict[int, str]:
    """Spark's status store (what its UI shows): job id -> description."""
    jobs = spark._jsc.sc().statusStore().jobsList(None)
    out = {}
    for i in range(jobs.size()):
        j = jobs.apply(i)
        d = j.description()
        out[int(j.jobId())] = d.get() if d.isDefined() else ""
    return out


@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_a_users_streaming_query_listener_receives_deltawheels_figures(spark, migrated_store, zk_config, tmp_path,
                                                                        write_path) -> None:  # type: ignore[no-untyped-def]
    """As docs/watching.md shows: observe_input on the streaming frame, the executor in foreachBatch,
    the user's own StreamingQueryListener."""
    from deltawheel.executor.protocol.metrics import observe_input, read_batches
    from pyspark.sql.streaming import StreamingQueryListener

    src = str(tmp_path / "input")
    events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000)]) \
        .write.format("delta").save(src)
    seen: list[tuple[int, dict[str, Any]]] = []
    figures: list[tuple[int, int] | None] = []
    jobs_before = _spark_jobs(spark)

    class Mine(StreamingQueryListener):
        def onQueryStarted(self, event):  # type: ignore[no-untyped-def]
            pass

        def onQueryProgress(self, event):  # type: ignore[no-untyped-def]
            p = event.progress
            if "deltawheel" in p.observedMetrics:
                seen.append((p.batchId, p.observedMetrics["deltawheel"].asDict()))
                done = ex.report(p.batchId)  # what the executor did with the batch (foreachBatch has returned)
                figures.append((done.processed, done.duplicates) if done is not None else None)

        def onQueryIdle(self, event):  # type: ignore[no-untyped-def]
            pass

        def onQueryTerminated(self, event):  # type: ignore[no-untyped-def]
            pass

    listener = Mine()
    spark.streams.addListener(listener)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path)
    try:
        stream = observe_input(spark.readStream.format("delta").load(src))
        q = (stream.writeStream.foreachBatch(ex).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "cp")).start())
        q.awaitTermination(120)
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:  # the listener bus is asynchronous
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
        stop_executor(ex, client)
    assert seen == [(0, {"records": 3, "min_event_ms": 1_000, "max_event_ms": 12_000, "records_without_time": 0})]
    assert figures == [(3, 0)]
    # Spark's UI (its status store) names the batch's jobs, with the figures from the commit on
    ours = [d for j, d in _spark_jobs(spark).items() if j not in jobs_before and d.startswith("deltawheel ")]
    assert ours and all(d.startswith("deltawheel buckets batch 0") for d in ours), ours
    with_figures = [d for d in ours if d.startswith("deltawheel buckets batch 0: 3 in, 3 processed, 0 duplicates")]
    assert bool(with_figures) == (write_path == "merge"), ours  # the image path commits without a Spark job
    assert [(r["batch_id"], r["records_in"]) for r in read_batches(migrated_store)] == [(0, 3)]
    # a batch run from the caller's thread leaves the caller's own description as it was
    sc = spark.sparkContext
    before = sc.getLocalProperty("spark.job.description")
    ex2, client2 = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path)
    try:
        sc.setJobDescription("my own job")
        ex2.run_batch(events(spark, [("r9", "emus", 30_000)]), 1, input_watermark_ms=None)
        assert sc.getLocalProperty("spark.job.description") == "my own job"
    finally:
        sc.setLocalProperty("spark.job.description", before)
        stop_executor(ex2, client2)
