"""A live pipeline on ``s3a://`` rides through its object store going away and coming back: the
stage whose batch failed starts again in the same process (no new Spark session), and every record
is counted once. Found by a chaos run on the object store, where each S3Proxy kill stopped both
drivers and their restarts (a Spark session each) held the watermark back for minutes. Real S3Proxy
of the test's own (killed and started again on the same data and port), ZooKeeper and Spark."""

from __future__ import annotations

import threading
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
def test_a_live_pipeline_goes_on_after_its_object_store_was_killed_and_started_again(  # type: ignore[no-untyped-def]
        spark, s3_bucket, zk_config, tmp_path: Path) -> None:
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
    lines: list[str] = []
    try:
        with deltawheel.connect(spark, store=layout.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                                pipeline="clicks") as engine:
            run = engine.start_pipeline(make(str(folder)), progress=lines.append)
            deadline = time.monotonic() + 600

            def until(what: str, done: object) -> None:
                while not done():  # type: ignore[operator]
                    run.check()  # a failure other than the store's is raised here
                    assert time.monotonic() < deadline, f"{what}: not within 600 s; the run said: {lines[-12:]}"
                    time.sleep(0.5)

            until("stage 1 reads the first file", lambda: run.executors["user_minutes"].records_in_total >= 30)
            server.kill()
            write_file(folder, "part-1.parquet", rows[30:])  # the next batch commits to a store that is gone

            def back() -> None:  # the operator starts the server again (the check waits for the store meanwhile)
                while not any("starts again in this process" in ln for ln in lines) and time.monotonic() < deadline:
                    time.sleep(0.5)
                time.sleep(3.0)  # a few attempts find it down
                server.start()  # the same data and port

            restarter = threading.Thread(target=back, daemon=True)
            restarter.start()
            until("the stage runs again", lambda: any(ln.endswith(": started again") for ln in lines))
            restarter.join()
            write_file(folder, "part-2.parquet", [closing])
            run.drain()  # every stage to the end of its input (raises what failed)
            run.stop()
            got_users, got_totals = outputs(spark, engine.layout)
    finally:
        server.stop()
    assert got_users == want_users
    assert got_totals == want_totals


def test_what_counts_as_the_store_not_serving() -> None:
    """A batch's own typed error (the write path's) counts as well as Spark's and pyarrow's untyped
    ones; a local store's failures and other errors never start a stage again."""
    from types import SimpleNamespace

    from deltawheel.executor.drivers.continuous import ContinuousRun
    from deltawheel.statestore.exceptions import ObjectStoreUnreachableError, StaleSequencerError
    from deltawheel.statestore.layout import StoreLayout

    s3, local = SimpleNamespace(layout=StoreLayout("s3a://b/store")), SimpleNamespace(layout=StoreLayout("/tmp/s"))
    typed = ObjectStoreUnreachableError("no object store answers for s3a://b/store")
    pyarrow = OSError("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7, Could not connect")
    assert ContinuousRun._store_down(s3, typed) is typed  # type: ignore[arg-type]
    assert isinstance(ContinuousRun._store_down(s3, pyarrow), ObjectStoreUnreachableError)  # type: ignore[arg-type]
    assert ContinuousRun._store_down(local, typed) is None  # type: ignore[arg-type]
    assert ContinuousRun._store_down(s3, StaleSequencerError("fenced")) is None  # type: ignore[arg-type]
    assert ContinuousRun._store_down(s3, None) is None  # type: ignore[arg-type]
