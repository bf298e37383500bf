"""The image path's tasks driven directly, without Spark's planner or the driver's commits: a
counting computation, a worker cache made cold, and :class:`Interval`, a computation's interval
files in a folder advanced as the driver's commits would advance them (tests/test_ids_apart.py,
tests/test_bloom_carry.py)."""

from __future__ import annotations

import os
import sys
import zlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltawheel.executor.computation import Computation
from deltawheel.executor.tasks.image import cache, dedup
from deltawheel.executor.tasks.image.spec import ImageSpec
from deltawheel.executor.tasks.image.task import run_intervals
from deltawheel.executor.tasks.input import PREP_DDL
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.rowtable.frames import arrow_schema as _arrow
from deltawheel.statestore.rowtable.rows import FENCE_KEY, rows_file_ddl
from deltawheel.statestore.writepath.image import idsfiles
from deltawheel.statestore.writepath.image.files import is_ids_path
from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

SEQ = 3
RETENTION = 60_000  # the dedup horizon's length
T0 = 1_700_000_000_000


def counter(intervals: int) -> Computation:
    """A computation that counts each key's records, over ``intervals`` intervals."""

    class Count(Computation):
        """Counts each key's records."""

        name = "count"
        inputs = {"events": "k"}
        outputs = ("out",)
        num_intervals = intervals

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            ctx.state = (ctx.state or 0) + 1

    return Count()


def cold() -> None:
    """A Python worker that never saw the interval (a restart): no image, filter or ids file cached."""
    cache._IMAGES.clear()
    dedup._BLOOMS.clear()
    idsfiles._FILES.clear()


class Interval:
    """A computation's interval files in a folder (``n_iv`` intervals), advanced as the driver's
    commits would: each interval's live files."""

    def __init__(self, root: str, n_iv: int = 1) -> None:
        self.root = root
        self.n_iv = n_iv
        self.comp = counter(n_iv)
        self.schema = _arrow(rows_file_ddl())
        self.images: dict[int, list[str]] = {}
        self.summaries: list[dict[str, Any]] = []
        os.makedirs(os.path.join(root, "out"), exist_ok=True)
        for iv in range(n_iv):
            fence = pa.Table.from_pylist([{"key": FENCE_KEY, "sequencer": SEQ, "record_ids": [], "timers": [],
                                           "pending": [], "format_version": 2}], schema=self.schema)
            name = f"init-{os.path.basename(root)}-{iv}.parquet"
            pq.write_table(fence, os.path.join(root, name))
            self.images[iv] = [name]

    def spec(self, b: int, *, now_ms: int | None = None) -> ImageSpec:
        """The spec of batch ``b`` at processing time ``now_ms`` (default: a second a batch), as the
        driver would hand it to the tasks."""
        now_ms = T0 + b * 1_000 if now_ms is None else now_ms
        return ImageSpec(comp=self.comp, rows_root=TableFiles(self.root),
                         images={iv: tuple(files) for iv, files in self.images.items()},
                         sequencers={iv: SEQ for iv in range(self.n_iv)},
                         stream_roots={"out": TableFiles(os.path.join(self.root, "out"))}, wm=None, now_ms=now_ms,
                         horizon_ms=now_ms - RETENTION, commit_id=f"c{b}", rows_schema=self.schema,
                         stream_schema=_arrow(stream_schema_ddl()), stream_format_version=1, route_late=False,
                         summary_schema=_arrow(SUMMARY_DDL), strong=True)

    def run(self, records: list[tuple[str, str]], *, b: int, now_ms: int | None = None) -> list[dict[str, Any]]:
        """Run ``records`` ((record id, key)) as batch ``b`` and commit what it wrote; the task's
        summary rows (one per interval, and the batch's own)."""
        spec = self.spec(b, now_ms=now_ms)
        schema = _arrow(PREP_DDL).append(pa.field("interval", pa.int32())).append(pa.field("_m", pa.bool_()))
        rows = [{"record_id": rid, "key": key, "value": b"1", "codec": "json", "timestamp_ms": 1_000,
                 "stream": "events", "position": f"p{rid}", "late": False, "_bad": None,
                 "interval": zlib.crc32(key.encode()) % self.n_iv, "_m": False} for rid, key in records]
        rows += [{"interval": iv, "_m": True} for iv in range(self.n_iv)]
        out = [s.to_row() for s in run_intervals(spec, pa.Table.from_pylist(rows, schema=schema))]
        for s in out:
            if s.get("interval") is None:
                continue
            # a new image replaces every file of the interval but its ids files
            files = list(self.images[s["interval"]])
            if s.get("new_path"):
                files = [p for p in files if is_ids_path(p)]
            files = [p for p in files if p not in (s["ids_removed"] or ())]
            files += [p for p in (s.get("new_path"), s.get("ids_path"), s.get("merged_path")) if p]
            self.images[s["interval"]] = files
        self.summaries += out
        return out

    def files(self) -> list[str]:
        """Every interval's live files."""
        return [p for files in self.images.values() for p in files]

    def ids_files(self) -> list[str]:
        return [p for p in self.files() if is_ids_path(p)]

    def state_files(self) -> list[str]:
        return [p for p in self.files() if not is_ids_path(p)]

    def rows(self) -> list[dict[str, Any]]:
        """The rows of every live file."""
        return [r for p in self.files() for r in pq.read_table(os.path.join(self.root, p)).to_pylist()]
