"""The Prometheus endpoint (``executor/protocol/exporter.py``), scraped as a monitoring system
scrapes it: over HTTP, in Prometheus' text format, while a continuous pipeline runs; its
counters must equal the sums of the store's metrics table over the same batches."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from continuous_pipeline import SCHEMA, click_rows, make, write_file
from test_continuous import wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``/metrics`` parsed with Prometheus' own text parser: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers.get_content_type() == "text/plain"
        text = resp.read().decode()
    got: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            got[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return got


def _of(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, computation: str) -> list[float]:
    return [v for (n, labels), v in got.items() if n == name and ("computation", computation) in labels]


@pytest.mark.timeout(900)
def test_the_endpoint_counts_what_the_metrics_table_counts_while_the_pipeline_runs(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.exporter import stop_metrics_server
    from deltawheel.executor.protocol.metrics import read_batches

    rows = click_rows(90)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:50])
    lines: list[str] = []
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    try:
        with deltawheel.connect(spark, store=store, zk=zk_config.hosts,
                                zk_chroot=zk_config.chroot, pipeline="clicks") as engine:
            engine.progress = lines.append
            run = engine.start_pipeline(make(str(folder), schema=SCHEMA), metrics_port=0)
            announced = [ln for ln in lines if ln.startswith("metrics for Prometheus: http://")]
            assert len(announced) == 1, lines
            port = int(announced[0].rsplit(":", 1)[1].split("/")[0])
            first = run.executors["user_minutes"]
            wait_for("stage 1 read the first file", lambda: first.records_in_total == 50, runs=(run,))
            # while the run goes on; the endpoint counts a batch once its delivery landed (in the background)
            wait_for("the endpoint counted the first file", lambda: _of(
                _scrape(port), "deltawheel_records_in_total", "user_minutes") == [50.0], runs=(run,))
            live = _scrape(port)
            assert _of(live, "deltawheel_records_in_total", "user_minutes") == [50.0]
            held = _of(live, "deltawheel_intervals_held", "user_minutes")
            assert held == [float(len(first.owner.sequencers))] and held[0] > 0
            seqs = sorted(v for (n, labels), v in live.items() if n == "deltawheel_lease_sequencer"
                          and ("computation", "user_minutes") in labels)
            assert seqs == sorted(float(s) for s in first.owner.sequencers.values())
            write_file(folder, "part-1.parquet", rows[50:])
            wait_for("stage 1 read the second file", lambda: first.records_in_total == 90, runs=(run,))
            run.drain()
            end = _scrape(port)
        table = read_batches(engine.layout, spark=spark)
    finally:
        stop_metrics_server()
    assert table, "no metrics rows"
    for comp in ("user_minutes", "minute_totals"):
        mine = [r for r in table if r["computation"] == comp]
        assert _of(end, "deltawheel_batches_total", comp) == [float(len(mine))]
        for column in ("records_in", "processed", "productions", "dead_letters", "late", "duplicates"):
            want = float(sum(int(r[column] or 0) for r in mine))
            assert _of(end, f"deltawheel_{column}_total", comp) == [want], column
        assert _of(end, "deltawheel_batch_seconds_count", comp) == [float(len(mine))]
        newest = max(mine, key=lambda r: (r["recorded_ms"], r["batch_id"]))
        if newest["low_watermark_ms"] is not None:
            assert _of(end, "deltawheel_low_watermark_ms", comp) == [float(newest["low_watermark_ms"])]
    assert _of(end, "deltawheel_records_in_total", "user_minutes") == [90.0]


def test_a_taken_port_is_refused_with_the_port_named() -> None:
    import socket

    from deltawheel.executor.protocol.exporter import start_metrics_server, stop_metrics_server

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        stop_metrics_server()
        with pytest.raises(OSError, match=rf"cannot listen on 0.0.0.0:{port}.*another --metrics-port"):
            start_metrics_server(port)


def test_an_exporter_without_batches_serves_no_series() -> None:
    from deltawheel.executor.protocol.exporter import MetricsExporter

    exporter = MetricsExporter()
    families: list[Any] = list(exporter.collect())
    assert families and all(not f.samples for f in families)
    exporter.observe({"pipeline": "p", "computation": "c", "instance": "i", "records_in": 3, "wall_s": 0.5,
                      "low_watermark_ms": 1000})
    exporter.observe({"pipeline": "p", "computation": "c", "instance": "i", "records_in": 4, "wall_s": 0.25})
    samples = {s.name: s.value for f in exporter.collect() for s in f.samples}
    assert samples["deltawheel_records_in_total"] == 7
    assert samples["deltawheel_batch_seconds_sum"] == 0.75
    assert "deltawheel_low_watermark_ms" not in samples  # the newest row has none
