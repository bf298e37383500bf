"""A two-stage pipeline of the batching-invariance tests, as a user would write it from the docs:
stage 1 (``balance``) keeps a balance per account and passes each transaction on to ``moves``;
stage 2 (``window_sums``) sums the amounts per account in 10-second event-time windows
(accumulating, 30 s allowed lateness, the default watermark trigger) into ``sums``. Input: Parquet
files of ``account``, ``ts``, ``id``, ``amount``.

The reference (:func:`expected_panes`) is computed here in plain Python: for records on time at the
source, one ON_TIME pane per account and window, whose value is the window's sum.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from deltawheel import (
    RECORD_KEY,
    Computation,
    DeltaTableInjector,
    FixedWindows,
    JsonLinesInjector,
    ParquetInjector,
    Pipeline,
    windowed,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

WINDOW_MS = 10_000
LATENESS_MS = 30_000
DELAY_MS = 2_000  # the injector's watermark: the newest event time read minus this


class Balance(Computation):
    name = "balance"
    inputs = {"tx": RECORD_KEY}
    outputs = ("moves",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        st = ctx.state or {"n": 0, "balance": 0}
        st["n"] += 1
        st["balance"] += record.value["amount"]
        ctx.state = st
        ctx.produce("moves", {"account": ctx.key, "amount": record.value["amount"], "n": st["n"], "late": record.late})


def amount(v: Any) -> Any:
    return v["amount"]


def window_sums() -> Computation:
    return windowed(name="window_sums", inputs={"moves": "account"}, output="sums",
                    windowing=FixedWindows(WINDOW_MS), combine="sum", accumulation="accumulating",
                    allowed_lateness_ms=LATENESS_MS, value=amount)


SOURCES = ("parquet", "jsonl", "delta")


def make(folder: str, *, files_per_batch: int | None = 1, name: str = "bank", source: str = "parquet") -> Pipeline:
    """The pipeline over the input of ``folder`` (``files_per_batch``: the injector's
    ``max_files_per_trigger``, None: every new file in one batch; ``source``: Parquet files, JSON
    Lines files or a Delta table's commits, as :func:`write_file` writes them)."""
    common: dict[str, Any] = {"key_column": "account", "event_time_column": "ts", "record_id_column": "id",
                              "watermark_delay_ms": DELAY_MS}
    tx: Any
    if source == "jsonl":
        tx = JsonLinesInjector("tx", folder, schema="account STRING, ts BIGINT, id STRING, amount BIGINT",
                               max_files_per_trigger=files_per_batch, **common)
    elif source == "delta":
        tx = DeltaTableInjector("tx", folder, max_files_per_trigger=files_per_batch or 1_000_000, **common)
    else:
        tx = ParquetInjector("tx", folder, max_files_per_trigger=files_per_batch, **common)
    return Pipeline(name, injectors=(tx,), computations=(Balance(), window_sums()))


def pipeline() -> Pipeline:
    """``deltawheel run bank_pipeline:pipeline``: the input folder is ``$BANK_INPUT``."""
    return make(os.environ["BANK_INPUT"])


def transactions(seconds: int, *, per_second: int = 10, accounts: int = 8, seed: int = 5,
                 disorder_ms: int = 1_500) -> list[dict[str, Any]]:
    """``seconds`` of transactions in event-time order, each up to ``disorder_ms`` out of place
    (less than the watermark delay: every record is on time at the source when the files are read
    in order), ids unique, amounts between -50 and 100."""
    rng = random.Random(seed)
    rows = []
    for i in range(seconds * per_second):
        ts = i * 1000 // per_second + rng.randrange(disorder_ms)
        rows.append({"account": f"a{rng.randrange(accounts):03d}", "ts": ts, "id": f"t{i:06d}",
                     "amount": rng.randrange(-50, 101)})
    return rows


def closing(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A transaction far after the others: the watermark it brings closes (and expires) every window."""
    return {"account": "zclose", "ts": max(r["ts"] for r in rows) + 10 * LATENESS_MS, "id": "closing", "amount": 0}


def write_file(folder: Path, name: str, rows: list[dict[str, Any]], *, mtime_s: float | None = None,
               source: str = "parquet") -> None:
    """One input file, written aside and renamed in (``mtime_s`` orders files written in one
    instant); for ``source="delta"`` one commit appending ``rows`` to the table ``folder``."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("account", pa.string()), ("ts", pa.int64()), ("id", pa.string()), ("amount", pa.int64())])
    if source == "delta":
        from deltalake import write_deltalake

        write_deltalake(str(folder), pa.Table.from_pylist(rows, schema=schema), mode="append")
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    if source == "jsonl":
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        name = name.replace(".parquet", ".jsonl")
    else:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    if mtime_s is not None:
        os.utime(tmp, (mtime_s, mtime_s))
    os.replace(tmp, folder / name)


def write_files(folder: Path, chunks: list[list[dict[str, Any]]]) -> None:
    """The chunks as files ``part-0000`` ..., their modification times one second apart, in order."""
    import time

    base = time.time() - len(chunks) - 10
    for i, chunk in enumerate(chunks):
        write_file(folder, f"part-{i:04d}.parquet", chunk, mtime_s=base + i)


def expected_panes(rows: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """(account, window start) -> the sum: one ON_TIME pane each."""
    out: dict[tuple[str, int], int] = {}
    for r in rows:
        k = (r["account"], r["ts"] - r["ts"] % WINDOW_MS)
        out[k] = out.get(k, 0) + r["amount"]
    return out


def read_stream(spark: Any, layout: Any, stream: str) -> list[dict[str, Any]]:
    """Every record of ``stream`` decoded (its value), with its key and timestamp."""
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("json")
    try:
        rows = spark.read.format("delta").load(layout.stream(stream)).collect()
    except Exception:
        return []
    return [{**codec.decode(r["value"]), "key": r["key"], "ts": r["timestamp_ms"]} for r in rows]


def panes(spark: Any, layout: Any) -> list[dict[str, Any]]:
    """The panes of ``sums`` (the closing account's left out)."""
    return [p for p in read_stream(spark, layout, "sums") if p["key"] != "zclose"]


def pane_table(ps: list[dict[str, Any]]) -> dict[tuple[str, int], list[tuple[str, int, Any]]]:
    """(account, window start) -> its panes as (timing, index, value), in index order."""
    out: dict[tuple[str, int], list[tuple[str, int, Any]]] = {}
    for p in ps:
        out.setdefault((p["key"], p["window_start"]), []).append((p["timing"], p["pane_index"], p["value"]))
    return {k: sorted(v, key=lambda t: t[1]) for k, v in out.items()}
