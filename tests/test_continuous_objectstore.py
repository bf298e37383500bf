"""A live two-stage pipeline on the object store (``s3a://``, S3Proxy): every window fires.

Found by a chaos run on the object store: a downstream stage that had read every version of its
input never learnt it had (its tick looked for the stream table's newest version only in a local
folder), so its watermark stayed where its last micro-batch left it and the last windows never
fired. The same pipeline on a local store is test_continuous.py's."""

from __future__ import annotations

import time

import pytest
from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk, pytest.mark.objectstore]


@pytest.mark.timeout(600)
def test_a_live_pipeline_on_the_object_store_fires_every_window(spark, zk_config, migrated_s3_store,  # type: ignore[no-untyped-def]
                                                                tmp_path) -> None:
    """Three files, one after the other, the closing click alone in the last: stage 2 reads
    stage 1's last productions in a micro-batch and then has no input; its watermark must still
    follow stage 1's past the last minute, so every minute's total is produced, each once."""
    rows = click_rows(60)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:30])
    want_users, want_totals = expected(rows)
    with deltawheel.connect(spark, store=migrated_s3_store.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        run = engine.start_pipeline(make(str(folder)))
        deadline = time.monotonic() + 300
        while run.executors["user_minutes"].records_in_total < 30:  # in order: the rest would make these late
            run.check()
            assert time.monotonic() < deadline, "stage 1 did not read the first file in 300 s"
            time.sleep(0.5)
        write_file(folder, "part-1.parquet", rows[30:])
        totals = run.executors["minute_totals"]

        def produced(n: int) -> None:
            while sum(r.productions for r in totals.reports) < n:
                run.check()
                assert time.monotonic() < deadline, (
                    f"minute_totals produced {sum(r.productions for r in totals.reports)} of {n} totals in 300 s "
                    f"of the start; its input watermark {totals.reports[-1].input_watermark_ms if totals.reports else None}")
                time.sleep(0.5)

        produced(len(want_totals) - 1)  # every minute but the last: the watermark of the clicks is in it
        write_file(folder, "part-2.parquet", [closing_row(rows)])  # stage 1's last minute, then nothing new
        produced(len(want_totals))
        run.stop()
        got_users, got_totals = outputs(spark, engine.layout)
    assert got_users == want_users
    assert got_totals == want_totals
