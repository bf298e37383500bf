"""The starting images of the image-task tests that run ``run_task`` without Spark: per interval
one Parquet file holding only the fence row with the writer's sequencer."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from deltawheel.statestore.rowtable.frames import arrow_schema
from deltawheel.statestore.rowtable.rows import FENCE_KEY, rows_file_ddl


def fence_images(root: str, intervals: int, sequencer: int, *, prefix: str = "init") -> dict[int, tuple[str, ...]]:
    """Write ``<prefix>-<iv>.parquet`` under ``root`` for each interval; returns the images map."""
    fence = pa.Table.from_pylist([{"key": FENCE_KEY, "sequencer": sequencer, "record_ids": [], "timers": [],
                                   "pending": [], "format_version": 1}], schema=arrow_schema(rows_file_ddl()))
    images: dict[int, tuple[str, ...]] = {}
    for iv in range(intervals):
        pq.write_table(fence, os.path.join(root, f"{prefix}-{iv}.parquet"))
        images[iv] = (f"{prefix}-{iv}.parquet",)
    return images
