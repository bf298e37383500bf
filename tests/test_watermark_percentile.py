"""MillWheel's injector watermark from the pending input: exact (the oldest pending event time)
and a percentile of it, beside Spark's max-seen-minus-bound, on a queue with one straggler."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

S = 1_000


def _write(path: Path, rows: list[tuple[str, int]], mtime_s: float) -> None:
    pq.write_table(pa.table({"record_id": [r for r, _t in rows], "key": ["k"] * len(rows),
                             "event_time": pa.array([t for _r, t in rows], pa.int64())}), path)
    os.utime(path, (mtime_s, mtime_s))


def test_a_percentile_outside_0_1_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.sources.parquet import ParquetInjector

    from deltawheel import ConfigError

    with pytest.raises(ConfigError, match=r"watermark_percentile must be in \[0, 1\)"):
        ParquetInjector("events", str(tmp_path), key_column="key", event_time_column="event_time",
                        watermark_delay_ms=0, watermark_percentile=1.5, max_files_per_trigger=1)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
def test_the_exact_estimate_waits_for_a_straggler_a_percentile_does_not(spark, migrated_template, zk_config,
                                                                        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Four files read one per batch; the last holds a record 29 s behind its file, 1 s into the
    first window. Exact (percentile 0): the watermark never passes the pending straggler, so it is
    counted in its window. Percentile 0.05 and max-seen-minus-5 s: the first window closes before
    the straggler is read; it is late (routed), one record of 41."""
    from conftest import copy_migrated_store
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import RoutedLate, stream_rows

    folder = tmp_path / "in"
    folder.mkdir()
    base = 1_700_000_000_000 - 1_700_000_000_000 % (10 * S)  # a window boundary
    t0 = time.time() - 100
    for f in range(4):
        rows = [(f"r{f}-{j}", base + (10 * f + j) * S) for j in range(10)]
        if f == 3:
            rows.append(("straggler", base + 1 * S))
        _write(folder / f"part-{f}.parquet", rows, t0 + f)

    def run(name: str, percentile: float | None) -> tuple[int, dict[int, int], list[int | None]]:
        layout = StoreLayout(str(tmp_path / f"store-{name}"))
        copy_migrated_store(migrated_template, tmp_path / f"store-{name}")
        inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time",
                              value_columns=[], record_id_column="record_id", watermark_delay_ms=5 * S,
                              max_files_per_trigger=1, watermark_percentile=percentile)
        summary = PipelineRunner(spark, layout, Pipeline(f"wm_{name}", (inj,), (RoutedLate(),)), zk=zk_config,
                                 progress=print).run()
        marks = [None if r.input_watermark_ms is None else r.input_watermark_ms - base
                 for r in summary.reports["routed"] if r.records_in]
        late = spark.read.format("delta").load(layout.late_data).count()
        counts: dict[int, int] = {}
        for _rid, _key, text, _ts in stream_rows(spark, layout, "counts"):
            value = json.loads(text)
            counts[int(value["start"]) - base] = counts.get(int(value["start"]) - base, 0) + int(value["n"])
        return late, counts, marks

    # the input watermark of each file's batch: the estimate published after the previous one
    exact_late, exact, marks = run("exact", 0.0)
    assert exact_late == 0 and exact == {0: 11, 10 * S: 10, 20 * S: 10, 30 * S: 10}
    assert marks == [None, 1 * S, 1 * S, 1 * S]  # the oldest pending record: the straggler
    for name, percentile, want in (("p5", 0.05, [None, 10 * S, 20 * S, 20 * S]),  # 2nd of 31, of 21; 1st of 11
                                   ("bound", None, [None, 4 * S, 14 * S, 24 * S])):  # max seen - 5 s
        late, counts, marks = run(name, percentile)
        assert (name, late, counts, marks) == (name, 1, {0: 10, 10 * S: 10, 20 * S: 10, 30 * S: 10}, want)
