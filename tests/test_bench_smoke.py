"""Benchmark plumbing: workload generation and reference (default run, no Spark, seconds),
and smoke runs of the Spark engines on a tiny workload (``-m benchmark``; correctness only,
never speed)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltawheel.benchmarks import workload as wl
from deltawheel.benchmarks.engines_spark import build_result
from deltawheel.benchmarks.memory import MemorySampler
from deltawheel.benchmarks.plot import plot_throughput
from deltawheel.benchmarks.workload import (
    EXPECTED,
    WorkloadError,
    WorkloadParams,
    check_output,
    ensure_workload,
)

TINY = WorkloadParams(n=20_000, b=2_000, k=500, rate=100)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> wl.WorkloadData:
    return ensure_workload("small", root=tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> wl.WorkloadData:
    return ensure_workload("tiny", root=tmp_path_factory.mktemp("tiny"), params=TINY)


def test_small_reference_matches_workload_md(small: wl.WorkloadData) -> None:
    assert small.verified
    assert small.content_sha256 == wl.EXPECTED_SHA256["small"]
    ref = small.reference
    want = EXPECTED["small"]
    assert (ref.emitted_rows, ref.sum_counts, ref.late_dropped, ref.open_events, ref.open_windows) == (
        72_060, 182_331, 188, 17_481, 6_985) == (want.emitted_rows, want.sum_counts, want.late_dropped,
                                                 want.open_events, want.open_windows)
    assert ref.sum_counts + ref.late_dropped + ref.open_events == small.n


def test_reference_equals_shared_baseline_py(tiny: wl.WorkloadData) -> None:
    """The closed-form reference equals the per-record loop of baseline.py --variant py."""
    path = wl.find_generator().parent / "baseline.py"
    spec = importlib.util.spec_from_file_location("_wl_baseline", path)
    assert spec is not None and spec.loader is not None
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    out, late, open_w, open_e, final_wm, _ = baseline.run_py([str(f) for f in tiny.files])
    ref = tiny.reference
    assert check_output(out, ref).correct
    assert (late, open_w, open_e, final_wm) == (ref.late_dropped, ref.open_windows, ref.open_events,
                                                ref.final_watermark_ms)
    assert ref.late_dropped > 0 and ref.emitted_rows > 0


def test_existing_dataset_is_reused(tiny: wl.WorkloadData) -> None:
    before = [f.stat().st_mtime_ns for f in tiny.files]
    again = ensure_workload("tiny", root=tiny.data_dir.parent, params=TINY)
    assert again.files == tiny.files and [f.stat().st_mtime_ns for f in again.files] == before
    assert not again.verified and again.expected is None


def test_store_uri_takes_only_engines_that_keep_their_state_there(tmp_path: Path) -> None:
    from deltawheel.benchmarks.throughput import run_throughput

    with pytest.raises(WorkloadError, match=r"engine\(s\) \['spark_tws'\] cannot keep their state on --store-uri; "
                                            r"choose among \['deltawheel', 'deltawheel_columnar', 'deltawheel_jvm_read', 'deltawheel_merge', 'deltawheel_vector', "
                                            r"'spark_sql'\]"):
        run_throughput("small", out_dir=tmp_path, engines=["spark_sql", "spark_tws"], store_uri="s3a://b/bench",
                       progress=None)


def test_conf_takes_spark_settings_and_a_shared_session_only_sql_ones(tmp_path: Path) -> None:
    from deltawheel.benchmarks.throughput import parse_conf, run_throughput

    assert parse_conf(["spark.driver.memory=1g", "spark.driver.extraJavaOptions=-Da=b -Dc=d=e"]) == {
        "spark.driver.memory": "1g", "spark.driver.extraJavaOptions": "-Da=b -Dc=d=e"}
    for bad in ("spark.driver.memory", "driver.memory=1g", "=1g"):
        with pytest.raises(WorkloadError, match="--conf takes KEY=VALUE"):
            parse_conf([bad])
    with pytest.raises(WorkloadError, match=r"--conf with --shared-session takes spark\.sql\.\* settings only"):
        run_throughput("small", out_dir=tmp_path, engines=["spark_sql"], isolate=False,
                       conf={"spark.driver.memory": "1g"}, progress=None)
    assert not (tmp_path / "throughput.json").exists()


def test_unknown_size_needs_params(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="unknown workload size 'huge'"):
        ensure_workload("huge", root=tmp_path)
    with pytest.raises(WorkloadError, match="named size with fixed parameters"):
        ensure_workload("small", root=tmp_path, params=TINY)


def test_big_keys_is_big_over_ten_times_the_key_ranks(tmp_path: Path) -> None:
    """``big-keys`` (beyond WORKLOAD.md): generated, checked against its recorded digest, with five
    times big's distinct keys and big's event times (so big's late and open events)."""
    data = ensure_workload("big-keys", root=tmp_path)
    assert data.verified and data.params == wl.WorkloadParams(n=2_000_000, b=100_000, k=500_000, rate=10_000)
    assert data.content_sha256 == wl.EXPECTED_SHA256["big-keys"] == (
        "f1fc80bf93e83517e1059ca6a34055ecefda6ccb052fcc7be0d22562c021412c")
    keys = pa.concat_tables([pq.read_table(f, columns=["key"]) for f in data.files]).column("key")
    assert len(keys) == 2_000_000 and pc.count_distinct(keys).as_py() == 262_120  # of 500,000 Zipf ranks
    ref, want, big = data.reference, EXPECTED["big-keys"], EXPECTED["big"]
    assert (ref.emitted_rows, ref.sum_counts, ref.late_dropped, ref.open_events, ref.open_windows) == (
        want.emitted_rows, want.sum_counts, want.late_dropped, want.open_events, want.open_windows)
    assert (want.sum_counts, want.late_dropped, want.open_events) == (big.sum_counts, big.late_dropped,
                                                                      big.open_events)
    assert want.emitted_rows > big.emitted_rows and want.open_windows > big.open_windows


def test_the_command_takes_big_keys_and_refuses_other_sizes(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from deltawheel.cli import main as cli_main

    # the size is taken (the engine check comes before any input is generated)
    assert cli_main(["bench", "throughput", "--size", "big-keys", "--engines", "flink", "--out", str(tmp_path)]) != 0
    assert "unknown engine(s) ['flink']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "throughput", "--size", "huge", "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "invalid choice: 'huge' (choose from 'small', 'medium', 'big', 'big-keys')" in capsys.readouterr().err


def test_digest_mismatch_is_refused(small: wl.WorkloadData, tmp_path: Path) -> None:
    manifest = json.loads((small.data_dir / "manifest.json").read_text())
    fake = tmp_path / "DATA_small"
    (fake / "input").mkdir(parents=True)
    for f in small.files:
        (fake / "input" / f.name).symlink_to(f)
    manifest["content_sha256"] = "0" * 64
    (fake / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(WorkloadError, match="do not match their manifest"):
        ensure_workload("small", root=tmp_path)
    with pytest.raises(WorkloadError, match="differs from WORKLOAD.md"):
        ensure_workload("small", root=tmp_path, verify_content=False)


def test_missing_generator_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DELTAWHEEL_WORKLOAD_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setattr(wl, "_repo_root", lambda: tmp_path / "repo")
    with pytest.raises(WorkloadError, match="set DELTAWHEEL_WORKLOAD_DIR"):
        ensure_workload("small", root=tmp_path / "data")


def test_check_output_and_build_result_spot_errors(tiny: wl.WorkloadData) -> None:
    ref = tiny.reference
    out = pa.table({"key": ref.table.column("key"),
                    "window_start": ref.table.column("window_start_ms").cast(pa.timestamp("ms", tz="UTC"))
                    .cast(pa.timestamp("ns", tz="UTC")),
                    "count": ref.table.column("count")})
    res = build_result("x", tiny, output=out, wall_s=2.0, settings={}, late_dropped=ref.late_dropped,
                       open_events_at_end=ref.open_events)
    assert res.correct and res.invariant_ok and res.records_per_s == tiny.n / 2.0
    wrong = pa.concat_tables([out.slice(1), out.slice(0, 2)])  # row 0 moved, row 1 duplicated
    chk = check_output(wrong, ref)
    assert not chk.correct and (chk.missing, chk.unexpected) == (0, 1)
    bumped = out.set_column(2, "count", pc.add(out.column("count"), 1))
    res = build_result("x", tiny, output=bumped, wall_s=1.0, settings={}, late_dropped=ref.late_dropped)
    assert not res.correct and any("differs from reference" in n for n in res.notes)


def test_memory_sampler_sees_this_process() -> None:
    with MemorySampler(interval_s=0.05) as mem:
        _ = bytearray(8 * 2**20)
    peak = mem.peak
    assert peak.samples >= 2 and peak.pss_bytes > 8 * 2**20 and peak.rss_bytes >= peak.max_single_rss_bytes


def test_plot_writes_png(tmp_path: Path) -> None:
    report = {"size": "tiny", "n": 1000, "machine": {"logical_cores": 2},
              "engines": {"a": {"records_per_s": 100.0, "correct": True},
                          "b": {"records_per_s": 5000.0, "correct": False}}}
    path = plot_throughput(report, tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.benchmark
@pytest.mark.spark
@pytest.mark.parametrize("engine", ["spark_sql", "spark_tws"])
def test_spark_engine_smoke(engine: str, spark, tiny: wl.WorkloadData, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.benchmarks.throughput import run_throughput

    report = run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path,
                            engines=[engine], spark=spark, progress=None)
    res = report["engines"][engine]
    ref = tiny.reference
    assert report["mode"] == "shared_session" and res["pid"] == os.getpid()  # a session handed in is shared
    assert res["correct"], res["notes"]
    assert (res["emitted_rows"], res["sum_counts"]) == (ref.emitted_rows, ref.sum_counts)
    assert res["late_dropped"] == ref.late_dropped and res["open_events_at_end"] == ref.open_events
    assert (tmp_path / "throughput.json").is_file() and (tmp_path / "throughput.png").is_file()


@pytest.mark.spark
def test_rounds_order_the_engines_and_report_each_ones_median(spark, tiny: wl.WorkloadData,  # type: ignore[no-untyped-def]
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rounds``: A B C, B C A, C A B (two engines: A B, B A, A B); each engine's figure is its
    median run, all rounds kept."""
    from deltawheel.benchmarks import throughput as tp

    order: list[str] = []
    walls = {"a": [4.0, 1.0, 2.0], "b": [8.0, 9.0, 7.0], "c": [1.0, 1.0, 1.0]}  # medians 2.0 and 8.0

    class Replay:  # an engine that returns the reference output (the plumbing under test, not an engine)
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, data: wl.WorkloadData, *, out_dir: Path, spark: object, progress: object = None):  # type: ignore[no-untyped-def]
            order.append(self.name)
            ref = data.reference
            out = pa.table({"key": ref.table.column("key"), "window_start_ms": ref.table.column("window_start_ms"),
                            "count": ref.table.column("count")})
            wall = walls[self.name][order.count(self.name) - 1]
            return build_result(self.name, data, output=out, wall_s=wall, settings={},
                                late_dropped=ref.late_dropped, open_events_at_end=ref.open_events)

    monkeypatch.setitem(tp.ENGINES, "a", lambda: Replay("a"))
    monkeypatch.setitem(tp.ENGINES, "b", lambda: Replay("b"))
    lines: list[str] = []
    report = tp.run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path,
                               engines=["a", "b"], spark=spark, rounds=3, progress=lines.append)
    starts = [ln for ln in lines if ": running" in ln]  # a line per run, counted, with an ETA after the first
    assert len(starts) == 6 and "[run 1 of 6]" in starts[0] and "s left]" in starts[-1] and "[run 6 of 6," in starts[-1]
    assert order == [e for o in tp.round_orders(["a", "b"], 3) for e in o] == ["a", "b", "a", "b", "b", "a"]
    a, b = report["engines"]["a"], report["engines"]["b"]
    assert a["wall_s"] == 2.0 and b["wall_s"] == 8.0
    assert a["rounds_records_per_s"] == [tiny.n / w for w in walls["a"]]
    assert report["ratios"]["a/b"] == round(8.0 / 2.0, 3) and report["rounds"] == 3
    monkeypatch.setitem(tp.ENGINES, "c", lambda: Replay("c"))
    order.clear()
    tp.run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path,
                      engines=["a", "b", "c"], spark=spark, rounds=3, progress=None)
    assert order == [e for o in tp.round_orders(["a", "b", "c"], 3) for e in o]  # the run follows round_orders
    assert all(sorted(order[i:i + 3]) == ["a", "b", "c"] for i in (0, 3, 6))
    with pytest.raises(WorkloadError, match="rounds must be at least 1"):
        tp.run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path,
                          engines=["a"], spark=spark, rounds=0, progress=None)


@pytest.mark.parametrize("names,rounds", [(["a", "b"], 4), (["a", "b", "c"], 6)])
def test_round_orders_balance_places_and_predecessors(names: list[str], rounds: int) -> None:
    from collections import Counter

    from benchmarks.throughput import round_orders

    orders = round_orders(names, rounds)
    assert len(orders) == rounds and orders[0] == names and all(sorted(o) == sorted(names) for o in orders)
    places = Counter((e, i) for o in orders for i, e in enumerate(o))
    assert set(places.values()) == {rounds // len(names)}  # every engine in every place equally often
    flat = [e for o in orders for e in o]
    follows = Counter((a, b) for a, b in zip(flat, flat[1:], strict=False) if a != b)
    # every engine right after every other one equally often (the run's transitions, across rounds)
    assert len(follows) == len(names) * (len(names) - 1) and len(set(follows.values())) == 1


def test_round_orders_fall_back_to_rotation_beyond_the_search() -> None:
    from benchmarks.throughput import round_orders

    assert round_orders(["a", "b", "c"], 3, search_limit=1) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


@pytest.mark.spark
@pytest.mark.slow  # two engines over a workload: a minute; each engine's output is checked in the default bench tests
def test_deltawheel_and_sql_split_their_state_alike_and_both_emit_the_reference(
        spark, tiny: wl.WorkloadData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The throughput benchmark as a user runs it, deltawheel beside Spark SQL: both emit exactly
    the reference rows (deltawheel's vectorised variant too), and deltawheel's computation gets as many key
    intervals as the session has shuffle partitions (SQL's state partitions), recorded in its settings."""
    from deltawheel.benchmarks import throughput as tp

    monkeypatch.setattr(tp, "SPARK_BENCH_CONF", {**tp.SPARK_BENCH_CONF, "spark.sql.shuffle.partitions": "3"})
    names = ("deltawheel", "deltawheel_vector", "spark_sql")
    report = tp.run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path,
                               engines=list(names), spark=spark, progress=None)
    ref = tiny.reference
    for name in names:
        res = report["engines"][name]
        assert res["correct"], res["notes"]
        assert (res["emitted_rows"], res["sum_counts"]) == (ref.emitted_rows, ref.sum_counts)
    assert report["engines"]["deltawheel"]["settings"]["num_intervals"] == 3
    assert report["engines"]["deltawheel_vector"]["settings"]["user_code"].startswith("combine")
    assert report["engines"]["spark_sql"]["settings"]["spark.sql.shuffle.partitions"] == "3"
    assert report["ratios"]["deltawheel/spark_sql"] > 0


@pytest.mark.spark
@pytest.mark.slow  # a child process per engine run: minutes; the engines run in-process in the default bench tests
def test_each_engine_run_is_measured_in_a_process_of_its_own(tiny: wl.WorkloadData, tmp_path: Path) -> None:
    """The default (isolated) run as a user starts it, deltawheel beside Spark SQL with a warm-up: each
    run came from its own process (not this one), each emits the reference, and each one's peak memory
    is its own tree during the measured run: a driver JVM (and deltawheel's ZooKeeper), no session start."""
    import psutil
    from deltawheel.benchmarks.throughput import run_throughput

    lines: list[str] = []
    probe = {"spark.driver.extraJavaOptions": "-Ddeltawheel.bench.probe=1"}  # --conf: read when the JVM starts
    report = run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path,
                            engines=["deltawheel", "spark_sql"], warmup=True, progress=lines.append, conf=probe)
    assert report["mode"] == "isolated"
    assert report["spark_conf"]["spark.driver.extraJavaOptions"] == "-Ddeltawheel.bench.probe=1"
    # as each child's session holds it (Spark adds its own options to the JVM's)
    assert [r["conf_applied"]["spark.driver.extraJavaOptions"].split()[-1] for r in report["runs"]] == [
        "-Ddeltawheel.bench.probe=1"] * 2
    runs = report["runs"]
    assert [r["engine"] for r in runs] == ["deltawheel", "spark_sql"]
    pids = {r["pid"] for r in runs}
    assert len(pids) == 2 and os.getpid() not in pids
    ref = tiny.reference
    for run in runs:
        res = report["engines"][run["engine"]]
        assert res["correct"], res["notes"]
        assert (res["emitted_rows"], res["sum_counts"]) == (ref.emitted_rows, ref.sum_counts)
        assert res["pid"] == run["pid"] and res["session_start_s"] > 0 and res["warmup_s"] > 0
        mem = res["peak_memory"]
        assert mem["pss_mib"] > 200 and run["pss_mib"] == mem["pss_mib"]
        roles = {p["role"]: p["pid"] for p in mem["at_peak"]}
        assert roles["driver_python"] == run["pid"] and "driver_jvm" in roles  # the child's own tree
        assert mem["at_peak_by_role_pss_mib"]["driver_jvm"] > 100
        assert not psutil.pid_exists(run["pid"])  # the process ended with its run
    assert "zookeeper_jvm" in report["engines"]["deltawheel"]["peak_memory"]["at_peak_by_role_pss_mib"]
    assert report["machine"]["spark"] and report["spark_conf"]["spark.sql.streaming.checkpointFileManagerClass"]
    assert json.loads((tmp_path / "throughput.json").read_text())["runs"] == runs
    assert any("[run 1 of 2]" in ln for ln in lines) and any("[run 2 of 2, about" in ln for ln in lines)
    assert sum("spark session ready" in ln for ln in lines) == 2 and sum("warm-up took" in ln for ln in lines) == 2
    table = next(ln for ln in lines if ln.startswith("engine ") and "records/s" in ln and "start_s" in ln)
    assert "idle MiB" not in table


def test_a_failing_engine_process_ends_the_benchmark_with_its_error(tiny: wl.WorkloadData, tmp_path: Path) -> None:
    from deltawheel.benchmarks.engines_spark import SPARK_BENCH_CONF
    from deltawheel.benchmarks.isolated import RunSpec, run_isolated
    from deltawheel.benchmarks.throughput import run_throughput

    spec = RunSpec(engine="no_such_engine", data=tiny, out_dir=tmp_path / "run", conf=SPARK_BENCH_CONF)
    with pytest.raises(WorkloadError, match=re.compile(
            r"engine no_such_engine: its process \d+ failed \(exit 1\); full stderr in .*KeyError: 'no_such_engine'",
            re.S)):
        run_isolated(spec, work_dir=tmp_path / "procs", progress=None)
    with pytest.raises(WorkloadError, match=r"pass spark= only with isolate=False \(--shared-session\)"):
        run_throughput("tiny", params=TINY, data_root=tiny.data_dir.parent, out_dir=tmp_path, engines=["spark_sql"],
                       spark=object(), isolate=True, progress=None)


def test_the_command_isolates_unless_told_to_share_a_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltawheel.benchmarks import throughput as tp

    from deltawheel.cli import main as cli_main

    asked: list[object] = []

    def record(*_a: object, **kw: object) -> dict[str, object]:
        asked.append(kw["isolate"])
        return {"engines": {}}

    monkeypatch.setattr(tp, "run_throughput", record)
    assert cli_main(["bench", "throughput", "--size", "small", "--out", str(tmp_path)]) == 0
    assert cli_main(["bench", "throughput", "--size", "small", "--shared-session", "--out", str(tmp_path)]) == 0
    assert asked == [True, False]


@pytest.mark.slow  # a whole bench command in a subprocess; its progress lines are unit-tested
def test_the_command_prints_each_progress_line_as_it_goes(small: wl.WorkloadData, tmp_path: Path) -> None:
    """`deltawheel bench ... | tee log`: a benchmark's first progress line reaches the pipe while it
    still runs (before it writes its figures), not in one block with the others at its end."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # Python's default: a pipe buffers
    child = subprocess.Popen([sys.executable, "-m", "deltawheel.cli", "bench", "cache", "--size", "small",
                              "--data-root", str(small.data_dir.parent), "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        written_before = (out / "cache.json").exists()
        rest = child.stdout.read()
        assert child.wait(timeout=300) == 0
    finally:
        child.kill()
    assert first.startswith("trace: 21 batches"), first
    assert not written_before     # the line came while the capacities were still being replayed
    assert "capacity" in rest and (out / "cache.json").exists()
