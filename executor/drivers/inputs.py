"""A stage's input for both runners: a streaming DataFrame tagged with ``stream``, its query, its executor's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.delta.storefs import local_path
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import ensure_stream_table

from ..computation import RECORD_KEY, Computation
from ..sources.injector import DEFAULT_MAX_EVENT_AHEAD_MS, BatchStats
from ..sources.schema import union_inputs
from ..tasks.image.direct import DirectSource, table_source
from .querystart import clear_unstarted

__all__ = ["StageInput", "direct_source", "event_bounds", "query_of", "stage_input", "upstream_caps", "with_offset_log"]


@dataclass(frozen=True)
class StageInput:
    """One computation's input: ``df`` and the injectors whose watermark is per partition (Kafka)."""

    df: Any
    per_partition: tuple[Any, ...]

    def partition_stats(self, batch_df: Any, executor: Any) -> list[tuple[Any, Callable[[], Any]]]:
        """(injector, its statistics of ``batch_df``, to call after ``executor`` ran the batch) for each
        per-partition injector: those of a direct read when its tasks read the batch, else one Spark job."""
        from pyspark.sql import functions as F

        def stats(inj: Any) -> Callable[[], Any]:
            def get() -> Any:
                known = getattr(getattr(executor, "job", None), "kafka_stats", {}).get(inj.name)
                if known is not None:
                    n, lo, hi, parts = known
                    return BatchStats(n, lo, hi, partitions=parts)
                return inj.stats_of(batch_df.where(F.col("stream") == inj.name))
            return get

        return [(inj, stats(inj)) for inj in self.per_partition]

    def writer(self, batch: Callable[[Any, int], None], *, checkpoint: str, name: str) -> Any:
        """The query's writer: ``batch`` per micro-batch, on ``checkpoint`` (an unfinished first write cleared)."""
        clear_unstarted(checkpoint)
        return self.df.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint).queryName(name)


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


def query_of(layout: StoreLayout, pipeline: str, computation: str, instance: str | None = None) -> tuple[str, str]:
    """A computation's query checkpoint (per pipeline, or per instance sharing the intervals) and name."""
    base, name = f"{layout.root}/_checkpoints/{pipeline}/{computation}", f"dw_{pipeline}_{computation}"
    suffix = f"_{instance}" if instance else ""
    return (base if instance is None else f"{base}/{instance}"), name + suffix


def event_bounds(comp: Computation, injectors: Mapping[str, Any]) -> dict[str, int]:
    """Each injector input's bound on event time ahead of the clock (None: none), as ``event_ahead_ms``."""
    ahead = {s: getattr(injectors[s], "max_event_ahead_ms", DEFAULT_MAX_EVENT_AHEAD_MS)
             for s in comp.inputs if s in injectors}
    return {s: b for s, b in ahead.items() if b is not None}


def direct_source(comp: Computation, injectors: Mapping[str, Any], *, layout: StoreLayout,
                  checkpoint: str | None, kafka_checkpoint: str | None = None) -> DirectSource | None:
    """For one input read by the record's key, what the image tasks may read themselves: its injector's
    ``direct_source()`` (as of its last ``stream_df``), or with ``checkpoint`` (the query's) an upstream's
    stream table; None: the JVM reads it. Kafka ranges: ``kafka_checkpoint``'s (else ``checkpoint``'s) log."""
    if list(comp.inputs.values()) != [RECORD_KEY]:
        return None
    stream = next(iter(comp.inputs))
    if stream not in injectors:
        return None if checkpoint is None else table_source(stream, layout.stream(stream), checkpoint=checkpoint)
    direct = getattr(injectors[stream], "direct_source", None)
    source: DirectSource | None = direct() if callable(direct) else None
    return with_offset_log(source, checkpoint if kafka_checkpoint is None else kafka_checkpoint)


def with_offset_log(source: DirectSource | None, checkpoint: str | None) -> DirectSource | None:
    """``source``, a Kafka one reading its ranges from ``checkpoint``'s offset log (None: not local)."""
    if source is None or source.kafka is None:
        return source
    local = None if checkpoint is None else local_path(checkpoint)
    if local is None:
        return None
    return dataclasses.replace(source, kafka=dataclasses.replace(source.kafka, checkpoint=local))


def upstream_caps(authority: Any, upstream: Iterable[str]) -> dict[str, int | None]:
    """Each upstream computation's low watermark now, read before a query's snapshot of its tables."""
    return {name: authority.advance_low_watermark(name) for kind, _, name in (u.partition(":") for u in upstream)
            if kind == "computation"}
