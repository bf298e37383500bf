"""A deltawheel job for ``spark-submit`` (docs/deploy.md): a continuous two-stage pipeline over
Parquet files of clicks (``user``, ``ts``, ``id``) on an object store, its store on ``s3a://``.

Stage 1 counts each user's clicks per minute of event time (a timer per minute, fired by the input's
watermark); stage 2 totals users and clicks per minute (a timer fired by stage 1's low watermark).

    python examples/clicks_job.py make-input --input s3a://BUCKET/clicks-input   # sample files
    spark-submit ... examples/clicks_job.py run --store s3a://BUCKET/clicks --input s3a://BUCKET/clicks-input \\
        --zk HOST:2181,... --seconds 120

``make-input`` reaches the object store ``$DELTAWHEEL_S3_ENDPOINT`` names; a submitted job gets it
from ``deltawheel submit-args``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

MINUTE = 60_000


def make_pipeline(input_uri: str) -> Any:
    """The two stages over the Parquet files of ``input_uri``."""
    from deltawheel import RECORD_KEY, Computation, ParquetInjector, Pipeline

    class UserMinutes(Computation):
        name = "user_minutes"
        inputs = {"clicks": RECORD_KEY}
        outputs = ("user_counts",)

        def process_record(self, ctx: Any, record: Any) -> None:
            start = record.timestamp_ms - record.timestamp_ms % MINUTE
            st = ctx.state or {}
            st[str(start)] = st.get(str(start), 0) + 1
            ctx.state = st
            ctx.set_timer(str(start), start + MINUTE - 1)

        def process_timer(self, ctx: Any, timer: Any) -> None:
            st = dict(ctx.state)
            ctx.produce("user_counts", {"user": ctx.key, "start": int(timer.tag), "clicks": st.pop(timer.tag)},
                        key=timer.tag)
            ctx.state = st or None

    class MinuteTotals(Computation):
        name = "minute_totals"
        inputs = {"user_counts": RECORD_KEY}
        outputs = ("totals",)

        def process_record(self, ctx: Any, record: Any) -> None:
            st = ctx.state or {"users": 0, "clicks": 0}
            st["users"] += 1
            st["clicks"] += record.value["clicks"]
            ctx.state = st
            ctx.set_timer("end", record.timestamp_ms)

        def process_timer(self, ctx: Any, timer: Any) -> None:
            ctx.produce("totals", {"start": int(ctx.key), **ctx.state})
            ctx.state = None

    clicks = ParquetInjector("clicks", input_uri, key_column="user", event_time_column="ts", record_id_column="id",
                             watermark_delay_ms=5_000, max_files_per_trigger=1,
                             schema="user STRING, ts BIGINT, id STRING")
    return Pipeline("clicks", injectors=(clicks,), computations=(UserMinutes(), MinuteTotals()))


def make_input(input_uri: str, *, files: int, rows: int, first: int = 0) -> None:
    """Write ``files`` Parquet files of ``rows`` clicks each, minute after minute of event time,
    numbered from ``first``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.statestore.objectstore.client import S3Client
    from deltawheel.statestore.objectstore.s3a import endpoint_from_env
    from pyarrow import fs

    ep = endpoint_from_env()
    if ep is None:
        sys.exit("make-input: set DELTAWHEEL_S3_ENDPOINT, DELTAWHEEL_S3_ACCESS_KEY and DELTAWHEEL_S3_SECRET_KEY")
    bucket, _, prefix = input_uri.removeprefix("s3a://").partition("/")
    S3Client(ep).create_bucket(bucket)
    s3 = fs.S3FileSystem(access_key=ep.access_key, secret_key=ep.secret_key, endpoint_override=ep.url,
                         region=ep.region, allow_bucket_creation=False)
    rnd = random.Random(7)
    t0 = 1_700_000_000_000
    for f in range(first, first + files):
        users = [f"u{rnd.randrange(20)}" for _ in range(rows)]
        ts = [t0 + f * MINUTE + rnd.randrange(MINUTE) for _ in range(rows)]
        table = pa.table({"user": users, "ts": ts, "id": [f"c{f}-{i}" for i in range(rows)]})
        pq.write_table(table, f"{bucket}/{prefix}/part-{f:04d}.parquet", filesystem=s3)
    print(f"wrote {files} files of {rows} clicks to {input_uri}")


def run(store: str, input_uri: str, *, zk: str, seconds: float, instance: str | None, zk_chroot: str) -> None:
    """Run the pipeline on this application's session for ``seconds`` after it started."""
    from pyspark.sql import SparkSession

    import deltawheel

    started = time.time()
    spark = SparkSession.builder.appName("deltawheel-clicks").getOrCreate()
    with deltawheel.connect(spark, store=store, zk=zk, zk_chroot=zk_chroot, pipeline="clicks",
                            instance=instance) as engine:
        engine.progress = lambda line: print(f"[{time.time() - started:6.1f}s] {line}", flush=True)
        print(f"[{time.time() - started:6.1f}s] connected: store {store} ready", flush=True)
        running = engine.start_pipeline(make_pipeline(input_uri))
        first, live = None, time.time()
        try:
            while time.time() - live < seconds:
                running.check()  # a failed batch (a lease lost, say) ends the job with its typed error
                done = {n: s.records_in for n, s in running.stages.items() if s.batches and s.records_in}
                if done and first is None:
                    first = time.time()
                    print(f"first batch committed at {first:.3f} ({first - started:.1f}s after the driver "
                          f"started): {done}", flush=True)
                time.sleep(0.5)
        except BaseException:
            running.stop()
            raise
        report = running.stop()
        print(f"stopped: {report}; records in: "
              f"{ {n: s.records_in for n, s in running.stages.items()} }", flush=True)


def main(argv: list[str] | None = None) -> None:
    """``make-input`` or ``run``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("make-input")
    m.add_argument("--input", required=True)
    m.add_argument("--files", type=int, default=4)
    m.add_argument("--rows", type=int, default=200)
    m.add_argument("--first", type=int, default=0, help="number of the first file (add more input later)")
    r = sub.add_parser("run")
    r.add_argument("--store", required=True)
    r.add_argument("--input", required=True)
    r.add_argument("--zk", required=True)
    r.add_argument("--seconds", type=float, default=120.0)
    r.add_argument("--instance", default=None)
    r.add_argument("--zk-chroot", default="/deltawheel", help="ZooKeeper folder of this store's leases")
    a = p.parse_args(argv)
    if a.what == "make-input":
        make_input(a.input, files=a.files, rows=a.rows, first=a.first)
    else:
        run(a.store, a.input, zk=a.zk, seconds=a.seconds, instance=a.instance, zk_chroot=a.zk_chroot)


if __name__ == "__main__":
    main()
