"""``deltawheel demo --follow``: the demo's three stages live on events generated now, as a user
runs it (the command in a child process), with ``deltawheel status`` and ``report`` run from other
processes while it goes. The outputs are checked against the generated input files: every event
counted once in its window's panes, every prediction made once from the on-time pane it names."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout

J = get_codec("json")
STAGES = ("window_counter", "model", "detector")
LINE = re.compile(r"^\[ *[\d.]+s\] (window_counter|model|detector) +(\d+) records/s  watermark lag +(-?[\d.]+s|-)  "
                  r"latency (p50 +([\d.]+)s p99 +([\d.]+)s|-)$")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "deltawheel.cli", *args]


def _stream(spark: Any, store: Path, name: str) -> list[dict[str, Any]]:
    rows = spark.read.format("delta").load(str(store / "streams" / name)).collect()
    return [{"record_id": r["record_id"], **J.decode(r["value"])} for r in rows]


def test_what_demo_follow_refuses_before_anything_starts(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.cli import main
    from deltawheel.demo.follow import check_settings, check_store

    ok = {"rate": 100, "seconds": None, "window_ms": 2_000}
    local = StoreLayout(str(tmp_path / "s"))
    with pytest.raises(ConfigError, match=r"demo --follow measures from the store's files: use a local --store "
                                          r"\(got s3a://bucket/store\)"):
        check_settings(StoreLayout("s3a://bucket/store"), **ok)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"--instance is for the bounded demo"):
        check_settings(local, instance="a", **ok)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"--rate must be at least 1 record/s, got 0"):
        check_settings(local, **{**ok, "rate": 0})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"--seconds must be > 0, got -5"):
        check_settings(local, **{**ok, "seconds": -5.0})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"--window must be at least 1 second, got 0.5"):
        check_settings(local, **{**ok, "window_ms": 500})  # type: ignore[arg-type]
    check_settings(local, **ok)  # type: ignore[arg-type]
    (tmp_path / "s" / "_input" / "seed7-n20000").mkdir(parents=True)  # the bounded demo ran here
    with pytest.raises(ConfigError, match=r"holds the input of the bounded demo .*: the live and the bounded demo need "
                                          r"a store each; pass another --store \(default data/demo-follow\)"):
        check_settings(local, **ok)  # type: ignore[arg-type]
    (tmp_path / "t" / "_input" / "follow").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds the input of a demo --follow run .*\(default data/demo\)"):
        check_store(StoreLayout(str(tmp_path / "t")), follow=False)
    # the command: exit status 3 (a configuration error), the message, nothing started or created
    assert main(["demo", "--follow", "--rate", "0", "--store", str(tmp_path / "u")]) == 3
    assert "--rate must be at least 1 record/s, got 0" in capsys.readouterr().err
    assert main(["demo", "--store", str(tmp_path / "t"), "--events", "10"]) == 3
    assert "holds the input of a demo --follow run" in capsys.readouterr().err
    assert not (tmp_path / "u").exists() and not (tmp_path / "t" / "rows").exists()


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(1800)
@pytest.mark.slow  # the whole demo live for a minute; live stages: test_continuous.py, the demo: test_embedded_zk.py
def test_demo_follow_runs_every_stage_live_and_ends_with_every_event_once(spark, zk_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "live"
    zk = ("--zk", zk_server.hosts, "--zk-chroot", "/follow")
    proc = subprocess.Popen(_cli("demo", "--follow", "--rate", "200", "--seconds", "20", "--window", "2", "--every",
                                 "3", "--drain-timeout", "900", "--store", str(store), *zk),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t0 = time.monotonic()
    while not any(LINE.match(ln) for ln in lines):  # the stages are live and reporting
        assert proc.poll() is None, "\n".join(lines[-40:])
        assert time.monotonic() - t0 < 400, "\n".join(lines[-40:])
        time.sleep(0.5)
    # other processes read the store while it runs
    status = subprocess.run(_cli("status", "--store", str(store), *zk), capture_output=True, text=True, timeout=300)
    report = subprocess.run(_cli("report", "--store", str(store), "--out", str(tmp_path / "report.html"), *zk),
                            capture_output=True, text=True, timeout=300)
    running = proc.poll() is None
    assert proc.wait(timeout=1200) == 0, "\n".join(lines[-60:])  # it stops by itself (a bound, not a wait)
    reader.join(10)
    out = "\n".join(lines)
    assert running, "status and report ran after the demo had ended: " + out[-3000:]
    # the seconds of the JVM's start are announced, not silent
    starting = next(i for i, ln in enumerate(lines) if ln.startswith("deltawheel: starting Spark (local["))
    assert any(ln.startswith("deltawheel: Spark ready in ") for ln in lines[starting:]), out[:3000]
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert all(name in status.stdout for name in STAGES), status.stdout
    assert report.returncode == 0 and (tmp_path / "report.html").stat().st_size > 0, report.stderr[-2000:]

    # a line per stage every few seconds, with numbers
    stage_lines = [m for m in map(LINE.match, lines) if m]
    assert {m.group(1) for m in stage_lines} == set(STAGES), out[-3000:]
    measured = {m.group(1) for m in stage_lines if int(m.group(2)) > 0 and m.group(5) is not None}
    assert {"window_counter", "model"} <= measured, out[-3000:]
    assert all(float(m.group(5)) <= float(m.group(6)) for m in stage_lines if m.group(5)), out[-3000:]
    assert re.search(r"zeitgeist: stopped 3 queries after their batch in flight .* deliveries landed, leases given "
                     r"back in [\d.]+s$", out, flags=re.M), out[-3000:]
    assert "drained: every stage read and committed everything" in out, out[-3000:]
    assert f'deltawheel sql --store {store} "SELECT * FROM anomalies_decoded' in out

    # every generated event once in the panes of its window (a late pane adds to, or retracts and
    # restates, the window's count: the signed sum is the window's count)
    files = sorted(p for p in (store / "_input" / "follow").glob("part-*.parquet"))
    events = [pq.read_table(p) for p in files]
    assert files and sum(t.num_rows for t in events) == int(re.search(r"input ended after (\d+) events", out)[1])
    want: Counter[tuple[str, int]] = Counter()
    for t in events:
        for q, ms in zip(t.column("query").to_pylist(), t.column("event_time").cast("int64").to_pylist(), strict=True):
            want[(q, ms - ms % 2_000)] += 1
    panes = _stream(spark, store, "window_counts")
    assert len({p["record_id"] for p in panes}) == len(panes)  # no production delivered twice
    got: Counter[tuple[str, int]] = Counter()
    for p in panes:
        got[(p["key"], p["window_start"])] += -p["value"] if p["retraction"] else p["value"]
    assert +got == want
    # the summary says what the later stages' late records are: the LATE panes, counted
    n_late = sum(1 for p in panes if p["timing"] == "LATE")
    assert f"emitted for them ({n_late} in window_counts)" in out, out[-3000:]

    # the model read every on-time pane once: one prediction per query and window, its actual count the pane's
    on_time = {(p["key"], p["window_start"]): p["value"] for p in panes
               if p["timing"] != "LATE" and not p["retraction"]}
    predictions = _stream(spark, store, "predictions")
    keys = [(p["query"], p["window_start"]) for p in predictions]
    assert predictions and len(set(keys)) == len(keys)
    assert all(p["actual"] == on_time.get((p["query"], p["window_start"]), 0) for p in predictions)
    detector = [m for m in stage_lines if m.group(1) == "detector" and int(m.group(2)) > 0]
    assert detector, out[-3000:]  # the third stage read the predictions while it ran
    print("\n".join(ln for ln in lines if LINE.match(ln) or "over the run" in ln))
