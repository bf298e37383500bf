"""A live pipeline on ``s3a://`` whose object store goes away starts its failed stages again inside
its driver once the store serves (every record counted once, no new process), and with its restarts
used up stops with a typed error (not a traceback). Real S3Proxy of the test's own (killed and started
again on the same data and port), ZooKeeper and Spark."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from conftest import free_port
from continuous_pipeline import RunLines, make, outage_input, outputs, write_file

import deltawheel
from deltawheel.servers.s3proxy import S3ProxyServer

pytestmark = [pytest.mark.spark, pytest.mark.zk, pytest.mark.objectstore]


@pytest.mark.timeout(900)
def test_a_live_pipeline_whose_object_store_went_away_goes_on_in_its_driver_and_counts_every_record_once(  # type: ignore[no-untyped-def]
        spark, s3_bucket, zk_config, tmp_path: Path) -> None:
    from deltawheel.statestore.exceptions import ObjectStoreUnreachableError, RetryableError
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
    rows, closing, want_users, want_totals = outage_input(tmp_path / "input")
    folder = tmp_path / "input"
    run_lines = RunLines()
    lines, wait, said = run_lines.lines, run_lines.wait, run_lines.said
    connection = dict(store=layout.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot, pipeline="clicks")
    try:
        with deltawheel.connect(spark, **connection) as engine:
            # restarts used up: the run stops with the store's typed error, a retry for a supervisor
            run = engine.start_pipeline(make(str(folder)), progress=lines.append, restarts=1)
            wait("stage 1 read the first file", lambda: run.executors["user_minutes"].records_in_total >= 20, run)
            server.kill()
            write_file(folder, "part-1.parquet", rows[20:40])  # the next batch commits to a store that is gone
            with pytest.raises(RetryableError) as failed:
                wait("the run stopped", lambda: False, run)
            assert isinstance(failed.value, ObjectStoreUnreachableError) or "restart 1 " in str(lines), lines[-15:]
            assert said("starting the stage again in this driver in 2s (restart 1 of at most 1") >= 1, lines[-15:]
            server.start()  # the same data and port
            run.stop()
        lines.clear()
        with deltawheel.connect(spark, **connection) as engine:  # what a supervisor does: start it again
            run = engine.start_pipeline(make(str(folder)), progress=lines.append)
            wait("stage 1 read the second file", lambda: run.executors["user_minutes"].records_in_total >= 20, run)
            server.kill()
            write_file(folder, "part-2.parquet", rows[40:])
            wait("a restart found the store still down", lambda: said("(restart 2 of at most 5") >= 1, run)
            assert said("started again in this driver") == 0, lines[-15:]
            server.start()
            wait("a stage started again in its driver", lambda: said("started again in this driver") >= 1, run)
            write_file(folder, "part-3.parquet", [closing])
            # the stages started again live produce every user's minutes once, before any drain
            wait("stage 1's productions after the outage", lambda: outputs(spark, engine.layout)[0] == want_users, run)
            run.drain()  # every stage to the end of its input (raises what failed)
            run.stop()
            got_users, got_totals = outputs(spark, engine.layout)
    finally:
        server.stop()
    assert got_users == want_users
    assert got_totals == want_totals
