"""A computation's input as one streaming DataFrame tagged with a ``stream`` column. Instances
sharing intervals read a stream table from version 0: never a compaction's files (``protocol/rescale.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import ensure_stream_table

from ..computation import Computation
from ..sources.injector import DEFAULT_MAX_EVENT_AHEAD_MS
from ..sources.schema import union_inputs

__all__ = ["StageInput", "event_bounds", "stage_input"]


@dataclass(frozen=True)
class StageInput:
    """One computation's input: ``df`` and the injectors whose watermark is per partition (Kafka:
    their batch's per-partition maxima are taken before the batch and observed after it)."""

    df: Any
    per_partition: tuple[Any, ...]

    def partition_stats(self, batch_df: Any) -> list[tuple[Any, Any]]:
        """(injector, its statistics of ``batch_df``) for each per-partition injector."""
        from pyspark.sql import functions as F

        return [(inj, inj.stats_of(batch_df.where(F.col("stream") == inj.name))) for inj in self.per_partition]


def stage_input(spark: Any, layout: StoreLayout, comp: Computation, injectors: Mapping[str, Any], *,
                shared: bool) -> StageInput:
    """Build ``comp``'s input; ``shared``: instances share its intervals."""
    from pyspark.sql import functions as F

    frames = []
    for s in comp.inputs:
        if s in injectors:
            df = injectors[s].stream_df(spark)
        else:
            reader = spark.readStream.format("delta").option("maxFilesPerTrigger", 1_000_000)
            if shared:
                ensure_stream_table(spark, layout, s)
                reader = reader.option("startingVersion", 0)
            df = reader.load(layout.stream(s))
        frames.append(df.withColumn("stream", F.lit(s)))
    return StageInput(
        df=union_inputs(frames),  # an injector's frame may have raw_value, a stream table's has not
        per_partition=tuple(injectors[s] for s in comp.inputs
                            if s in injectors and callable(getattr(injectors[s], "stats_of", None))))


def event_bounds(comp: Computation, injectors: Mapping[str, Any]) -> dict[str, int]:
    """Each injector input's bound on event time ahead of the clock (``ComputationExecutor``'s
    ``event_ahead_ms``; an injector's None: no bound, and records of stream tables have none)."""
    ahead = {s: getattr(injectors[s], "max_event_ahead_ms", DEFAULT_MAX_EVENT_AHEAD_MS)
             for s in comp.inputs if s in injectors}
    return {s: b for s, b in ahead.items() if b is not None}
