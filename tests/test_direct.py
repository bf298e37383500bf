"""The direct read (executor/tasks/image/direct.py): image tasks reading a Parquet injector's files themselves.

Everything is compared with the JVM path on the same input: the prepared rows a task gets
(inside a real ``foreachBatch``), and whole pipeline runs (outputs, state, dead letters, late
records), including a crash and a restart that replays a batch from its files.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.executor.tasks.image.direct import DirectBatch, batch_files, direct_table
from deltawheel.executor.tasks.image.job import ImageTasks
from deltawheel.executor.tasks.input import prepare_input
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import IDS_KEY_PREFIX, MAX_KEY_BYTES
from executor_util import ByRecordKey, RoutedLate, state_of, stream_rows
from pyspark import cloudpickle

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# every check prepare_input makes (a null or empty record id included: under record_id_column a
# dead letter, never a position id), plus the cases that are not bad: a key with non-ASCII
# characters, sub-millisecond event times before 1970 (floored, as unix_millis does)
ODD = [("ok-1", "k1", 5_000_000), (None, "k2", 5_000_001), ("", "k3", 5_000_002), ("ok-2", "", 5_000_003),
       ("ok-3", None, 5_000_004), ("ok-4", "\x00nul", 5_000_005), ("ok-5", "\x00!extractor said no", 5_000_006),
       ("ok-6", "x" * (MAX_KEY_BYTES + 1), 5_000_007), ("ok-7", "k4", None), ("ok-8", "ключ", -1_500),
       ("ok-9", "k5", -1)]


def _write(path: Path, rows: list[tuple[str | None, str | None, int | None]], *, unit: str,
           values: bool = False) -> None:
    """rows of (record id, key, event time in microseconds); ``unit``: the event time column's type;
    ``values``: with columns of every value type the tasks encode (odd values included)."""
    ets: Any
    if unit == "us":
        ets = pa.array(rows and [t for _r, _k, t in rows], pa.int64()).cast(pa.timestamp("us", "UTC"))
    elif unit == "ms":
        ets = pa.array([None if t is None else t // 1000 for _r, _k, t in rows], pa.int64()).cast(
            pa.timestamp("ms", "UTC"))
    else:  # epoch milliseconds as a plain integer column
        ets = pa.array([None if t is None else t // 1000 for _r, _k, t in rows], pa.int64())
    cols = {"record_id": pa.array([r for r, _k, _t in rows], pa.string()),
            "key": pa.array([k for _r, k, _t in rows], pa.string()), "event_time": ets}
    if values:
        n = len(rows)
        floats = [0.1, float("nan"), float("inf"), float("-inf"), 1e16, -0.0, None, 2.5e-300]
        texts = ['say "hi"', "back\\slash", "ctl\x01\n", "ünï©ødé ✓", None, ""]
        cols |= {"n": pa.array([None if i % 5 == 0 else (i - 20) * 10**15 for i in range(n)], pa.int64()),
                 "small": pa.array([i % 100 for i in range(n)], pa.int8()),
                 "x": pa.array([floats[i % len(floats)] for i in range(n)], pa.float64()),
                 "s": pa.array([texts[i % len(texts)] for i in range(n)], pa.string()),
                 "b": pa.array([None if i % 3 == 0 else i % 2 == 0 for i in range(n)], pa.bool_())}
    pq.write_table(pa.table(cols), path)


def _events(i: int, n: int = 40) -> list[tuple[str | None, str | None, int | None]]:
    return [(f"r{i}-{j}", f"k{j % 7}", (i * 20_000 + j * 400) * 1000) for j in range(n)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("unit", "record_ids", "values", "where"), [
    ("us", True, [], "local"), ("ms", True, [], "local"), ("int", True, [], "local"), ("us", False, [], "local"),
    ("us", True, None, "local"), ("int", False, ["s", "n", "key"], "local"),
    pytest.param("us", True, None, "s3a", marks=pytest.mark.objectstore)])
def test_the_tasks_read_the_rows_the_jvm_prepares(spark, tmp_path, request, unit, record_ids, values,  # type: ignore[no-untyped-def]
                                                  where) -> None:
    """Per batch, what the tasks read from the files equals what the JVM prepares; ``s3a``: the
    input folder on the object store, read with pyarrow's S3 files."""
    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder / "part-0.parquet", _events(0) + ODD, unit=unit, values=values != [])
    _write(folder / "part 1.parquet", _events(1) + ODD[:3], unit=unit, values=values != [])  # percent-encoded
    uri = str(folder)
    if where == "s3a":
        import uuid

        from deltawheel.statestore.delta.storefs import table_files

        uri = f"s3a://{request.getfixturevalue('s3_bucket')}/{uuid.uuid4().hex}/in"
        remote = table_files(spark, uri)
        assert remote is not None and not remote.is_local
        for f in folder.iterdir():
            remote.write_parquet(pq.read_table(f), f.name)
    inj = ParquetInjector("events", uri, key_column="key", event_time_column="event_time",
                          value_columns=values, record_id_column="record_id" if record_ids else None,
                          max_files_per_trigger=2, watermark_delay_ms=1_000)
    comp = ByRecordKey()
    n = comp.num_intervals
    from pyspark.sql import functions as F

    df = inj.stream_df(spark).withColumn("stream", F.lit("events"))
    source = inj.direct_source()
    assert source is not None and (source.s3 is None) == (where == "local")
    assert source.value_columns == (("b", "key", "n", "s", "small", "x") if values is None else tuple(sorted(values)))
    seen: list[int] = []
    place = tuple((iv, 0) for iv in range(n))
    writer = types.SimpleNamespace(comp=comp, _data_cols=None)  # what ImageTasks._data_columns reads

    def check(batch: Any, batch_id: int) -> None:
        wm = 5_000  # some records are behind it
        cols, keep = ImageTasks._data_columns(writer, place)  # type: ignore[arg-type]
        assert keep is None
        jvm = prepare_input(batch, comp, wm).select(*cols).toArrow()
        files = batch_files(batch, source)
        assert files is not None and len(files) == 2
        assert all(p.startswith("s3a://") == (where == "s3a") for p, _name in files)
        for ivs in ([0, 1, 2, 3], [1, 3], [0]):
            got = direct_table(DirectBatch(source=source, files=files, num_intervals=n, late_before=wm,
                                           tasks=()), ivs)
            marks = got.filter(got.column("_m")).column("interval").to_pylist()
            assert marks == ivs
            want = jvm.filter(pa.compute.is_in(jvm.column("interval"), pa.array(ivs, pa.int32())))
            rows = sorted(map(_decoded, got.filter(pa.compute.invert(got.column("_m"))).to_pylist()), key=repr)
            assert [(f.name, str(f.type)) for f in got.schema] == [(f.name, str(f.type)) for f in jvm.schema]
            assert rows == sorted(map(_decoded, want.to_pylist()), key=repr)
            assert (values == []) == all(r["value"] is None for r in rows)
        bad = [r["_bad"] for r in jvm.to_pylist() if r["_bad"] is not None]
        why = {"key extractor returned an empty key", "keys starting with NUL are reserved", "extractor said no",
               f"key longer than {MAX_KEY_BYTES} bytes", "record without timestamp"}
        assert set(bad) == why | ({"record without record_id"} if record_ids else set())
        assert len(bad) == (10 if record_ids else 6)  # a null key is an empty one; both files' null and empty ids
        seen.append(batch_id)

    q = (df.writeStream.foreachBatch(check).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    q.awaitTermination()
    assert q.exception() is None
    assert seen == [0]


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A prepared row with its value decoded (the tasks' JSON text may differ in form, not in content);
    NaN made comparable."""
    import json

    value = None if row["value"] is None else json.loads(row["value"])
    if isinstance(value, dict) and isinstance(value.get("x"), float) and value["x"] != value["x"]:
        value["x"] = "float nan"
    return {**row, "value": value}


def test_keys_read_as_the_files_dictionary_give_the_rows_of_keys_encoded_by_the_task(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A key column without nulls is read as the Parquet file's dictionary (one per row group,
    unified); one with a null key is encoded by the task (the path the JVM comparison above covers
    with ``ODD``'s null key). Both give the same rows: bad keys, empty and null ids, null and
    ahead-of-time event times included, over several row groups."""
    from deltawheel.executor.tasks.image.direct import direct_source

    rows = _events(0, 60) + [r for r in ODD if r[1] is not None] + _events(1, 30)
    null_key = ("ok-null", None, 5_000_010)
    plain, mixed = tmp_path / "plain.parquet", tmp_path / "mixed.parquet"
    _write(plain, rows, unit="us")
    _write(mixed, rows + [null_key], unit="us")
    for f in (plain, mixed):  # several row groups: a dictionary per row group
        pq.write_table(pq.read_table(f), f, row_group_size=16)
    source = direct_source("events", pq.read_schema(plain), key_column="key", event_time_column="event_time",
                           record_id_column="record_id", value_columns=[])
    assert source is not None
    assert pq.read_table(plain, read_dictionary=["key"]).column("key").num_chunks > 1
    assert pq.read_table(mixed, read_dictionary=["key"]).column("key").null_count == 1
    for ivs in ([0, 1, 2, 3], [2], [1, 3]):
        got = [direct_table(DirectBatch(source=source, files=((str(f), "part-0.parquet"),), num_intervals=4,
                                        late_before=5_000, tasks=(), ahead=(9_000, 0)), ivs)
               for f in (plain, mixed)]
        # the mixed file's one more row: its null key (an empty key, a dead letter), if its interval is read
        extra = got[1].filter(pa.compute.equal(got[1].column("record_id"), "ok-null")).to_pylist()
        assert [r["_bad"] for r in extra] == (["key extractor returned an empty key"] if len(ivs) == 4 else [])[:len(extra)]
        same = got[1].filter(pa.compute.fill_null(pa.compute.not_equal(got[1].column("record_id"), "ok-null"), True))
        assert same.to_pylist() == got[0].to_pylist()
        if len(ivs) == 4:
            assert len(extra) == 1
            bad = {r["_bad"] for r in got[0].to_pylist() if r["_bad"] is not None}
            assert {"keys starting with NUL are reserved", "extractor said no", "key extractor returned an empty key",
                    f"key longer than {MAX_KEY_BYTES} bytes", "record without record_id",
                    "record without timestamp"} < bad  # and the ones too far ahead of the clock
        assert got[0].filter(got[0].column("_m")).column("interval").to_pylist() == ivs


def test_a_file_the_tasks_cannot_read_exactly_goes_through_the_jvm(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "in"
    folder.mkdir()
    _write(folder / "part-0.parquet", _events(0), unit="us")
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time", value_columns=[],
                          record_id_column="record_id", watermark_delay_ms=1_000, max_files_per_trigger=1)
    from pyspark.sql import functions as F

    df = inj.stream_df(spark).withColumn("stream", F.lit("events"))
    source = inj.direct_source()
    assert source is not None
    # the same columns, the event time in milliseconds: Spark reads it, the tasks would not
    _write(folder / "part-1.parquet", _events(1), unit="ms")
    found: list[Any] = []
    q = (df.writeStream.foreachBatch(lambda b, i: found.append(batch_files(b, source)))
         .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "chk")).start())
    q.awaitTermination()
    assert len(found) == 2 and found[0] is not None and found[1] is None
    # no direct read for a value or a key of a type the JVM formats (a timestamp); every other
    # column of this folder is plain
    for kw, direct in (({"value_columns": ["event_time"]}, False), ({"key_column": "event_time"}, False),
                       ({"value_columns": None}, True)):
        other = ParquetInjector("events", str(folder), **{"key_column": "key", "event_time_column": "event_time",
                                                          "record_id_column": "record_id", "value_columns": [],
                                                          "watermark_delay_ms": 1_000, **kw}, max_files_per_trigger=1)
        other.stream_df(spark)
        assert (other.direct_source() is not None) == direct, kw


