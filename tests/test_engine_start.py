"""``engine.start``/``engine.run`` of a Parquet injector, as a user embeds it: the tasks' direct
read of its files gives what the JVM's read gives, and a query whose first write a stop cut short
starts again instead of being refused (as the pipeline runners do)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import deltawheel
from deltawheel import RECORD_KEY, Computation

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Count(Computation):
    name = "count"
    inputs = {"clicks": RECORD_KEY}

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def _clicks(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    for part in range(2):
        rows = [{"user": f"u{i % 5}", "ts": 1_000 * i + part} for i in range(20)]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{part}.parquet")


def _run(spark: Any, zk: Any, store: str, folder: Path, comp: Computation, *,
         direct: bool) -> tuple[list[Any], list[Any], list[bool]]:
    """(state rows, dead letters, each batch's ``direct``) of ``engine.run``; ``direct=False``
    hides the injector's direct source from the engine, so the JVM reads the files."""
    from pyspark.sql import functions as F

    inj = deltawheel.ParquetInjector("clicks", str(folder), key_column="user", event_time_column="ts",
                                     watermark_delay_ms=1_000, max_files_per_trigger=1)
    if not direct:
        inj.direct_source = lambda: None  # type: ignore[method-assign]
    with deltawheel.connect(spark, store=store, zk=zk.hosts, zk_chroot=zk.chroot, pipeline="start") as engine:
        reports = engine.run(inj, comp)
        rows = (spark.read.format("delta").load(engine.layout.rows_of(comp.name))
                .where((F.col("computation") == comp.name) & ~F.col("key").startswith("\x00"))
                .select("key").collect())
        dead = (spark.read.format("delta").load(engine.layout.dead_letters)
                .select("stream", "record_id", "error").collect())
    return sorted(r["key"] for r in rows), sorted(map(tuple, dead)), [r.direct for r in reports if r.records_in]


@pytest.mark.timeout(600)
def test_the_direct_read_gives_what_the_jvm_read_gives(spark, zk_config, migrated_at, tmp_path) -> None:  # type: ignore[no-untyped-def]
    comp = Count()
    _clicks(tmp_path / "in")
    jvm = _run(spark, zk_config, migrated_at(tmp_path / "jvm").root, tmp_path / "in", comp, direct=False)
    zk = type(zk_config)(hosts=zk_config.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}")
    tasks = _run(spark, zk, migrated_at(tmp_path / "direct").root, tmp_path / "in", comp, direct=True)
    assert jvm[:2] == tasks[:2]
    assert jvm[0] == [f"u{i}" for i in range(5)] and jvm[1] == []
    assert jvm[2] == [False, False] and tasks[2] == [True, True]


@pytest.mark.timeout(600)
def test_a_first_write_cut_short_does_not_block_the_next_run(spark, zk_config, migrated_at, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A SIGKILL in the middle of the query's first ``offsets/0`` leaves Spark's temporary file:
    the next ``engine.run`` on the same store reads every file."""
    from deltawheel.executor.drivers.inputs import query_of

    _clicks(tmp_path / "in")
    layout = migrated_at(tmp_path / "store")
    chk = Path(query_of(layout, "start", Count.name)[0])
    (chk / "offsets").mkdir(parents=True)
    (chk / "offsets" / f".0.{uuid.uuid4()}.tmp").write_bytes(b"")
    rows, dead, _direct = _run(spark, zk_config, layout.root, tmp_path / "in", Count(), direct=True)
    assert rows == [f"u{i}" for i in range(5)] and dead == []
