"""``deltawheel bench state``: its input (every key in every pass, once), its refusals, and (slow) a
tiny run as a user starts it: each engine's state checked against the input, the restarts timed,
the cache policies replayed on the run's own trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from deltawheel.statestore.exceptions import ConfigError


@pytest.mark.parametrize("keys,passes,per_file", [(10, 1, 3), (1_000, 3, 250), (37, 2, 100)])
def test_the_input_holds_each_key_once_per_pass_in_ascending_event_time(tmp_path: Path, keys: int, passes: int,
                                                                        per_file: int) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from deltawheel.benchmarks.largestate import write_input

    got = write_input(tmp_path / "d", keys=keys, passes=passes, per_file=per_file, seed=5, say=lambda _m: None)
    files = sorted((tmp_path / "d" / "input").glob("part-*.parquet"))
    assert got["records"] == keys * passes and got["files"] == len(files) == -(-keys * passes // per_file)
    assert [f.stat().st_mtime for f in files] == sorted(f.stat().st_mtime for f in files)
    tables = [pq.read_table(f) for f in files]
    assert all(t.num_rows == per_file for t in tables[:-1])
    keys_seen = [k for t in tables for k in t.column("key").to_pylist()]
    for p in range(passes):  # each pass: every key once
        assert sorted(keys_seen[p * keys:(p + 1) * keys]) == sorted(set(keys_seen))
    assert len(set(keys_seen)) == keys
    ids = [r for t in tables for r in t.column("record_id").to_pylist()]
    assert len(set(ids)) == len(ids)
    times = [t.column("event_time") for t in tables]
    assert all(pc.all(pc.greater(c.slice(1), c.slice(0, len(c) - 1))).as_py() in (True, None) for c in times)
    assert str(tables[0].schema.field("event_time").type) == "timestamp[ms, tz=UTC]"  # the direct read's type
    again = write_input(tmp_path / "d", keys=keys, passes=passes, per_file=per_file, seed=5, say=lambda _m: None)
    assert again == got and sorted((tmp_path / "d" / "input").glob("*.parquet")) == files


@pytest.mark.parametrize("change,message", [
    ({"cache": "0.1,1.5"}, r"--cache must be shares in \(0, 1\]"),
    ({"cache": "a lot"}, r"--cache must be shares like 0.1,0.25"),
    ({"keys": 0}, r"--keys must be at least 1"),
    ({"engines": "deltawheel,flink"}, r"bench state: unknown engine 'flink'"),
])
def test_bench_state_refuses_bad_arguments_before_running_anything(tmp_path: Path, change, message) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.benchmarks.largestate import run_from_args

    args = argparse.Namespace(out=str(tmp_path / "out"), keys=100, passes=1, per_file=10, intervals=2, cache="0.5",
                              engines="deltawheel", scale=10, restart_records=10, timeout=60.0)
    for k, v in change.items():
        setattr(args, k, v)
    with pytest.raises(ConfigError, match=message):
        run_from_args(args)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ~2 min: six Spark applications, one after the other
@pytest.mark.timeout(1200)
def test_bench_state_runs_every_engine_and_both_restarts_and_checks_their_state(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.cli import main

    out = tmp_path / "out"
    assert main(["bench", "state", "--keys", "4000", "--passes", "2", "--per-file", "2000", "--intervals", "4",
                 "--cache", "0.5", "--scale", "4", "--restart-records", "300", "--out", str(out),
                 "--engines", "deltawheel,spark_sql"]) == 0
    report = json.loads((out / "state.json").read_text())
    assert set(report["runs"]) == {"deltawheel", "deltawheel_cache_0.5", "spark_sql"}
    for name, run in report["runs"].items():
        assert run["checked"] is True and run["records"] == 8_000, name
        assert run["state_records"] == {"keys": 4_000, "counted": 8_000}, name
    assert len(report["runs"]["deltawheel"]["batches"]) == 4
    assert all(b["direct"] for b in report["runs"]["deltawheel"]["batches"])
    bounded = report["runs"]["deltawheel_cache_0.5"]
    assert 0 < bounded["cache_bytes"] < max(report["runs"]["deltawheel"]["worker_state_bytes"].values())
    assert set(report["restarts"]) == {"1x", "4x"}
    for label, r in report["restarts"].items():
        assert r["records"] == 300 and len(r["batches"]) == 1, label
        assert 0 < r["session_s"] < r["executor_started_s"] < r["first_batch_s"], label
    assert report["restarts"]["4x"]["rows_live_bytes"] > report["restarts"]["1x"]["rows_live_bytes"] > 0
    trace = report["cache_trace"]["runs"][0]
    assert trace["capacity_share"] == 0.5 and trace["opt"]["hit_rate"] >= trace["window"]["hit_rate"]
    assert (out / "state.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "restart at 4x" in printed and "records/s" in printed
