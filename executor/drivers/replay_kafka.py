"""Replay of a Kafka-fed computation: its live batches' recorded offset ranges re-read from the
topic (docs/replay.md, "Input positions per commit"), refused when the topic no longer has them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.exceptions import InputGoneError
from deltawheel.statestore.inspection.positions import ComputationCommit

from ..protocol.rescale import SharedInput

__all__ = ["kafka_df", "check_kafka"]



def kafka_df(spark: Any, inputs: SharedInput, ranges: Mapping[str, Mapping[str, tuple[int, int]]] | None) -> Any:
    """The records a live batch read from its Kafka injectors (its recorded offset ranges), as the
    query's frame gives them (``stream`` column included); None: it read none."""
    from pyspark.sql import functions as F

    frames = [inj.batch_df(spark, ranges[inj.topic]).withColumn("stream", F.lit(stream))
              for stream, inj in sorted(inputs.kafka.items()) if ranges and ranges.get(inj.topic)]
    if not frames:
        return None
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def check_kafka(spark: Any, inputs: SharedInput, commits: Sequence[ComputationCommit],
                 batches: Sequence[ComputationCommit]) -> None:
    """Refuse a replay whose batches read Kafka offsets the topic no longer has (retention, deleted
    records), naming the horizon: the first version from which every later batch's ranges are
    still available.

    Raises:
        InputGoneError: an offset range of a replayed batch starts below its partition's earliest offset.
    """
    gone: list[tuple[ComputationCommit, str]] = []
    for inj in inputs.kafka.values():
        parts = sorted({p for c in commits for p in (c.kafka or {}).get(inj.topic, {})}, key=int)
        if not parts:
            continue
        earliest = inj.earliest_offsets(spark, parts)
        for c in commits:
            for p, (start, end) in sorted((c.kafka or {}).get(inj.topic, {}).items()):
                if end > start and start < earliest[p]:
                    gone.append((c, f"{inj.topic}/{p} offsets [{start}, {end}) (earliest available now: "
                                    f"{earliest[p]})"))
    planned = {c.version for c in batches}
    hit = [(c, what) for c, what in gone if c.version in planned]
    if hit:
        horizon = max(c.version for c, _ in gone)
        c, what = hit[0]
        raise InputGoneError(f"the input of live batch {c.batch_id} (rows version {c.version}) is gone from Kafka: "
                             f"{what} are past the topic's retention (or deleted); the horizon is rows version "
                             f"{horizon}: replay from rows version {horizon} or later (--from-version {horizon})")