class _Crash(Exception):
    pass


def _input(folder: Path) -> None:
    folder.mkdir()
    for i in range(3):
        rows = _events(i)
        if i == 2:  # behind the watermark after two files
            rows += [(f"late-{j}", f"k{j}", 1_000_000 * j) for j in range(5)]
        _write(folder / f"part-{i}.parquet", rows + [(f"{r}-{i}" if r else r, k, t) for r, k, t in ODD], unit="us")


def _outputs(spark: Any, layout: StoreLayout) -> tuple[Any, ...]:
    from pyspark.sql import functions as F

    dead = (spark.read.format("delta").load(layout.dead_letters)
            .select("computation", "stream", "record_id", "key", "raw_value", "error", "source_position",
                    "event_time_ms").collect())
    late = (spark.read.format("delta").load(layout.late_data)
            .select("computation", "stream", "record_id", "key", "value", "codec", "event_time_ms", "watermark_ms",
                    "reason").collect())
    rows = (spark.read.format("delta").load(layout.rows_of("routed"))
            .where((F.col("computation") == "routed")
                   & (~F.col("key").startswith("\x00") | F.col("key").startswith(IDS_KEY_PREFIX))))
    ids = sorted(r["record_id"] for r in rows.select(F.explode("record_ids.record_id").alias("record_id")).collect())
    return (stream_rows(spark, layout, "counts"), state_of(spark, layout, "routed"), sorted(map(tuple, dead), key=repr),
            sorted(map(tuple, late)), ids)


