"""The chaos run's pipeline: a bank in three stages (``bank``, ``ledger``, ``window_sums``) over
Parquet files of moves (``id``, ``ts`` in ms, ``src``, ``dst``, ``amount``); docs/reliability.md."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.executor.windowing.windowed import windowed
from deltawheel.executor.windowing.windows import FixedWindows

__all__ = ["INPUT_ENV", "PIPELINE", "STREAMS", "WINDOW_MS", "START_MS", "Bank", "Ledger", "make", "pipeline",
           "moves", "closing_moves", "write_moves", "CLOSING_PREFIX"]

INPUT_ENV = "CHAOS_INPUT"
PIPELINE = "chaos"
#: The stream of each stage, in stage order.
STREAMS = ("changes", "balances", "window_sums")
WINDOW_MS = 10_000
LATENESS_MS = 30_000
DELAY_MS = 3_000  # the injector's watermark: the newest event time read minus this
START_MS = 1_700_000_000_000  # the event time of file 0
FILE_SPAN_MS = 1_000  # event time one file covers
ACCOUNTS = 24
CLOSING_PREFIX = "close"


class Bank(Computation):
    """Stage 1: per source account the number of moves out and their total; both legs produced."""

    name = "bank"
    inputs = {"moves": RECORD_KEY}
    outputs = ("changes",)

    def process_record(self, ctx: Any, record: Any) -> None:
        """Count the move out of the account; produce its debit and its credit."""
        st = ctx.state or {"n": 0, "out": 0}
        amount = int(record.value["amount"])
        ctx.state = {"n": st["n"] + 1, "out": st["out"] + amount}
        src, dst = ctx.key, str(record.value["dst"])
        for account, leg, delta in ((src, "debit", -amount), (dst, "credit", amount)):
            ctx.produce("changes", {"move": record.record_id, "account": account, "leg": leg, "delta": delta},
                        key=account, timestamp_ms=record.timestamp_ms)


class Ledger(Computation):
    """Stage 2: the balance per account; each leg produces the balance after it."""

    name = "ledger"
    inputs = {"changes": RECORD_KEY}
    outputs = ("balances",)

    def process_record(self, ctx: Any, record: Any) -> None:
        """Apply the leg to the account's balance; produce the balance after it."""
        st = ctx.state or {"seq": 0, "balance": 0}
        v = record.value
        st = {"seq": st["seq"] + 1, "balance": st["balance"] + int(v["delta"])}
        ctx.state = st
        ctx.produce("balances", {**v, "seq": st["seq"], "balance": st["balance"]}, timestamp_ms=record.timestamp_ms)


def _delta(v: Any) -> Any:
    return v["delta"]


def make(folder: str) -> Pipeline:
    """The pipeline over the Parquet files of ``folder`` (may be empty at the start: the schema is given)."""
    source = ParquetInjector("moves", folder, key_column="src", event_time_column="ts", record_id_column="id",
                             value_columns=["dst", "amount"], watermark_delay_ms=DELAY_MS, max_files_per_trigger=None,
                             schema="id STRING, ts BIGINT, src STRING, dst STRING, amount BIGINT")
    sums = windowed(name="window_sums", inputs={"balances": RECORD_KEY}, output="window_sums",
                    windowing=FixedWindows(WINDOW_MS), combine="sum", accumulation="accumulating",
                    allowed_lateness_ms=LATENESS_MS, value=_delta)
    return Pipeline(PIPELINE, injectors=(source,), computations=(Bank(), Ledger(), sums))


def pipeline() -> Pipeline:
    """``deltawheel run deltawheel.chaos.bank:pipeline``: the input folder is ``$CHAOS_INPUT``."""
    return make(os.environ[INPUT_ENV])


def moves(index: int, n: int, *, seed: int) -> list[dict[str, Any]]:
    """File ``index``'s ``n`` moves: event times in its second (a few 1.5 s early), ids unique."""
    rng = random.Random(seed * 1_000_003 + index)
    base = START_MS + index * FILE_SPAN_MS
    out = []
    for i in range(n):
        src, dst = rng.sample(range(ACCOUNTS), 2)
        out.append({"id": f"m{index:05d}-{i:03d}", "ts": base + rng.randrange(FILE_SPAN_MS) - rng.choice((0, 0, 1_500)),
                    "src": f"a{src:02d}", "dst": f"a{dst:02d}", "amount": rng.randrange(1, 500)})
    return out


def closing_moves(index: int, num_intervals: int = 4) -> list[dict[str, Any]]:
    """Zero moves far after file ``index``, one per stage-1 key interval: every earlier window closes."""
    from deltawheel.statestore.rowtable.rows import interval_of

    ts = START_MS + index * FILE_SPAN_MS + 10 * (WINDOW_MS + LATENESS_MS)
    out: dict[int, dict[str, Any]] = {}
    n = 0
    while len(out) < num_intervals:
        account = f"{CLOSING_PREFIX}{n}"
        out.setdefault(interval_of(account, num_intervals),
                       {"id": f"{CLOSING_PREFIX}-{account}", "ts": ts, "src": account, "dst": account, "amount": 0})
        n += 1
    return [out[i] for i in sorted(out)]


def write_moves(folder: Path, index: int, rows: list[dict[str, Any]]) -> Path:
    """Input file ``index``, written aside and renamed in (the file source never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    name = f"moves-{index:05d}.parquet"
    tmp = folder / f".{name}.tmp"
    schema = pa.schema([("id", pa.string()), ("ts", pa.int64()), ("src", pa.string()), ("dst", pa.string()),
                        ("amount", pa.int64())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, folder / name)
    return folder / name
