"""The live pipeline of tests/test_replay.py's store, as ``deltawheel replay --source`` (and
``deltawheel run``) take it: ``replay_source:pipeline`` (its input folder from the environment)."""

from __future__ import annotations

import os

from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.sources.parquet import ParquetInjector

from deltawheel.demo.pipeline import Model, window_counter

INPUT_ENV = "DELTAWHEEL_TEST_REPLAY_INPUT"
DISORDER_MS = 3_000  # ZeitgeistParams.max_disorder_ms (the injector's watermark delay)


def pipeline_for(folder: str, *, disorder_ms: int = DISORDER_MS) -> Pipeline:
    """The demo's first two stages over the Parquet files in ``folder``."""
    inj = ParquetInjector("queries", folder, key_column="query", event_time_column="event_time",
                          record_id_column="record_id", max_files_per_trigger=1, watermark_delay_ms=disorder_ms)
    return Pipeline("zeitgeist", (inj,), (window_counter(), Model()))


def pipeline() -> Pipeline:
    """:func:`pipeline_for` the folder ``$DELTAWHEEL_TEST_REPLAY_INPUT`` names."""
    return pipeline_for(os.environ[INPUT_ENV])