def _run(spark: Any, folder: Path | str, store: Path | str, zk_config: Any, *, direct: bool,
         crash_at: FaultPoint | None = None) -> tuple[tuple[Any, ...], list[bool]]:
    layout = StoreLayout(str(store))
    crashed: list[int] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is crash_at and batch_id == 1 and not crashed:
            crashed.append(batch_id)
            raise _Crash(point)

    def runner() -> PipelineRunner:  # a fresh injector, as a restarted process has
        inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time",
                              value_columns=[], record_id_column="record_id", watermark_delay_ms=2_000, max_files_per_trigger=1)
        return PipelineRunner(spark, layout, Pipeline("direct", (inj,), (RoutedLate(),)), zk=zk_config,
                              direct_read=direct, faults=faults, progress=print, end_of_input=False)

    if crash_at is not None:
        with pytest.raises(Exception, match="_Crash"):
            runner().run()
        assert crashed == [1]
    summary = runner().run()
    return _outputs(spark, layout), [r.direct for r in summary.reports["routed"] if r.records_in]


@pytest.fixture(scope="module")
def jvm_run(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig

    base = tmp_path_factory.mktemp("jvm")
    _input(base / "in")
    copy_migrated_store(migrated_template, base / "store")  # a new store, migrated as the template is
    out, direct = _run(spark, base / "in", base / "store", ZkConfig(hosts=zk_server.hosts, chroot="/direct-jvm"),
                       direct=False)
    assert direct == [False, False, False]
    return base / "in", out


@pytest.mark.timeout(900)
# the default run keeps the crash after the commit (the recovery delivers, the retry reads again);
# no crash and a crash after user code: slow suite (time)
@pytest.mark.parametrize("crash_at", [pytest.param(None, marks=pytest.mark.slow),
                                      pytest.param(FaultPoint.AFTER_USER_CODE, marks=pytest.mark.slow),
                                      FaultPoint.AFTER_COMMIT])
def test_a_pipeline_reading_directly_gives_what_the_jvm_read_gives(spark, zk_config, tmp_path, jvm_run, migrated_at,
                                                                     crash_at) -> None:  # type: ignore[no-untyped-def]
    folder, want = jvm_run
    migrated_at(tmp_path / "store")
    counts, _state, dead, late, ids = want
    assert counts and late and len(dead) >= 3 * 6 and ids  # the comparison has something to compare
    refused = [d for d in dead if d[5].startswith("ValueError")]
    assert refused and all(d[6].startswith("file=part-") for d in refused)
    got, direct = _run(spark, folder, tmp_path / "store", zk_config, direct=True, crash_at=crash_at)
    assert all(direct) and direct
    # the record ids the rows keep depend on the dedup horizon, which counts this executor's
    # batches (a restarted one counts its replay): compared for the run without a crash
    assert got[:4] == want[:4]
    assert crash_at is not None or got[4] == want[4]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_direct_read_on_separate_executors_gives_the_same(spark, zk_server, tmp_path, jvm_run) -> None:  # type: ignore[no-untyped-def]
    """On ``local-cluster[2,1,1024]`` (executor JVMs with their own Python workers): the tasks read
    the files there, and the outputs equal the JVM read's in local mode."""
    import subprocess

    folder, want = jvm_run
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("direct_cluster.py")), str(folder), str(store),
                           zk_server.hosts, "/direct-cluster", "local-cluster[2,1,1024]"],
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("DIRECT ")][-1]
    assert last == "DIRECT True True True MASTER local-cluster[2,1,1024]"
    assert _outputs(spark, StoreLayout(str(store))) == want


