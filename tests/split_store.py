"""A store of the first layout (one rows table for every computation) and the pipeline that made it.

``python tests/split_store.py make OUT.tar.gz``, run with deltawheel at schema version 7, runs
docs/embedding.md's two stages over the first half of the clicks (a Delta table beside the store,
the store's own embedded ZooKeeper), stops without ending the input (open minutes stay in the
state), and packs store and input: ``tests/data/layout7-store.tar.gz``. test_split_migration.py
migrates it and runs the same pipeline on over the second half."""

from __future__ import annotations

import random
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

import deltawheel
from deltawheel import RECORD_KEY, Computation

if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

MINUTE = 60_000
CLICKS = 400


class UserMinutes(Computation):
    """Stage 1: a user's clicks per minute of event time, produced once the minute is over."""

    name = "user_minutes"
    inputs = {"clicks": "user"}
    outputs = ("user_counts",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        start = record.timestamp_ms - record.timestamp_ms % MINUTE
        st = ctx.state or {}
        st[str(start)] = st.get(str(start), 0) + 1
        ctx.state = st
        ctx.set_timer(str(start), start + MINUTE - 1)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state)
        start = int(timer.tag)
        ctx.produce("user_counts", {"user": ctx.key, "start": start, "clicks": st.pop(timer.tag)}, key=str(start))
        ctx.state = st or None


class MinuteTotals(Computation):
    """Stage 2: per minute, how many users clicked and how often."""

    name = "minute_totals"
    inputs = {"user_counts": RECORD_KEY}
    outputs = ("totals",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        st = ctx.state or {"users": 0, "clicks": 0}
        st["users"] += 1
        st["clicks"] += record.value["clicks"]
        ctx.state = st
        ctx.set_timer("end", record.timestamp_ms)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        ctx.produce("totals", {"start": int(ctx.key), **ctx.state})
        ctx.state = None


def clicks() -> list[dict[str, Any]]:
    """8 users' clicks over about 10 minutes of event time, in time order (none late)."""
    rng = random.Random(41)
    return [{"record_id": f"c{i}", "user": f"u{rng.randrange(8)}", "ts": i * 1_500 + rng.randrange(500)}
            for i in range(CLICKS)]


def append_clicks(spark: Any, path: Path, rows: list[dict[str, Any]]) -> None:
    spark.createDataFrame(rows, schema="record_id STRING, user STRING, ts BIGINT").coalesce(1).write.format(
        "delta").mode("append").save(str(path))


def pipeline(input_path: Path) -> deltawheel.Pipeline:
    inj = deltawheel.DeltaTableInjector("clicks", str(input_path), key_column="user", event_time_column="ts",
                                        watermark_delay_ms=5_000)
    return deltawheel.Pipeline("clicks", injectors=(inj,), computations=(UserMinutes(), MinuteTotals()))


def run(spark: Any, store: Path, input_path: Path, *, end: bool) -> Any:
    """The pipeline on ``store`` (its embedded ZooKeeper) to the end of what the input holds;
    ``end``: that is the end of the input (every minute produced)."""
    with deltawheel.connect(spark, store=str(store), pipeline="clicks") as engine:
        return engine.run_pipeline(pipeline(input_path), progress=False, end_of_input=end)


def make(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spark = deltawheel.spark_session(store=str(root / "store"))
        append_clicks(spark, root / "input", clicks()[: CLICKS // 2])
        run(spark, root / "store", root / "input", end=False)
        spark.stop()
        with tarfile.open(out, "w:gz") as tar:
            tar.add(root / "store", arcname="store")
            tar.add(root / "input", arcname="input")


if __name__ == "__main__":
    if sys.argv[1:2] != ["make"] or len(sys.argv) != 3:
        raise SystemExit("usage: python tests/split_store.py make OUT.tar.gz")
    make(Path(sys.argv[2]).resolve())
