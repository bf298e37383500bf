"""Embedding in one call: ``deltawheel.connect(spark, store=..., zk=...)``.

The README's *Embedding it in your Spark job* snippet runs as written (only its store, ZooKeeper
and input folder are pointed at the test's); the ``foreachBatch`` form with ``engine.executor`` and
``engine.finish`` gives the same rows; a session without Delta or the log store is refused naming
the settings, and a machine without ``java`` gets a typed error saying what to install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.session.sparkenv import missing_settings
from deltawheel.statestore.zk.client import connect as connect_zk
from deltawheel.statestore.zk.lease_tools import list_leases
from executor_util import stream_rows

import deltawheel
from deltawheel import ZkConfig

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _readme_block(after: str, first_line: str) -> str:
    text = README.read_text(encoding="utf-8")
    rest = text[text.index(after):]
    for block in re.findall(r"```python\n(.*?)```", rest, flags=re.S):
        if block.lstrip().startswith(first_line):
            return str(block)
    raise AssertionError(f"no python block starting with {first_line!r} after {after!r} in the README")


def _events(folder: Path) -> list[dict[str, Any]]:
    """3 keys, 40 records over 0..39 s, in two Parquet files (one micro-batch reads both: the injector reads every new file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    rows = [{"q": f"k{i % 3}", "ts": i * 1_000} for i in range(40)]
    for part, chunk in enumerate((rows[:20], rows[20:])):
        pq.write_table(pa.Table.from_pylist(chunk), folder / f"part-{part}.parquet")
    return rows


def _bucket_counts(rows: list[dict[str, Any]], width_ms: int = 10_000) -> dict[tuple[str, int], int]:
    want: dict[tuple[str, int], int] = {}
    for r in rows:
        k = (str(r["q"]), int(r["ts"]) - int(r["ts"]) % width_ms)
        want[k] = want.get(k, 0) + 1
    return want


def _counts(spark: Any, layout: Any) -> dict[tuple[str, int], int]:
    got: dict[tuple[str, int], int] = {}
    for _rid, key, value, _ts in stream_rows(spark, layout, "counts"):
        v = json.loads(value)
        assert (key, v["start"]) not in got, "a bucket delivered twice"
        got[(key, v["start"])] = v["n"]
    return got


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_the_readme_embedding_snippet_runs_as_written(spark, zk_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The README's BucketCounter and embedding snippet: at most 5 lines beyond the computation and
    the input (the injector), every bucket counted once, no state left, the leases given back;
    ``engine.run`` prints a line per batch (by default: nothing asked for them)."""
    counter = _readme_block("## A first computation", "from datetime import timedelta")
    snippet = _readme_block("### Embedding it in your Spark job", "import deltawheel")
    code = [ln for ln in snippet.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    beyond = [ln for ln in code if not re.match(r"^(events = |\s+watermark_delay_ms)", ln)]
    assert len(beyond) <= 5, beyond
    store = tmp_path / "store"
    snippet, n = re.subn(r"^STORE, ZK = .*$", f"STORE, ZK = {str(store)!r}, {zk_server.hosts!r}", snippet, flags=re.M)
    assert n == 1, "the snippet sets STORE and ZK once, at its top"
    rows = _events(tmp_path / "events")
    snippet, n = re.subn(r'"data/events"', repr(str(tmp_path / "events")), snippet)
    assert n == 1
    ns: dict[str, Any] = {"__name__": "readme_connect"}  # not importable: its classes go to the tasks by value
    exec(compile(counter, "README.md:BucketCounter", "exec"), ns)
    exec(compile(snippet, "README.md:embedding", "exec"), ns)
    engine = ns["engine"]
    assert ns["spark"] is spark  # spark_session() hands back the running session
    out = capsys.readouterr().out
    assert re.search(r"^buckets: started in ", out, flags=re.M), out[-2000:]
    # both waiting files in one micro-batch (the injector's default: every new file), then the flush
    assert [int(b) for b in re.findall(r"^buckets batch (\d+): ", out, flags=re.M)] == [0], out[-2000:]
    assert len(re.findall(r"^buckets timers \(no input\): ", out, flags=re.M)) == 1, out[-2000:]
    assert re.search(r"^buckets batch 0: 40 in, ", out, flags=re.M), out[-2000:]
    # the last line with a low watermark shows the one the run ended with: its input finished, all delivered
    lows = re.findall(r"^buckets\b.*\blow (?:watermark )?([^;\s]+(?: [^;\s]+)?)", out, flags=re.M)
    assert lows[-1] == "end", out[-2000:]
    assert _counts(spark, engine.layout) == _bucket_counts(rows)
    left = spark.read.format("delta").load(engine.layout.rows_of("buckets")).where("computation = 'buckets' AND state IS NOT NULL")
    assert left.count() == 0  # every bucket's timer fired
    # closed: the client is stopped and no interval has an owner
    assert not engine.client.connected
    client = connect_zk(ZkConfig(hosts=zk_server.hosts))
    try:
        held = [r for r in list_leases(client, pipeline="buckets") if r["owner"] is not None]
    finally:
        client.stop()
        client.close()
    assert held == []
    with pytest.raises(ConfigError, match=r"this engine is closed: call deltawheel.connect"):
        engine.executor(ns["BucketCounter"]())


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_the_readme_snippet_with_no_zookeeper_given_uses_the_stores_own(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ZK = None as the README writes it: connect starts the store's own embedded ZooKeeper (a port
    recorded beside its data, no other store's server) and closing the engine stops it."""
    from deltawheel.servers.embedded import StoreZooKeeper

    counter = _readme_block("## A first computation", "from datetime import timedelta")
    snippet = _readme_block("### Embedding it in your Spark job", "import deltawheel")
    store = tmp_path / "store"
    snippet, n = re.subn(r'^STORE, ZK = "[^"]*", None', f"STORE, ZK = {str(store)!r}, None", snippet, flags=re.M)
    assert n == 1, "the snippet sets STORE and ZK = None once, at its top"
    rows = _events(tmp_path / "events")
    snippet = snippet.replace('"data/events"', repr(str(tmp_path / "events")))
    ns: dict[str, Any] = {"__name__": "readme_connect_own_zk"}
    exec(compile(counter, "README.md:BucketCounter", "exec"), ns)
    exec(compile(snippet, "README.md:embedding", "exec"), ns)
    engine = ns["engine"]
    assert _counts(spark, engine.layout) == _bucket_counts(rows)
    own = StoreZooKeeper(engine.layout)
    record = own.read_record()
    assert record is not None and engine.zk.hosts == record.hosts  # the engine used the store's own server
    assert own.running() is None and own.users() == []  # its last user stopped it


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_foreach_batch_with_engine_executor_and_finish(spark, zk_server, tmp_path, capsys,
                                                       migrated_at) -> None:  # type: ignore[no-untyped-def]
    """The foreachBatch form a user with their own query writes; the computation's instance
    attribute (set in ``__init__``) reaches the Spark tasks; ``progress=False`` keeps its lines off."""
    from deltawheel import Computation

    class Counter(Computation):
        name = "counter"
        inputs = {"events": "q"}
        outputs = ("counts",)
        num_intervals = 2

        def __init__(self, width_ms: int = 10_000) -> None:
            self.width_ms = width_ms

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            start = record.timestamp_ms - record.timestamp_ms % self.width_ms
            st = ctx.state or {}
            st[str(start)] = st.get(str(start), 0) + 1
            ctx.state = st
            ctx.set_timer(str(start), start + self.width_ms - 1)

        def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
            st = dict(ctx.state)
            ctx.produce("counts", {"q": ctx.key, "start": int(timer.tag), "n": st.pop(timer.tag)})
            ctx.state = st or None

    rows = _events(tmp_path / "events")
    migrated_at(tmp_path / "store")  # a new store, migrated as the template is (the README tests migrate theirs)
    events = deltawheel.ParquetInjector("events", str(tmp_path / "events"), key_column="q", event_time_column="ts",
                                       watermark_delay_ms=5_000, max_files_per_trigger=1)
    with deltawheel.connect(spark, store=str(tmp_path / "store"), zk=zk_server.hosts, pipeline="fb",
                            owner="job-1") as engine:
        ex = engine.executor(Counter(width_ms=5_000), upstream=events, progress=False)
        query = (events.stream_df(spark).writeStream.foreachBatch(ex)
                 .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
        query.awaitTermination()
        before = _counts(spark, engine.layout)
        engine.finish(ex)  # bounded input consumed: the last buckets close
        assert engine.authority.published_low_watermark("counter") is not None
    assert len(before) < len(_bucket_counts(rows, 5_000))  # the watermark held the newest buckets back
    assert _counts(spark, engine.layout) == _bucket_counts(rows, 5_000)
    assert [r.batch_id for r in ex.reports] == [0, 1, 2]  # it ran its batches, and printed none of them
    assert "counter" not in capsys.readouterr().out


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_connect_refuses_an_object_store_without_zookeeper(spark) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"s3a://bucket/s is not a local folder.*pass zk='host:port"):
        deltawheel.connect(spark, store="s3a://bucket/s")


def test_missing_session_settings_are_named_with_their_values() -> None:
    full = {"spark.sql.extensions": "x.Other, io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.delta.logStore.file.impl": "io.deltawheel.storage.ExclusiveLocalLogStore"}
    assert missing_settings(full, "data/store") == []
    assert missing_settings({**full, "spark.delta.logStore.file.impl": None}, "data/store") == [
        "spark.delta.logStore.file.impl=io.deltawheel.storage.ExclusiveLocalLogStore (unset)"]
    assert missing_settings(full, "s3a://b/s") == [
        "spark.delta.logStore.s3a.impl=io.deltawheel.storage.ZkS3LogStore (unset)"]


_PLAIN_SESSION = """
import sys
from pyspark.sql import SparkSession
import deltawheel
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    deltawheel.connect(spark, store=sys.argv[1], zk="127.0.0.1:1")
except deltawheel.SessionConfigError as exc:
    print("REFUSED:", exc)
"""


@pytest.mark.timeout(300)
def test_a_plain_session_is_refused_naming_what_it_lacks(tmp_path: Path) -> None:
    """A user's own session without Delta: connect says which settings and how to get them,
    before it touches ZooKeeper (the address given answers nothing)."""
    done = subprocess.run([sys.executable, "-c", _PLAIN_SESSION, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 0 and "REFUSED:" in out, done.stderr[-3000:]
    for key in ("spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension (unset)",
                "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
                "spark.delta.logStore.file.impl=io.deltawheel.storage.ExclusiveLocalLogStore (unset)",
                "deltawheel.spark_session(store=", "setup_jars()"):
        assert key in out


def _without_java() -> dict[str, str]:
    """This environment with no java: PATH holds only the virtual environment's bin folder."""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)
    assert shutil.which("java", path=env["PATH"]) is None
    return env


def test_no_java_gives_a_typed_error_saying_what_to_install(tmp_path: Path) -> None:
    env = _without_java()
    session = [sys.executable, "-c", "import deltawheel; deltawheel.spark_session()"]
    # the three processes are independent: started together, waited for in turn
    runs = [subprocess.Popen(cmd, env=e, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for cmd, e in ((session, env), ([str(Path(sys.executable).parent / "deltawheel"), "setup"], env),
                           (session, {**env, "JAVA_HOME": str(tmp_path)}))]
    try:
        done_err, cli_err, bad_home_err = [p.communicate(timeout=120)[1] for p in runs]
    finally:
        for p in runs:
            p.kill()
    assert runs[0].returncode != 0
    assert "deltawheel.statestore.exceptions.JavaMissingError: java not found: no `java` on PATH" in done_err
    assert "install a Java 17 (or newer) JDK" in done_err
    assert runs[1].returncode == 8  # environment (docs/operations.md, exit codes)
    assert "deltawheel setup: JavaMissingError: java not found: no `java` on PATH" in cli_err
    assert f"JAVA_HOME is {tmp_path}, but {tmp_path}/bin/java is not an executable" in bad_home_err


def test_setup_fills_the_one_jars_cache(tmp_path: Path) -> None:
    """``deltawheel setup`` (what ``./dw setup`` runs) puts the Delta jars and the compiled log store
    into ``$DELTAWHEEL_JARS_DIR``, and a second call finds them there without fetching."""
    jars = tmp_path / "jars"
    cache = Path(os.environ["DELTAWHEEL_JARS_DIR"])  # the tests' cache: copied, not fetched again
    jars.mkdir()
    for jar in cache.glob("*.jar"):
        if not jar.name.startswith("deltawheel-logstore-"):
            shutil.copy(jar, jars / jar.name)
    cli = [str(Path(sys.executable).parent / "deltawheel"), "setup"]
    # without the class-data archive's recording (a session of its own: test_class_data_archive.py)
    env = {**os.environ, "DELTAWHEEL_JARS_DIR": str(jars), "DELTAWHEEL_CDS": "0"}
    first = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "compiling ExclusiveLocalLogStore.java" in first.stderr and "compiling TxnCommit.java" in first.stderr
    assert f"jars ready (Delta Lake and the log stores in {jars})" in first.stderr
    assert len(list(jars.glob("deltawheel-logstore-*.jar"))) == 2  # the local log store, the commit helper
    again = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "fetching" not in again.stderr and "compiling" not in again.stderr
