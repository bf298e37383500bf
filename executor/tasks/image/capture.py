"""``DELTAWHEEL_TASK_CAPTURE=DIR``: each image task pickles ``(spec, table)`` into ``DIR`` for replay."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from deltawheel.statestore.writepath.image.idsfiles import apart_held, load_ids_file, split_legacy

from .cache import load_image
from .dedup import bloom_for, bloom_paths
from .spec import ImageSpec

__all__ = ["ENV", "capture_folder", "capture", "load_captured", "warm"]

ENV = "DELTAWHEEL_TASK_CAPTURE"
_SEQ = itertools.count()


def capture_folder() -> str | None:
    """The folder the tasks capture into (None: capture is off)."""
    return os.environ.get(ENV) or None


def capture(folder: str, spec: Any, table: Any) -> str:
    """Pickle one task's ``(spec, table)`` into ``folder``; returns the file's path."""
    from pyspark import cloudpickle

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{time.time_ns()}-{os.getpid()}-{next(_SEQ)}.pkl")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        cloudpickle.dump((spec, table), f)
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def load_captured(path: str) -> tuple[Any, Any]:
    """One captured task's ``(spec, table)``."""
    import pickle

    with open(path, "rb") as f:
        spec, table = pickle.load(f)
    return spec, table


def warm(spec: ImageSpec, iv: int, batch: int) -> None:
    """Load interval ``iv``'s image, ids files and Bloom filter into this process's caches."""
    image, _read = load_image(spec, iv)
    image, legacy = split_legacy(image, inline=spec.comp.exactly_once)
    files = [load_ids_file(spec.rows_root, p) for p in spec.ids_files(iv)]
    if spec.comp.exactly_once:
        bloom_for(bloom_paths(spec, iv), image, apart_held(files, legacy), batch)