class _Named(ByRecordKey):
    name = "c"


def test_a_fenced_rdd_task_is_recognized_as_stale(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The direct and timers-only batches run as RDD tasks (``image/task.py``, TaskJob): a task that meets
    another writer's fence returns it in its summary (``fenced``), and the driver's collect raises
    StaleViewError naming the interval, the fence's sequencer and ours (the driver then checks the
    fences and stops with StaleSequencerError), not a user-code failure; with claimed intervals
    (two, local mode) and with the placement's (one: nothing to claim)."""
    from deltawheel.executor.tasks.image.spec import ImageSpec
    from deltawheel.executor.tasks.image.task import collect, task_job
    from deltawheel.statestore.delta.storefs import TableFiles
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import FENCE_KEY, rows_file_ddl
    from deltawheel.statestore.writepath import StaleViewError
    from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL
    from deltawheel.statestore.writepath.streams import stream_schema_ddl

    rows_schema = arrow_schema(rows_file_ddl())
    for iv, seq in ((0, 3), (1, 7)):  # interval 1 was taken over: its fence carries 7
        pq.write_table(pa.Table.from_pylist([{"key": FENCE_KEY, "sequencer": seq, "record_ids": [], "timers": [],
                                              "pending": [], "format_version": 1}], schema=rows_schema),
                       tmp_path / f"fence-{iv}.parquet")
    spec = ImageSpec(comp=_Named(), rows_root=TableFiles(str(tmp_path)),
                     images={0: ("fence-0.parquet",), 1: ("fence-1.parquet",)}, sequencers={0: 3, 1: 3},
                     stream_roots={"counts": TableFiles(str(tmp_path / "counts"))}, wm=None, now_ms=1_000,
                     horizon_ms=None, commit_id="c:0:1000", rows_schema=rows_schema,
                     stream_schema=arrow_schema(stream_schema_ddl()), stream_format_version=1, route_late=False,
                     summary_schema=arrow_schema(SUMMARY_DDL), strong=True)
    job = task_job(spark.sparkContext, spec, ((0, 0), (1, 1)), partitions=2, direct=None)
    assert job.board is not None
    with pytest.raises(StaleViewError, match=r"interval 1 of c is fenced by sequencer 7 \(ours: 3\)") as info:
        collect(job)
    assert (info.value.interval, info.value.sequencer, info.value.ours) == (1, 7, 3)
    # the other interval's fence is ours: the same tasks run it
    ok = dataclasses.replace(spec, images={0: ("fence-0.parquet",)}, sequencers={0: 3})
    one = task_job(spark.sparkContext, ok, ((0, 0),), partitions=1, direct=None)
    assert one.board is None
    out = collect(one)
    assert [iv for iv, _s in out.intervals()] == [0] and out.fenced() is None


