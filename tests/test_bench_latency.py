"""``deltawheel bench latency``: the input schedule, the exactly-once checks (they pass on a right
output and flag a duplicated, missing or miscounted record), what the command refuses, and a
short real run of deltawheel and the stateless floor (correctness only, never speed; the full
run of every engine is ``-m benchmark``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltawheel.benchmarks.latency import LatencyBenchError, LatencySettings, run_latency
from deltawheel.benchmarks.latency_input import Schedule
from deltawheel.benchmarks.latency_log import DeltaLogTail
from deltawheel.benchmarks.latency_measure import check_key_counts, check_records

from deltawheel.cli import main as cli_main


def _failed(checks: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {c.name: c.detail for c in checks if not c.ok}


def _right_records(s: Schedule) -> pa.Table:
    """One row per record with the running count a correct engine gives it (in record id order)."""
    seen: dict[int, int] = {}
    counts = []
    for k in s.key_ids.tolist():
        seen[k] = seen.get(k, 0) + 1
        counts.append(seen[k])
    return pa.table({"record_id": pa.array(np.arange(s.total), pa.int64()), "key": pa.array(s.key_ids, pa.int64()),
                     "count": pa.array(counts, pa.int64()), "version": pa.array(np.zeros(s.total, np.int64))})


def test_schedule_holds_every_record_once_at_the_rate() -> None:
    s = Schedule(rate=500, seconds=4, seed=3, keys=50)
    gaps = np.diff(s.offsets_s[1:])
    assert gaps.min() >= 0.1 and gaps.max() <= 0.2 and s.offsets_s[-1] <= 4
    # ids run 0..total-1 through the files in order, the files after the primer at the rate
    assert s.first_ids[0] == 0 and np.all(np.diff(s.first_ids) == s.counts[:-1])
    assert abs(int(s.counts[1:].sum()) - 500 * s.offsets_s[-1]) <= 1
    assert set(np.unique(s.key_ids)) <= set(range(50)) and len(np.unique(s.key_ids)) == 50
    assert np.array_equal(Schedule(rate=500, seconds=4, seed=3, keys=50).key_ids, s.key_ids)


def test_record_checks_pass_on_a_right_output_and_flag_a_duplicate_a_gap_and_a_wrong_count() -> None:
    s = Schedule(rate=200, seconds=2, seed=1, keys=20)
    right = _right_records(s)
    assert _failed(check_records(s, right)) == {}
    dup = pa.concat_tables([right, right.slice(5, 1)])
    assert set(_failed(check_records(s, dup))) == {"exactly_once", "running_counts"}
    assert "1 more than once" in _failed(check_records(s, dup))["exactly_once"]
    gap = pa.concat_tables([right.slice(0, 7), right.slice(8)])
    assert "1 missing" in _failed(check_records(s, gap))["exactly_once"]
    assert "1 missing" in _failed(check_records(s, gap, counted=False))["exactly_once"]
    miscounted = right.set_column(2, "count", pa.array(np.ones(s.total, np.int64)))
    assert set(_failed(check_records(s, miscounted))) == {"running_counts"}
    # a record whose file was never renamed into the input is not expected
    renamed = np.zeros(s.n_files)
    renamed[-1] = np.nan
    assert "unknown ids" in _failed(check_records(s, right, renamed=renamed))["exactly_once"]


def test_key_count_checks_follow_each_batch_increment() -> None:
    s = Schedule(rate=200, seconds=2, seed=2, keys=10)
    file_batch = np.arange(s.n_files) // 3  # three files per batch
    batch = file_batch[s.file_of]
    rows, total = [], {}
    for b in np.unique(batch).tolist():
        for k, n in zip(*np.unique(s.key_ids[batch == b], return_counts=True), strict=True):
            total[int(k)] = total.get(int(k), 0) + int(n)
            rows.append({"batch_id": b, "key": int(k), "count": total[int(k)], "version": b})
    right = pa.Table.from_pylist(rows)
    assert _failed(check_key_counts(s, right, file_batch=file_batch)) == {}
    twice = pa.concat_tables([right, right.slice(3, 1)])
    assert set(_failed(check_key_counts(s, twice, file_batch=file_batch))) == {"one_row_per_batch_and_key"}
    short = right.slice(0, right.num_rows - 1)  # the last batch's last key never updated
    assert set(_failed(check_key_counts(s, short, file_batch=file_batch))) == {"batch_increments", "final_counts"}
    unread = file_batch.copy()
    unread[4] = -1
    assert "1 of" in _failed(check_key_counts(s, right, file_batch=unread))["files_read"]


def test_a_failed_check_is_printed_loudly() -> None:
    from deltawheel.benchmarks.latency_measure import format_table

    lat = {"n": 10, "p50": 1.0, "p95": 1.0, "p99": 1.0, "max": 1.0}
    common = {"latency_s": lat, "throughput": {"input_records_per_s": 10.0, "output_records_per_s": 10.0},
              "batches": {"count": 1, "duration_s": {}}}
    report = {"engines": {
        "good": {**common, "ok": True, "error": None, "checks": [{"stage": 1, "name": "exactly_once", "ok": True,
                                                                 "detail": "fine"}]},
        "bad": {**common, "ok": False, "error": "not drained: ...",
                "checks": [{"stage": 1, "name": "exactly_once", "ok": False, "detail": "3 missing"}]}}}
    lines = format_table(report).splitlines()
    assert [ln.split()[:2] for ln in lines[2:4]] == [["good", "ok"], ["bad", "FAILED"]]
    assert lines[4:] == ["!!! bad FAILED: not drained: ...", "!!! bad FAILED check exactly_once (stage 1): 3 missing"]


@pytest.mark.parametrize(("change", "message"), [
    ({"stages": 2}, r"--stages must be 1 or 3, not 2"),
    ({"source": "pigeons"}, r"--source must be files or kafka, not 'pigeons'"),
    ({"engines": ("deltawheel", "flink")}, r"unknown engine\(s\) \['flink'\]"),
    ({"warmup_s": 10.0}, r"--warmup 10 s leaves no steady state in --seconds 5"),
    ({"later_trigger": "soon", "warmup_s": 1.0}, r"--later-trigger: trigger 'soon': expected a processing-time interval"),
])
def test_what_the_benchmark_refuses(change: dict, message: str, tmp_path: Path) -> None:  # type: ignore[type-arg]
    st = LatencySettings(rate=100, seconds=5, out=tmp_path, **change)
    with pytest.raises(LatencyBenchError, match=message):
        run_latency(st, progress=None)


def test_the_command_refuses_a_run_with_no_steady_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "latency", "--stages", "3", "--source", "kafka", "--seconds", "5", "--warmup", "5",
                     "--out", str(tmp_path)]) == 3
    assert "LatencyBenchError: --warmup 5 s leaves no steady state in --seconds 5" in capsys.readouterr().err


def test_later_stages_and_kafka_outputs_name_their_input_record() -> None:
    from deltawheel.benchmarks.latency_deltawheel import records_from_kafka_stream, records_from_stream

    ids = ["running_count:5#1", "stage2:running_count:6#1#1", "stage3:stage2:running_count:17#1#1#1"]
    t = pa.table({"record_id": ids, "key": ["k00001", "k00002", "k00003"],
                  "value": pa.array([b"3", b"1", b"12"], pa.binary())})
    got = records_from_stream(t).to_pylist()
    assert got == [{"record_id": 5, "key": 1, "count": 3}, {"record_id": 6, "key": 2, "count": 1},
                   {"record_id": 17, "key": 3, "count": 12}]
    kafka = pa.table({"record_id": ["running_count:events/t/0@4#1", "stage2:running_count:events/t/1@0#1#1"],
                      "key": ["k00007", "k00008"],
                      "value": pa.array([b'{"r": 12, "n": 3}', b'{"n":4,"r":130}'], pa.binary())})
    assert records_from_kafka_stream(kafka).to_pylist() == [{"record_id": 12, "key": 7, "count": 3},
                                                            {"record_id": 130, "key": 8, "count": 4}]


def test_a_kafka_records_batch_comes_from_the_offset_log(tmp_path: Path) -> None:
    """Spark's offset log (``offsets/<batch>``: version, metadata, then each source's end offsets):
    batch n read each partition up to its end offset there."""
    from deltawheel.benchmarks.latency_kafka import record_batches

    (tmp_path / "offsets").mkdir()
    for n, ends in enumerate([{"0": 3, "1": 2}, {"0": 3, "1": 6}, {"0": 5, "1": 6}]):
        (tmp_path / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps({"t": ends})}')
    part = np.array([0, 0, 0, 0, 1, 1, 1, 0, -1])
    off = np.array([0, 2, 3, 4, 1, 2, 5, 5, -1])
    assert record_batches(tmp_path, "t", part, off).tolist() == [0, 0, 2, 2, 0, 1, 1, -1, -1]


def test_key_count_checks_take_each_records_batch() -> None:
    s = Schedule(rate=200, seconds=2, seed=2, keys=10)
    record_batch = np.arange(s.total) % 4  # records of one file in several batches, as Kafka partitions do
    rows, total = [], {}
    for b in range(4):
        for k, n in zip(*np.unique(s.key_ids[record_batch == b], return_counts=True), strict=True):
            total[int(k)] = total.get(int(k), 0) + int(n)
            rows.append({"batch_id": b, "key": int(k), "count": total[int(k)], "version": b})
    right = pa.Table.from_pylist(rows)
    unused = np.full(s.n_files, -1)
    assert _failed(check_key_counts(s, right, file_batch=unused, record_batch=record_batch)) == {}
    unread = record_batch.copy()
    unread[3] = -1
    assert "1 of" in _failed(check_key_counts(s, right, file_batch=unused, record_batch=unread))["records_read"]


def test_the_figure_leaves_out_the_primer_records_written_before_the_schedule(tmp_path: Path) -> None:
    """The primer file goes in before the schedule starts (t < 0): the latency-over-time panel
    starts at the schedule's start, not at the primer's lead time."""
    from deltawheel.benchmarks.plot import plot_latency, scheduled_points

    points = [{"t": -80.0, "p50": 3.0, "max": 4.0}, {"t": 0.0, "p50": 0.5, "max": 0.9},
              {"t": 1.0, "p50": 0.4, "max": 0.7}]
    assert [p["t"] for p in scheduled_points(points)] == [0.0, 1.0]
    stage = {"stage": 1, "latency_s": {"n": 3, "p50": 0.5, "p99": 0.9}, "quantiles_s": [0.4, 0.5, 0.9],
             "over_time": points}
    report = {"settings": {"rate": 10, "keys": 5, "seconds": 2, "warmup_s": 0}, "machine": {},
              "engines": {"deltawheel": {"ok": True, "latency_s": stage["latency_s"], "stages": [stage]}}}
    assert plot_latency(report, tmp_path / "latency.png").stat().st_size > 0


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_a_short_run_of_deltawheel_and_the_floor_is_exactly_once(spark, zk_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 2 s of input at 100 records/s: a second past the warm-up, the checks need no more
    st = LatencySettings(rate=100, seconds=2, engines=("deltawheel", "floor"), out=tmp_path / "out", warmup_s=1,
                         prewarm_s=0, progress_every_s=2, drain_timeout_s=120, zk=zk_server.hosts, keys=500)
    lines: list[str] = []
    report = run_latency(st, spark=spark, progress=lines.append)
    assert report["machine"]["spark"] == spark.version  # the version, as bench throughput writes it
    saved = json.loads((tmp_path / "out" / "latency.json").read_text())
    assert (tmp_path / "out" / "latency.png").stat().st_size > 0
    assert set(saved["engines"]) == {"deltawheel", "floor"}
    for name, e in report["engines"].items():
        assert e["ok"], (name, e["error"], [c for c in e["checks"] if not c["ok"]])
        assert e["latency_s"]["n"] > 0 and e["latency_s"]["p50"] > 0 and e["batches"]["count"] >= 1
        assert e["input"]["records"] == st.schedule().total
    assert {c["name"] for c in report["engines"]["deltawheel"]["checks"]} == {"exactly_once", "keys", "running_counts"}
    assert any(ln.startswith("[deltawheel]") and "records in" in ln for ln in lines)
    # the driver JVM's CPU per thread group: the queries' own threads, started within the measured run
    threads = report["engines"]["deltawheel"]["peak_memory"]["driver_jvm_threads_cpu_s"]
    assert threads.get("stream_execution", 0) > 0, threads
    assert any(ln.startswith("[deltawheel] driver JVM CPU seconds by thread: ") for ln in lines), lines
    # the same checks flag the real output once a record is delivered twice or lost
    s = st.schedule()
    out = report["engines"]["deltawheel"]["stages"][0]
    from deltawheel.benchmarks.latency_deltawheel import records_from_stream

    tail = DeltaLogTail(Path(out["table"]), records_from_stream)
    tail.poll()
    rows = tail.rows()
    assert rows is not None and rows.num_rows == s.total
    assert _failed(check_records(s, rows)) == {}
    assert "1 more than once" in _failed(check_records(s, pa.concat_tables([rows, rows.slice(0, 1)])))["exactly_once"]
    assert "1 missing" in _failed(check_records(s, rows.slice(1)))["exactly_once"]


@pytest.mark.benchmark
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(1800)
def test_full_run_of_every_engine(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every engine at 1,000 records/s for 30 s (correctness only; the figures go to the JSON)."""
    st = LatencySettings(rate=1000, seconds=30, out=tmp_path / "out")
    report = run_latency(st, spark=spark)
    failed = {n: [c for c in e["checks"] if not c["ok"]] or e["error"] for n, e in report["engines"].items()
              if not e["ok"]}
    assert not failed


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(1800)
def test_three_stages_of_every_engine_are_exactly_once_per_stage(spark, zk_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--stages 3`` at a tiny scale: the three outputs of deltawheel, Spark SQL and the floor checked,
    each later stage's added latency and deltawheel's watermark lag in the JSON, the stages in the
    printed table. (transformWithStateInPandas' later stages are the same ``chain`` of queries as the
    floor's; its Python worker start is what fails first on a loaded machine.)"""
    st = LatencySettings(rate=100, seconds=4, out=tmp_path / "out", warmup_s=1, prewarm_s=0, progress_every_s=5,
                         drain_timeout_s=300, zk=zk_server.hosts, keys=200, stages=3, later_trigger="300 milliseconds",
                         engines=("deltawheel", "deltawheel_fused", "spark_sql", "floor"))
    lines: list[str] = []
    report = run_latency(st, spark=spark, progress=lines.append)
    for name, e in report["engines"].items():
        assert e["ok"], (name, e["error"], [c for c in e["checks"] if not c["ok"]])
        assert [s["stage"] for s in e["stages"]] == [1, 2, 3]
        assert {c["stage"] for c in e["checks"]} == {1, 2, 3}
        for s in e["stages"]:
            assert s["added_latency_s"]["n"] > 0 and s["latency_s"]["n"] > 0
        # a later stage's output comes after its upstream's, record by record
        assert e["stages"][2]["latency_s"]["p50"] >= e["stages"][0]["latency_s"]["p50"]
        assert e["latency_s"] == e["stages"][2]["latency_s"]
    dw = report["engines"]["deltawheel"]["stages"]
    assert dw[0]["watermark_lag_s"]["n"] > 0  # a later stage's is known once its upstream's watermark was
    assert all("watermark_lag_s" in s and s["per_batch"] and "engine" in s["per_batch"][0] for s in dw)
    assert report["engines"]["deltawheel"]["settings"]["later_trigger"] == "stages 2..3: every 300 milliseconds"
    fused = report["engines"]["deltawheel_fused"]
    assert "each later stage fused" in fused["settings"]["runner"] and "later_trigger" not in fused["settings"]
    assert all(s["batches"]["count"] > 0 for s in fused["stages"])  # stages 2 and 3: their executors' batches
    assert all(s["per_batch"] and "engine" in s["per_batch"][-1] for s in fused["stages"])
    printed = "\n".join(lines).splitlines()
    assert sum(ln.startswith("  stage ") for ln in printed) == 3 * len(report["engines"])


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(1800)
def test_kafka_source_is_exactly_once_with_arrivals_from_the_append_time(spark, zk_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``--source kafka`` at a tiny scale against a broker of its own: every engine's output
    checked, each record's arrival its message's append time (after its burst was handed over)."""
    import pyarrow.parquet as pq

    st = LatencySettings(rate=100, seconds=4, out=tmp_path / "out", warmup_s=1, prewarm_s=0, progress_every_s=5,
                         drain_timeout_s=300, zk=zk_server.hosts, keys=200, source="kafka",
                         engines=("deltawheel", "spark_sql", "floor"))
    report = run_latency(st, spark=spark, progress=None)
    s = st.schedule()
    for name, e in report["engines"].items():
        assert e["ok"], (name, e["error"], [c for c in e["checks"] if not c["ok"]])
        assert e["input"]["source"] == "kafka" and e["input"]["records"] == s.total
        assert e["breakdown_s"]["records"] > 0  # each record placed in the batch that read it
        recs = pq.read_table(tmp_path / "out" / "engines" / name / "records.parquet")
        arrival = np.asarray(recs.column("arrival_s").to_numpy())
        assert not np.isnan(arrival).any()
    assert {c["name"] for c in report["engines"]["spark_sql"]["checks"]} >= {"records_read", "final_counts"}
