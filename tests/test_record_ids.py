"""A record without its record id, under an injector's ``record_id_column``, is a dead letter.

Its producer's retries are deduplicated by that id, so a record without one must not be run under
an id made up from its file position: a retry of it would be processed a second time. Every
source kind with ``record_id_column`` (JSON Lines, Parquet read by the tasks and by the JVM, Delta
tables): a record whose id is missing, null or empty goes to ``dead_letters`` with its text and
the reason; a record sent twice with one id counts once; a batch run again after a crash adds no
second dead letter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.codecs import get_codec
from pyspark import cloudpickle

import deltawheel
from deltawheel import RECORD_KEY, Computation, DeltaTableInjector, JsonLinesInjector, ParquetInjector

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# two files (two micro-batches): the second sends a1 again, as a producer's retry does
FILES = [
    [{"id": "a1", "user": "ann", "ts": 1_000}, {"user": "bob", "ts": 2_000},  # no id field
     {"id": None, "user": "bob", "ts": 3_000}, {"id": "", "user": "cy", "ts": 4_000}],
    [{"id": "a1", "user": "ann", "ts": 1_000}, {"id": "b1", "user": "bob", "ts": 5_000}],
]
WITHOUT_ID = [(0, 1), (0, 2), (0, 3)]  # (file, row) of the records without an id


class Clicks(Computation):
    """Counts records per user."""

    name = "clicks_per_user"
    inputs = {"clicks": RECORD_KEY}

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


class ClicksByField(Clicks):
    """The same, keyed by the value's field: the JVM reads and prepares a Parquet injector's files."""

    inputs = {"clicks": "user"}


def _line(row: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in row.items()})


def _write(kind: str, folder: Path, spark: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("user", pa.string()), ("ts", pa.int64())])
    folder.mkdir(parents=True)
    for i, rows in enumerate(FILES):
        if kind == "jsonl":
            (folder / f"part-{i}.jsonl").write_text("".join(_line(r) + "\n" for r in rows))
        elif kind == "delta":
            spark.createDataFrame([(r.get("id"), r["user"], r["ts"]) for r in rows], "id STRING, user STRING, ts BIGINT") \
                .coalesce(1).write.format("delta").mode("append").save(str(folder))
        else:
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / f"part-{i}.parquet")
        if kind != "delta":  # read in this order
            import os

            os.utime(folder / f"part-{i}.{kind}", (1_000_000 + i, 1_000_000 + i))


def _injector(kind: str, folder: Path) -> Any:
    args: dict[str, Any] = {"key_column": "user", "event_time_column": "ts", "record_id_column": "id",
                            "watermark_delay_ms": 10_000}
    if kind == "jsonl":
        return JsonLinesInjector("clicks", str(folder), schema="id STRING, user STRING, ts BIGINT",
                                 max_files_per_trigger=1, **args)
    if kind == "delta":
        return DeltaTableInjector("clicks", str(folder), **args)
    return ParquetInjector("clicks", str(folder), max_files_per_trigger=1, **args)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("kind", "computation", "write_path"), [
    ("jsonl", Clicks, "auto"), ("parquet", Clicks, "auto"), pytest.param("parquet", ClicksByField, "merge", marks=pytest.mark.slow),
    ("delta", Clicks, "auto")])
def test_a_record_without_its_id_is_a_dead_letter_and_a_retried_id_counts_once(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path, kind, computation, write_path) -> None:
    from pyspark.sql import functions as F

    folder = tmp_path / "clicks"
    _write(kind, folder, spark)
    crashed: list[int] = []

    def crash_once(point: FaultPoint, batch_id: int) -> None:  # after the dead letters, before the commit
        if point is FaultPoint.BEFORE_COMMIT and not crashed:
            crashed.append(batch_id)
            raise RuntimeError("crash before the commit")

    with deltawheel.connect(spark, store=migrated_store.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="ids") as engine:
        with pytest.raises(Exception, match="crash before the commit"):  # Spark's wrapper of the crash
            engine.run(_injector(kind, folder), computation(), progress=False, faults=crash_once,
                       write_path=write_path)
    with deltawheel.connect(spark, store=migrated_store.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="ids") as engine:
        reports = engine.run(_injector(kind, folder), computation(), progress=False, write_path=write_path)
    assert crashed == [0] and sum(r.dead_letters for r in reports) == 3
    if kind == "parquet":  # the tasks read the files themselves when the computation keys by the key column
        assert all(r.direct == (computation is Clicks) for r in reports if r.records_in)
    codec = get_codec("json")
    rows = spark.read.format("delta").load(migrated_store.rows_of("clicks_per_user")).where(
        (F.col("computation") == "clicks_per_user") & ~F.col("key").startswith("\x00")).collect()
    assert {r["key"]: codec.decode(r["state"]) for r in rows} == {"ann": 1, "bob": 1}  # a1 once, b1; cy none
    dead = spark.read.format("delta").load(migrated_store.dead_letters).collect()
    # the run after the crash ran batch 0 again: still one dead letter per record
    assert len(dead) == 3 and {d["error"] for d in dead} == {"record without record_id"}
    assert all(d["record_id"] is None and d["stream"] == "clicks" for d in dead)
    assert sorted(d["key"] for d in dead) == ["bob", "bob", "cy"]
    got = sorted((d["source_position"], bytes(d["raw_value"]).decode()) for d in dead)
    if kind == "jsonl":  # the line as written
        want = sorted((f"file=part-{f}.jsonl#line={r + 1}", _line(FILES[f][r])) for f, r in WITHOUT_ID)
    elif kind == "parquet":  # the value: the JSON of the columns but the event time and the id
        want = sorted((f"file=part-{f}.parquet#row={r}", json.dumps({"user": FILES[f][r]["user"]}, separators=(",", ":")))
                      for f, r in WITHOUT_ID)
    else:  # Delta has no positions: the row's hash
        assert all(p.startswith("delta=sha256:") and len(p) == len("delta=sha256:") + 64 for p, _v in got)
        assert len({p for p, _v in got}) == 3
        want = sorted((p, v) for p, v in got)
        assert sorted(v for _p, v in got) == sorted(json.dumps({"user": FILES[f][r]["user"]}, separators=(",", ":"))
                                                    for f, r in WITHOUT_ID)
    assert got == want
