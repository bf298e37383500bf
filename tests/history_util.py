"""A small computation run over several batches for the history and ``--as-of`` tests, and the
state each key should hold after each batch, computed here without deltawheel."""

from __future__ import annotations

import sys
from typing import Any

from deltawheel.executor.computation import Computation
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.delta.log import latest_local_version
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from pyspark import cloudpickle

J = get_codec("json")
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# (key, value, reset) per batch; a reset empties the key (state and timer), so its row goes
BATCHES: list[list[tuple[str, int, bool]]] = [
    [("a", 1, False), ("b", 2, False), ("c", 3, False), ("d", 4, False)],
    [("b", 5, False), ("c", 6, False), ("e", 1, False)],
    [("a", 7, False), ("d", 1, False), ("f", 2, False)],
    [("b", 0, True), ("c", 2, False), ("e", 3, False)],
    [("a", 1, False), ("b", 9, False), ("f", 1, False)],
    [("c", 0, True), ("d", 5, False)],
]


class Summer(Computation):
    """A sum and a count per key, produced to ``sums``, an event-time timer at the last record's
    time + 1,000 s; a reset record forgets the key (at-least-once: no dedup ids keep an empty row)."""

    name = "summer"
    inputs = {"events": "q"}
    outputs = ("sums",)
    num_intervals = 4
    exactly_once = False
    strong_productions = False  # delivered at once: no checkpointed productions left in the rows

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if record.value["reset"]:
            ctx.state = None
            ctx.delete_timer("last")
            return
        st = ctx.state or {"sum": 0, "n": 0}
        ctx.state = {"sum": st["sum"] + record.value["v"], "n": st["n"] + 1}
        ctx.set_timer("last", record.timestamp_ms + 1_000_000)
        ctx.produce("sums", {"q": ctx.key, "sum": ctx.state["sum"]})


def frame(spark: Any, batch: int) -> Any:
    """Batch ``batch`` of :data:`BATCHES` as a stream-schema DataFrame."""
    rows = [{"record_id": f"r{batch}-{i}", "key": "", "value": J.encode({"q": k, "v": v, "reset": reset}),
             "codec": "json", "timestamp_ms": 1_000 * (10 * batch + i), "event_time": None, "producer": "test",
             "commit_id": f"pos-{batch}-{i}", "format_version": 1}
            for i, (k, v, reset) in enumerate(BATCHES[batch])]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))


def expected_states() -> list[dict[str, tuple[dict[str, int], int]]]:
    """After each batch: key -> (state, its timer's time), folded here from :data:`BATCHES`."""
    now: dict[str, tuple[dict[str, int], int]] = {}
    out = []
    for b, batch in enumerate(BATCHES):
        for i, (k, v, reset) in enumerate(batch):
            if reset:
                now.pop(k, None)
                continue
            st = now.get(k, ({"sum": 0, "n": 0}, 0))[0]
            now[k] = ({"sum": st["sum"] + v, "n": st["n"] + 1}, 1_000 * (10 * b + i) + 1_000_000)
        out.append(dict(now))
    return out


def run_batches(spark: Any, layout: Any, zk_config: Any, *, write_path: str) -> list[int]:
    """Run :data:`BATCHES` through :class:`Summer`; the rows table's version after each batch."""
    from executor_util import start_executor, stop_executor

    ex, client = start_executor(spark, layout, zk_config, Summer(), write_path=write_path)
    versions = []
    try:
        for b in range(len(BATCHES)):
            ex.run_batch(frame(spark, b), b, input_watermark_ms=None)
            v = latest_local_version(table_files(spark, layout.rows_of(Summer.name)) or layout.rows_of(Summer.name))
            assert v is not None
            versions.append(v)
    finally:
        stop_executor(ex, client)
    return versions
