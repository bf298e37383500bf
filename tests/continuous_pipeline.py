"""A two-stage pipeline for the continuous tests: per user and minute of event time the clicks
(a timer per minute, fired by the injector's watermark), then per minute the users and clicks (a
timer fired by stage 1's low watermark), over Parquet files of ``user``, ``ts``, ``id``.

``deltawheel run continuous_pipeline:pipeline`` builds it with the input folder of
``$CLICKS_INPUT`` (the tests' child processes)."""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from pyspark import cloudpickle

from deltawheel import RECORD_KEY, Computation, ParquetInjector, Pipeline

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

MINUTE = 60_000


class UserMinutes(Computation):
    name = "user_minutes"
    inputs = {"clicks": RECORD_KEY}
    outputs = ("user_counts",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        start = record.timestamp_ms - record.timestamp_ms % MINUTE
        st = ctx.state or {}
        st[str(start)] = st.get(str(start), 0) + 1
        ctx.state = st
        ctx.set_timer(str(start), start + MINUTE - 1)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state)
        start = int(timer.tag)
        ctx.produce("user_counts", {"user": ctx.key, "start": start, "clicks": st.pop(timer.tag)}, key=str(start))
        ctx.state = st or None


class MinuteTotals(Computation):
    name = "minute_totals"
    inputs = {"user_counts": RECORD_KEY}
    outputs = ("totals",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        st = ctx.state or {"users": 0, "clicks": 0}
        st["users"] += 1
        st["clicks"] += record.value["clicks"]
        ctx.state = st
        ctx.set_timer("end", record.timestamp_ms)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        ctx.produce("totals", {"start": int(ctx.key), **ctx.state})
        ctx.state = None


class FailsOn(Computation):
    """Counts clicks per user, and raises on the user ``bad`` (user code that fails in a live stage)."""
    name = "fails_on"
    inputs = {"clicks": RECORD_KEY}
    outputs = ()

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if ctx.key == "bad":
            raise ValueError(f"no clicks from {ctx.key} " + "x" * 5000)  # a long message, as user code's can be
        ctx.state = (ctx.state or 0) + 1


SCHEMA = "user STRING, ts BIGINT, id STRING"


def make(folder: str, name: str = "clicks", *, schema: str | None = None, fused: bool = False) -> Pipeline:
    """The pipeline over the Parquet files of ``folder`` (``schema``: given, so the folder may be
    empty or missing at the start; ``fused``: stage 2 runs in stage 1's micro-batches)."""
    clicks = ParquetInjector("clicks", folder, key_column="user", event_time_column="ts", record_id_column="id",
                             watermark_delay_ms=5_000, max_files_per_trigger=1, schema=schema)
    return Pipeline(name, injectors=(clicks,), computations=(UserMinutes(), MinuteTotals()),
                    fused=(("user_minutes", "minute_totals"),) if fused else ())


def fused_pipeline() -> Pipeline:
    """``deltawheel run continuous_pipeline:fused_pipeline``: :func:`pipeline` with stage 2 fused to
    stage 1. ``$CRASH_FUSED`` = ``POINT:N`` ends the process (``os._exit``, as a SIGKILL would) in
    stage 2's fused batch ``N``: ``planned`` once its position is written, before it runs;
    ``committed`` once it returned (its commit landed), before its position says so. ``POINT:N:stop``
    stops the process there instead (SIGSTOP to itself, once: a zombie when continued; start it in a
    process group that is not orphaned, or Linux continues it when another member exits). The stop
    may land a little later, in whatever the driver does next (Linux lets any thread of the process
    take the signal), as a pause in the field lands anywhere;
    ``POINT:N:stop:unaware`` continues as a process that did not see its ZooKeeper session end (its
    lease checks pass: only the sequencers fence it)."""
    crash = os.environ.get("CRASH_FUSED")
    if crash:
        import signal

        from deltawheel.executor.drivers import fused

        point, n, stop, unaware = (crash.split(":") + ["", ""])[:4]
        cls = fused.FusedFeed
        orig = cls.frame if point == "planned" else cls.finished
        stopped: list[int] = []

        def dying(self, batch, *args, **kwargs):  # type: ignore[no-untyped-def]
            if batch.batch_id >= int(n) and not stopped:
                print(f"{'stopping' if stop else 'crashing'} in fused batch {batch.batch_id} ({point})", flush=True)
                if not stop:
                    os._exit(137)
                stopped.append(batch.batch_id)
                os.kill(os.getpid(), signal.SIGSTOP)  # the driver: its JVM and workers wait on it
                if unaware:
                    from deltawheel.statestore.ownership.owner import IntervalOwner

                    IntervalOwner.check = lambda _self: None  # type: ignore[method-assign]
                print(f"continued in fused batch {batch.batch_id} ({point})", flush=True)
            return orig(self, batch, *args, **kwargs)

        setattr(cls, "frame" if point == "planned" else "finished", dying)
    return make(os.environ["CLICKS_INPUT"], fused=True)


def pipeline() -> Pipeline:
    """``deltawheel run continuous_pipeline:pipeline``: the input folder is ``$CLICKS_INPUT``."""
    return make(os.environ["CLICKS_INPUT"])


def pipeline_with_schema() -> Pipeline:
    """``deltawheel run continuous_pipeline:pipeline_with_schema``: the same with its schema given,
    so the folder ``$CLICKS_INPUT`` need not exist yet."""
    return make(os.environ["CLICKS_INPUT"], schema=SCHEMA)


def click_rows(n: int, *, seed: int = 41, minutes: int = 5) -> list[dict[str, Any]]:
    """``n`` clicks of 6 users over ``minutes`` minutes, in event-time order with a little disorder."""
    rng = random.Random(seed)
    step = minutes * MINUTE // n
    return [{"user": f"u{rng.randrange(6)}", "ts": i * step + rng.randrange(step // 2), "id": f"c{i}"}
            for i in range(n)]


def write_file(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """One Parquet file, written aside and renamed in (the file source never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("user", pa.string()), ("ts", pa.int64()),
                                                                ("id", pa.string())])), tmp)
    os.replace(tmp, folder / name)


def closing_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A click far after the others: its watermark closes every minute before it."""
    return {"user": "closing", "ts": max(r["ts"] for r in rows) + 10 * MINUTE, "id": "closing"}


def closing_rows(rows: list[dict[str, Any]], num_intervals: int = 4) -> list[dict[str, Any]]:
    """:func:`closing_row` once per key interval (users ``closing<n>``): instances sharing the
    intervals each estimate the injector's watermark from the records of their own intervals."""
    from deltawheel.statestore.rowtable.rows import interval_of

    ts = max(r["ts"] for r in rows) + 10 * MINUTE
    out: dict[int, dict[str, Any]] = {}
    n = 0
    while len(out) < num_intervals:
        user = f"closing{n}"
        out.setdefault(interval_of(user, num_intervals), {"user": user, "ts": ts, "id": user})
        n += 1
    return [out[iv] for iv in sorted(out)]


def expected(rows: list[dict[str, Any]]) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, int]]]:
    """(user, start, clicks) per user and minute; (start, users, clicks) per minute: counted here."""
    per_user = Counter((r["user"], r["ts"] - r["ts"] % MINUTE) for r in rows)
    per_minute: dict[int, list[int]] = {}
    for (_u, start), n in per_user.items():
        tot = per_minute.setdefault(start, [0, 0])
        tot[0] += 1
        tot[1] += n
    return (sorted((u, s, n) for (u, s), n in per_user.items()),
            sorted((s, t[0], t[1]) for s, t in per_minute.items()))


def outputs(spark: Any, layout: Any) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, int]]]:
    """What the two streams hold, as :func:`expected` counts it (every row, duplicates included)."""
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("json")

    def values(stream: str) -> list[dict[str, Any]]:
        try:
            return [codec.decode(r["value"]) for r in spark.read.format("delta").load(layout.stream(stream)).collect()]
        except Exception:
            return []

    users = sorted((v["user"], v["start"], v["clicks"]) for v in values("user_counts")
                   if not v["user"].startswith("closing"))
    totals = sorted((v["start"], v["users"], v["clicks"]) for v in values("totals"))
    return users, totals


class RunLines:
    """A live run's progress lines (``append`` is its ``progress``) and waits on them, within ``timeout_s``."""

    def __init__(self, timeout_s: float = 600.0) -> None:
        self.lines: list[str] = []
        self.append = self.lines.append
        self.deadline = time.monotonic() + timeout_s

    def said(self, text: str) -> int:
        """How many lines hold ``text``."""
        return sum(text in line for line in self.lines)

    def wait(self, what: str, done: Callable[[], bool], run: Any) -> None:
        """Until ``done()``, calling ``run.check()`` meanwhile (it raises what stopped the run, and starts a
        failed stage again)."""
        while not done():
            run.check()
            assert time.monotonic() < self.deadline, f"{what}: not in time; the run said {self.lines[-15:]}"
            time.sleep(0.5)


def outage_input(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any], list[Any], list[Any]]:
    """60 clicks, the first 20 written as ``part-0``: (rows, the closing click, the users' and the minutes'
    rows a drained run gives, the closing click's minute included)."""
    rows = click_rows(60)
    write_file(folder, "part-0.parquet", rows[:20])
    closing = closing_row(rows)
    return rows, closing, expected(rows)[0], expected([*rows, closing])[1]
