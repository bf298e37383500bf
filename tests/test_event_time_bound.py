"""Event times far ahead of the processing clock: dead letters with the reason, no watermark jump."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.executor.protocol.reports import BatchReport, format_report

Y2100_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
DAY_MS = 86_400_000


def _write(path: Path, rows: list[tuple[str, str, int]], mtime_s: float) -> None:
    pq.write_table(pa.table({"record_id": [r for r, _k, _t in rows], "key": [k for _r, k, _t in rows],
                             "event_time": pa.array([t for _r, _k, t in rows], pa.int64())}), path)
    os.utime(path, (mtime_s, mtime_s))


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
# the default run keeps the direct read on the image path; the JVM read and the MERGE path: slow suite (time)
@pytest.mark.parametrize(("write_path", "direct"), [("image", True), pytest.param("image", False, marks=pytest.mark.slow),
                                                    pytest.param("merge", False, marks=pytest.mark.slow)])
def test_a_record_dated_2100_is_a_dead_letter_and_moves_no_watermark(spark, migrated_store, zk_config, tmp_path,
                                                                      write_path, direct) -> None:  # type: ignore[no-untyped-def]
    """A Parquet injector's input with one record dated 2100 among records of the last hour: that
    record goes to the dead letters with the reason, the watermark stays near now, and the records
    of the next file are processed on time (before: the watermark jumped to 2099 and every later
    record was late, routed to late_data)."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from executor_util import RoutedLate

    now = int(time.time() * 1000)
    folder = tmp_path / "in"
    folder.mkdir()
    first = [(f"a{j}", f"k{j % 5}", now - 3_600_000 + j * 10_000) for j in range(20)]
    _write(folder / "part-0.parquet", first[:10] + [("future", "k1", Y2100_MS)] + first[10:], time.time() - 60)
    _write(folder / "part-1.parquet", [(f"b{j}", f"k{j % 5}", now - 3_000_000 + j * 10_000) for j in range(20)],
           time.time() - 30)
    layout = migrated_store
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time",
                          value_columns=[], record_id_column="record_id", watermark_delay_ms=60_000, max_files_per_trigger=1)
    summary = PipelineRunner(spark, layout, Pipeline("ahead", (inj,), (RoutedLate(),)), zk=zk_config,
                             write_path=write_path, direct_read=direct, progress=print, end_of_input=False).run()
    reports = [r for r in summary.reports["routed"] if r.records_in]
    assert [r.direct for r in reports] == [direct, direct]
    dead = spark.read.format("delta").load(layout.dead_letters).collect()
    assert [d["record_id"] for d in dead] == ["future"]
    assert dead[0]["error"] == (f"event time {Y2100_MS} ms is more than {DAY_MS} ms ahead of the processing clock "
                                f"({dead[0]['error'].split('(')[1].split(' ')[0]} ms): refused so that it cannot move "
                                "the watermark past every open window; fix the record's timestamp or raise the "
                                "injector's max_event_ahead_ms")
    assert spark.read.format("delta").load(layout.late_data).count() == 0
    assert (sum(r.processed for r in reports), sum(r.late for r in reports)) == (40, 0)
    assert inj.watermark_ms() == now - 3_000_000 + 19 * 10_000 - 60_000
    low = summary.low_watermarks["routed"]
    assert low is None or low < now + DAY_MS


def test_batch_lines_print_the_date_of_a_watermark_not_of_today() -> None:
    now = 1_795_000_000_000  # 2026-11-18T...
    r = BatchReport(batch_id=3, records_in=1, processed=1, duplicates=0, late=0, late_routed=0, dead_letters=0,
                    timers_fired=0, productions=0, keys_written=1, input_watermark_ms=now - 60_000,
                    low_watermark_ms=Y2100_MS - DAY_MS, commit_s=0.1, wall_s=0.2)
    line = format_report("c", r, now_ms=now)
    today = time.strftime("%H:%M:%S", time.gmtime((now - 60_000) / 1000))
    assert f"wm in {today} low 2099-12-31 00:00:00;" in line
    assert "wm in 2026-11-18 " in format_report("c", r, now_ms=now + 2 * DAY_MS)
