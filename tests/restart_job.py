"""A job for the restart tests: one computation over a Parquet folder, as its own process and
Spark application, run until it is killed.

    python restart_job.py STORE INPUT ZK_HOSTS CHROOT INSTANCE [--columnar]

INSTANCE ``-`` runs without an instance name. ``--columnar`` runs :class:`WinCount` (a count per
key and 10-s window on the columnar path; it leaves a file per ``process_columns`` call in
``STORE``'s sibling ``columnar-calls``, or ``$RESTART_WITNESS`` for a store on an object store)
instead of :class:`Seen`. It prints ``CONNECTED`` once ``deltawheel.connect``
returned, ``GRANTED`` with the time its leases were granted, and the executor's lines (a line per
committed batch: ``seen batch N: ...``), each after the seconds since the process started. The
test SIGKILLs it while it holds its leases (its ZooKeeper session, of ``deltawheel.connect``'s
default timeout, outlives it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from deltawheel.executor.computation import RECORD_KEY, ColumnBatch, ColumnResult, Computation
from executor_util import columnar_window_count  # tests/: the script's own folder
from pyspark import cloudpickle

STARTED = time.monotonic()
STARTED_WALL = time.time()
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"k{i}" for i in range(8)]
PER_FILE = 40
PIPELINE = "restart"


class Seen(Computation):
    """Counts each key's records and produces one row per record with its running count: a record
    processed twice, or lost, shows in the output (a doubled id, or a gap in a key's counts)."""

    name = "seen"
    inputs = {"events": RECORD_KEY}
    outputs = ("seen",)
    num_intervals = 4

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        n = (ctx.state or 0) + 1
        ctx.state = n
        ctx.produce("seen", {"n": n}, timestamp_ms=record.timestamp_ms)


WIN = 10_000


class WinCount(Computation):
    """A count per key and 10-s window in ``int64map`` state ({window_start: count}), produced to
    ``counts`` as ``[key, start, count]`` when the watermark passes the window's end; declares the
    columnar path, with ``process_record``/``process_timer`` as its definition."""

    name = "wincount"
    inputs = {"events": RECORD_KEY}
    outputs = ("counts",)
    num_intervals = 4
    codec = "int64map"
    witness: str | None = None  # a folder: a file per process_columns call (the path ran)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        start = record.timestamp_ms - record.timestamp_ms % WIN
        st = ctx.state or {}
        if start not in st:
            ctx.set_timer(str(start), start + WIN - 1)
        st[start] = st.get(start, 0) + 1
        ctx.state = st

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state)
        start = int(timer.tag)
        ctx.produce("counts", [ctx.key, start, st.pop(start)], timestamp_ms=start)
        ctx.state = st or None

    def process_columns(self, batch: ColumnBatch) -> ColumnResult:
        import uuid

        import pyarrow as pa
        import pyarrow.compute as pc
        from deltawheel.statestore.codecs import get_codec

        if self.witness is not None:
            os.makedirs(self.witness, exist_ok=True)
            Path(self.witness, uuid.uuid4().hex).touch()
        st, timers, due, fired, done = columnar_window_count(batch, WIN)
        enc = get_codec("int64map").encode
        cols = (done.column(c).to_pylist() for c in ("key", "map_key", "map_value"))
        values = [enc([k, s, n]) for k, s, n in zip(*cols, strict=True)]
        prods = pa.table({"fired": pa.array(range(fired.num_rows), pa.int64()),
                          "stream": pa.repeat(pa.scalar("counts"), fired.num_rows),
                          "value": pa.array(values, pa.binary()), "timestamp_ms": done.column("map_key")})
        keep = pc.invert(due)
        return ColumnResult(state=st.filter(keep), timers=timers.filter(keep), fired=fired, productions=prods)


def write_files(folder: Path, count: int) -> int:
    """``count`` input files of PER_FILE records each (every key in every file); returns the records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        keys = [KEYS[i % len(KEYS)] for i in range(PER_FILE)]
        times = [1_000_000 + n * 10_000 + i for i in range(PER_FILE)]
        tmp = folder / f".part-{n:05d}.parquet"
        pq.write_table(pa.table({"key": keys, "t": pa.array(times, pa.int64())}), tmp)
        os.replace(tmp, folder / f"part-{n:05d}.parquet")
        # Spark's file source takes files in modification-time order
        os.utime(folder / f"part-{n:05d}.parquet", (1_700_000_000 + n, 1_700_000_000 + n))
    return count * PER_FILE


def injector(folder: str, *, columnar: bool = False):  # type: ignore[no-untyped-def]
    """``columnar``: records without a value (the columnar path takes only those)."""
    from deltawheel.executor.sources.parquet import ParquetInjector

    return ParquetInjector("events", folder, key_column="key", event_time_column="t", watermark_delay_ms=1_000,
                           max_files_per_trigger=1, max_event_ahead_ms=None,
                           value_columns=[] if columnar else None)


def computation(store: str, *, columnar: bool) -> Any:
    """The job's computation: :class:`Seen`, or :class:`WinCount` leaving its witness beside ``store``
    (a store on an object store: in the local folder ``$RESTART_WITNESS``)."""
    if not columnar:
        return Seen()
    comp = WinCount()
    comp.witness = os.environ.get("RESTART_WITNESS") or str(Path(store).parent / "columnar-calls")
    return comp


def say(line: str) -> None:
    print(f"{time.monotonic() - STARTED:.2f} {line}", flush=True)


def main(argv: list[str]) -> int:
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    import deltawheel

    store, folder, hosts, chroot, instance = argv[:5]
    columnar = "--columnar" in argv[5:]
    comp = computation(store, columnar=columnar)
    spark = build_spark(SparkSettings(master="local[1]", app_name=f"restart-{instance}", driver_memory="1g"))
    engine = deltawheel.connect(spark, store=store, zk=hosts, zk_chroot=chroot, pipeline=PIPELINE,
                                instance=None if instance == "-" else instance, wait_s=120)
    say("CONNECTED")

    def progress(line: str) -> None:
        say(line)
        if line.startswith(f"{comp.name}: started"):  # when ZooKeeper granted the leases, by the grants' stamps
            granted = max(g.granted_ms for g in engine.leases.held(comp.name).values()) / 1000 - STARTED_WALL
            print(f"{granted:.2f} GRANTED", flush=True)

    engine.progress = progress
    query = engine.start(injector(folder, columnar=columnar), comp)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
