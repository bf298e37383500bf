"""A two-stage pipeline for the promote and replay property tests: per
account a running balance (``n`` payments, their ``sum``, the last payment's id; a production per
payment with its sequence number ``seq``; an event-time state TTL), then per 10 s of event time the
sum of the payments (``windowed``, accumulating, allowed lateness 30 s) over stage 1's stream.

``deltawheel run balance_pipeline:pipeline`` builds it over the Parquet folder ``$PAYMENTS_INPUT``
(the tests' child processes; ``deltawheel replay --source`` and ``promote --source`` take the same
target). :func:`payment_files` writes the input: ``account``, ``ts``, ``amount``, ``id``."""

from __future__ import annotations

import os
import random
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from deltawheel import RECORD_KEY, Computation, FixedWindows, ParquetInjector, Pipeline, windowed

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

INPUT_ENV = "PAYMENTS_INPUT"
ACCOUNTS = 24
SECOND = 1_000


class Balance(Computation):
    """Per account: how many payments, their sum, the last one's id; each payment produces the
    balance after it with its sequence number (a payment run twice, or lost, shows as a repeated or
    missing ``seq``)."""

    name = "balance"
    inputs = {"payments": RECORD_KEY}
    outputs = ("balances",)
    num_intervals = 4
    state_ttl = timedelta(minutes=2)  # event time: an account silent for 2 min is dropped

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        st = ctx.state or {"n": 0, "sum": 0}
        st = {"n": st["n"] + 1, "sum": st["sum"] + int(record.value["amount"]), "last": record.record_id}
        ctx.state = st
        ctx.produce("balances", {"account": ctx.key, "seq": st["n"], "balance": st["sum"]},
                    timestamp_ms=record.timestamp_ms)


class DoubledBalance(Balance):
    """:class:`Balance` with changed code: amounts counted twice (a replay with it changes every key)."""

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        st = ctx.state or {"n": 0, "sum": 0}
        st = {"n": st["n"] + 1, "sum": st["sum"] + 2 * int(record.value["amount"]), "last": record.record_id}
        ctx.state = st
        ctx.produce("balances", {"account": ctx.key, "seq": st["n"], "balance": st["sum"]},
                    timestamp_ms=record.timestamp_ms)


def make(folder: str) -> Pipeline:
    """The pipeline over the Parquet files of ``folder``."""
    payments = ParquetInjector("payments", folder, key_column="account", event_time_column="ts",
                               record_id_column="id", value_columns=["amount"], watermark_delay_ms=3 * SECOND,
                               max_files_per_trigger=1)
    totals = windowed(name="totals", inputs={"balances": RECORD_KEY}, output="window_totals",
                      windowing=FixedWindows(10 * SECOND), combine="count", accumulation="accumulating",
                      allowed_lateness_ms=30 * SECOND)
    return Pipeline("payments", injectors=(payments,), computations=(Balance(), totals))


def pipeline() -> Pipeline:
    """``deltawheel run balance_pipeline:pipeline``: the input folder is ``$PAYMENTS_INPUT``."""
    return make(os.environ[INPUT_ENV])


def payment_rows(first: int, n: int, *, seed: int, start_ms: int = 1_700_000_000_000) -> list[dict[str, Any]]:
    """Payments ``first`` .. ``first + n - 1``: one every 50 ms of event time, over :data:`ACCOUNTS`
    accounts, a few of them up to 2 s out of order."""
    rng = random.Random(seed * 1_000_003 + first)
    return [{"account": f"a{rng.randrange(ACCOUNTS):03d}", "ts": start_ms + i * 50 - rng.choice((0, 0, 0, 2_000)),
             "amount": rng.randrange(1, 100), "id": f"p{i:07d}"} for i in range(first, first + n)]


def write_payments(folder: Path, index: int, rows: list[dict[str, Any]]) -> None:
    """Input file ``index`` (written aside and renamed in: the file source never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    name = f"payments-{index:05d}.parquet"
    tmp = folder / f".{name}.tmp"
    schema = pa.schema([("account", pa.string()), ("ts", pa.int64()), ("amount", pa.int64()), ("id", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    os.replace(tmp, folder / name)
