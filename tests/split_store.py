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

import continuous_pipeline
from continuous_pipeline import MinuteTotals
from pyspark import cloudpickle

import deltawheel

if __name__ != "__main__":
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

CLICKS = 400


class UserMinutes(continuous_pipeline.UserMinutes):
    """docs/embedding.md's stage 1: a user's clicks per minute of event time, keyed by ``user``."""

    inputs = {"clicks": "user"}


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
