"""A live pipeline on ``s3a://`` whose object store goes away stops with a typed error (not a
traceback), and started again once the store serves, counts every record once. Real S3Proxy of the
test's own (killed and started again on the same data and port), ZooKeeper and Spark."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from conftest import free_port
from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file

import deltawheel
from deltawheel.servers.s3proxy import S3ProxyServer

pytestmark = [pytest.mark.spark, pytest.mark.zk, pytest.mark.objectstore]


@pytest.mark.timeout(900)
def test_a_live_pipeline_whose_object_store_was_killed_stops_typed_and_a_restart_counts_every_record_once(  # type: ignore[no-untyped-def]
        spark, s3_bucket, zk_config, tmp_path: Path) -> None:
    from deltawheel.statestore.exceptions import DeltaWheelError
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.objectstore.s3a import configure_bucket

    from deltawheel import migrations

    server = S3ProxyServer(tmp_path / "s3", port=free_port())
    server.start()
    bucket = f"outage-{uuid.uuid4().hex[:10]}"  # its own: Hadoop keeps a file system per bucket
    server.create_bucket(bucket)
    configure_bucket(spark, server.endpoint, bucket)
    layout = StoreLayout(f"s3a://{bucket}/store")
    migrations.apply(spark, layout, dry_run=False)
    rows = click_rows(60)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:30])
    closing = closing_row(rows)
    want_users, _ = expected(rows)
    _, want_totals = expected([*rows, closing])  # the drain fires the closing click's minute too
    deadline = time.monotonic() + 600
    connection = dict(store=layout.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot, pipeline="clicks")
    try:
        with deltawheel.connect(spark, **connection) as engine:
            run = engine.start_pipeline(make(str(folder)), progress=False)
            while run.executors["user_minutes"].records_in_total < 30:
                run.check()
                assert time.monotonic() < deadline, "stage 1 did not read the first file in 600 s"
                time.sleep(0.5)
            server.kill()
            write_file(folder, "part-1.parquet", rows[30:])  # the next batch commits to a store that is gone
            with pytest.raises(DeltaWheelError):  # typed: the command line exits 5 or 9, a retry
                while time.monotonic() < deadline:
                    run.check()
                    time.sleep(0.5)
            server.start()  # the same data and port
            run.stop()
        write_file(folder, "part-2.parquet", [closing])
        with deltawheel.connect(spark, **connection) as engine:  # what a supervisor does: start it again
            run = engine.start_pipeline(make(str(folder)), progress=False)
            run.drain()  # every stage to the end of its input (raises what failed)
            run.stop()
            got_users, got_totals = outputs(spark, engine.layout)
    finally:
        server.stop()
    assert got_users == want_users
    assert got_totals == want_totals