def test_an_event_time_without_time_zone_says_why_the_tasks_do_not_read_the_files(spark, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A user's files with a naive timestamp still run (through Spark's scan), and the injector says
    once why the image tasks do not read them and what to write instead."""
    import logging

    import pyarrow.parquet as pq

    naive, zoned = tmp_path / "naive", tmp_path / "zoned"
    for folder, tz in ((naive, None), (zoned, "UTC")):
        folder.mkdir()
        pq.write_table(pa.table({"record_id": ["r1", "r2"], "key": ["a", "b"],
                                 "event_time": pa.array([1_000, 2_000], pa.timestamp("ms", tz))}),
                       folder / "part-0.parquet")
    kw: dict[str, Any] = {"key_column": "key", "event_time_column": "event_time", "value_columns": [],
                          "record_id_column": "record_id", "watermark_delay_ms": 0}
    with caplog.at_level(logging.WARNING, logger="deltawheel.executor.sources.parquet"):
        inj = ParquetInjector("events", str(naive), **kw)
        inj.stream_df(spark)
    assert inj.direct_source() is None
    assert inj.direct_refused is not None and "column 'event_time' is timestamp[ms]" in inj.direct_refused
    assert "tz='UTC'" in inj.direct_refused
    assert [r.getMessage() for r in caplog.records if "cannot read its files themselves" in r.getMessage()]
    ok = ParquetInjector("events", str(zoned), **kw)
    ok.stream_df(spark)
    assert ok.direct_source() is not None and ok.direct_refused is None
