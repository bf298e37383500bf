"""The pipeline runner takes each executor's leases, then runs the rest of its start (fence,
recovery) while the streaming query starts; the first batch waits for it. What a user sees must
not change: a start that fails (another owner holds the intervals) stops the run with the typed
error before any query touched the checkpoint, and loses nothing; the rows of a run are those of
the same run with the start done first."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _input(folder, n: int = 60) -> None:  # type: ignore[no-untyped-def]
    folder.mkdir()
    ids = range(n)
    pq.write_table(pa.table({"record_id": [f"r{i}" for i in ids], "key": [f"k{i % 6}" for i in ids],
                             "event_time": pa.array([1_000 * i for i in ids], pa.timestamp("ms", "UTC"))}),
                   folder / "part-0.parquet")


def _assert_copier_leases_free(zk_config) -> None:  # type: ignore[no-untyped-def]
    """Another owner takes the ``copier`` intervals at once (raises if any is still held), then
    gives them back."""
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    client = connect(zk_config)
    try:
        other = LeaseManager(client, pipeline="starts", owner="someone-else")
        other.acquire("copier", [0, 1])
        other.release("copier", [0, 1])
    finally:
        client.stop()
        client.close()


def _runner(spark, tmp_path, zk_config, **kw):  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import Copier, CopyCounter

    inj = ParquetInjector("events", str(tmp_path / "in"), key_column="key", event_time_column="event_time",
                          value_columns=[], record_id_column="record_id", watermark_delay_ms=1_000, max_files_per_trigger=1)
    return PipelineRunner(spark, StoreLayout(str(tmp_path / "store")),
                          Pipeline("starts", (inj,), (Copier(), CopyCounter())), zk=zk_config, **kw)


@pytest.mark.timeout(600)
def test_a_start_that_fails_stops_the_run_typed_and_a_later_run_loses_nothing(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import LeaseHeldError
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import state_of

    _input(tmp_path / "in")
    migrated_at(tmp_path / "store")  # a new store (migrated by the run): the two-output-streams test below
    lines: list[str] = []
    client = connect(zk_config)
    try:
        other = LeaseManager(client, pipeline="starts", owner="someone-else")
        other.acquire("copier", [0])  # another job holds one interval of the first stage
        with pytest.raises(LeaseHeldError, match="someone-else"):
            _runner(spark, tmp_path, zk_config, wait_s=0.5, progress=lines.append).run()
        assert not any("leases held" in line and "copier" in line for line in lines), lines
        # no query ran without the leases: they keep a second copy of a job off its checkpoint
        assert not (tmp_path / "store" / "_checkpoints" / "starts" / "copier" / "offsets").exists()
        other.release("copier", [0])
    finally:
        client.stop()
        client.close()
    summary = _runner(spark, tmp_path, zk_config).run()  # the same job again, the interval free
    assert sum(r.records_in for r in summary.reports["copier"]) == 60
    assert state_of(spark, StoreLayout(str(tmp_path / "store")), "copy_counter") == {
        f"k{i}": (10, []) for i in range(6)}


@pytest.mark.timeout(600)
def test_the_rows_are_those_of_a_run_that_started_first(spark, zk_config, tmp_path, monkeypatch,
                                                        migrated_at) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import state_of

    _input(tmp_path / "in")
    migrated_at(tmp_path / "store")
    overlapped = _runner(spark, tmp_path, zk_config).run()
    first = state_of(spark, StoreLayout(str(tmp_path / "store")), "copy_counter")
    assert all(r.batch_id >= 0 for r in overlapped.reports["copier"])

    # the same job on a fresh store, each start done before its query starts
    monkeypatch.setattr(ComputationExecutor, "start_in_background",
                        lambda self, *, wait_s=0.0, then=None: (self.start(wait_s=wait_s), then and then()))
    again = tmp_path / "again"
    again.mkdir()
    (again / "in").symlink_to(tmp_path / "in")
    migrated_at(again / "store")
    zk2 = ZkConfig(hosts=zk_config.hosts, chroot=zk_config.chroot + "-sync", session_timeout_s=6.0)
    _runner(spark, again, zk2).run()
    assert state_of(spark, StoreLayout(str(again / "store")), "copy_counter") == first == {
        f"k{i}": (10, []) for i in range(6)}


def _copies(spark, layout) -> list[str]:  # type: ignore[no-untyped-def]
    """The ids of the records the copier delivered to ``copies``, one entry per stream row."""
    from executor_util import stream_rows

    return sorted(json.loads(value)["id"] for _rid, _key, value, _ts in stream_rows(spark, layout, "copies"))


@pytest.mark.timeout(600)
def test_a_stream_table_that_cannot_be_made_fails_the_first_batch_typed_and_a_later_run_loses_nothing(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """The stream tables are made beside the claim's commit, once the leases are held, and waited
    for by the first batch that needs one. A store where one cannot be made (a file sits where the
    table's folder belongs) stops the run with ConfigError at that batch, before it committed
    anything; the leases are free again at once, and the run after the repair delivers every
    record exactly once."""
    from deltawheel.statestore.delta.log import commit_infos
    from deltawheel.statestore.exceptions import ConfigError
    from executor_util import state_of

    _input(tmp_path / "in")
    layout = migrated_at(tmp_path / "store")
    blocked = tmp_path / "store" / "streams" / "copies"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a table")
    lines: list[str] = []
    with pytest.raises(ConfigError, match=r"the table of stream 'copies' cannot be made at .*copies: .*clear that"):
        _runner(spark, tmp_path, zk_config, progress=lines.append).run()
    # the start held the leases; the first batch failed where it needed the table, before its commit
    assert any("leases held" in line and "copier" in line for line in lines), lines
    assert not any(line.startswith(("copier batch", "copy_counter batch")) for line in lines), lines
    kinds = [json.loads(info.get("userMetadata") or "{}").get("kind")
             for _v, info in commit_infos(layout.rows_of("copier"), after=-1) or ()]
    assert "claim" in kinds and "commit" not in kinds, kinds
    _assert_copier_leases_free(zk_config)  # no wait: the failed run gave them back
    assert blocked.read_text() == "not a table"  # nothing was written over it
    blocked.unlink()
    summary = _runner(spark, tmp_path, zk_config).run()
    assert sum(r.records_in for r in summary.reports["copier"]) == 60
    assert _copies(spark, layout) == sorted(f"r{i}" for i in range(60))  # each once
    assert state_of(spark, layout, "copy_counter") == {f"k{i}": (10, []) for i in range(6)}


def _splitter():  # type: ignore[no-untyped-def]
    from deltawheel.executor.computation import RECORD_KEY, Computation

    class Splitter(Computation):
        """Sends each record to ``evens`` or ``odds`` by the number in its id."""

        name = "splitter"
        inputs = {"events": RECORD_KEY}
        outputs = ("evens", "odds")
        num_intervals = 2

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            n = int(record.record_id[1:])
            ctx.produce("evens" if n % 2 == 0 else "odds", {"id": record.record_id}, timestamp_ms=record.timestamp_ms)

    return Splitter()


@pytest.mark.timeout(600)
def test_a_pipeline_with_two_output_streams_on_a_new_store_fills_both_tables(
        spark, zk_config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Both output tables are made during the start, waited for by the first batch: each gets
    exactly its records, and both are stream tables (their properties) Delta reads."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import stream_rows

    _input(tmp_path / "in")
    layout = StoreLayout(str(tmp_path / "store"))
    inj = ParquetInjector("events", str(tmp_path / "in"), key_column="key", event_time_column="event_time",
                          value_columns=[], record_id_column="record_id", watermark_delay_ms=1_000)
    summary = PipelineRunner(spark, layout, Pipeline("split", (inj,), (_splitter(),)), zk=zk_config).run()
    assert sum(r.records_in for r in summary.reports["splitter"]) == 60
    for stream, rest in (("evens", 0), ("odds", 1)):
        got = sorted(json.loads(value)["id"] for _rid, _key, value, _ts in stream_rows(spark, layout, stream))
        assert got == sorted(f"r{i}" for i in range(60) if i % 2 == rest), stream
        props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{layout.stream(stream)}`").collect()}
        assert props["deltawheel.table"] == "stream" and props["deltawheel.stream"] == stream, props


@pytest.mark.timeout(600)
def test_a_store_newer_than_the_code_stops_the_run_typed_with_nothing_written(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """The store's migrations are planned while ZooKeeper connects: a store a newer deltawheel
    wrote still stops the run with that error before any lease is taken or anything written."""
    from deltawheel.statestore.delta.log import latest_local_version
    from deltawheel.statestore.exceptions import SchemaTooNewError

    _input(tmp_path / "in")
    layout = migrated_at(tmp_path / "store")
    spark.createDataFrame([(99, "from_the_future", 0, "9.9.9")],
                          schema="version INT, name STRING, applied_ms BIGINT, deltawheel_version STRING"
                          ).write.format("delta").mode("append").save(layout.meta)
    rows_version = latest_local_version(layout.rows)
    lines: list[str] = []
    with pytest.raises(SchemaTooNewError, match="schema version 99, .* upgrade deltawheel"):
        _runner(spark, tmp_path, zk_config, progress=lines.append).run()
    assert not any("waiting for leases" in line for line in lines), lines
    assert latest_local_version(layout.rows) == rows_version  # no claim, no batch
    assert not os.path.exists(layout.computations_root)  # no computation's table made
    _assert_copier_leases_free(zk_config)  # the refused run took none


@pytest.mark.timeout(600)
def test_a_topology_declared_otherwise_stops_the_run_typed_before_any_batch(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """The computation's topology is declared while its leases are taken: a different declaration
    in ZooKeeper stops the run with ConfigError before any batch ran, and the leases are free
    again."""
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    _input(tmp_path / "in")
    migrated_at(tmp_path / "store")
    client = connect(zk_config)
    try:
        WatermarkAuthority(client, pipeline="starts").declare("copier", upstream=["injector:other"], num_intervals=2)
        lines: list[str] = []
        with pytest.raises(ConfigError, match=r"copier is already declared with upstream \['injector:other'\]"):
            _runner(spark, tmp_path, zk_config, progress=lines.append).run()
        assert not any(line.startswith(("copier batch", "copy_counter batch")) for line in lines), lines
        assert not (tmp_path / "store" / "_checkpoints" / "starts" / "copier" / "commits" / "0").exists()
        _assert_copier_leases_free(zk_config)  # no wait: the failed start gave them back
    finally:
        client.stop()
        client.close()


@pytest.mark.timeout(600)
def test_a_synchronous_start_returns_with_its_stream_tables_made_or_fails_typed(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """``ComputationExecutor.start`` (engines, recovery, instances) still returns once the output
    streams' tables exist; one that cannot be made fails the start with ConfigError and the
    leases are given back."""
    from pathlib import Path

    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import Copier

    layout = migrated_at(tmp_path / "store")
    blocked = Path(layout.stream("copies"))
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a table")
    client = connect(zk_config)
    try:
        def executor() -> ComputationExecutor:
            owner = IntervalOwner(RowStore(spark, layout, writer="w"), LeaseManager(client, pipeline="starts", owner="w"),
                                  "copier", num_intervals=2)
            return ComputationExecutor(spark, layout, Copier(), owner=owner, progress=print)

        with pytest.raises(ConfigError, match=r"the table of stream 'copies' cannot be made"):
            executor().start(wait_s=5)
        _assert_copier_leases_free(zk_config)
        blocked.unlink()
        ex = executor()
        ex.start(wait_s=5)
        try:
            assert (blocked / "_delta_log" / f"{0:020d}.json").exists()
        finally:
            ex.stop()
    finally:
        client.stop()
        client.close()
