"""Replay of a Kafka-fed computation: its recorded offset ranges re-read (docs/replay.md)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.exceptions import InputGoneError
from deltawheel.statestore.inspection.positions import ComputationCommit

from ..protocol.rescale import SharedInput

__all__ = ["mixed_df", "check_kafka"]


def mixed_df(spark: Any, inputs: SharedInput, ranges: Mapping[str, Mapping[str, tuple[int, int]]] | None,
             files: Sequence[str]) -> Any:
    """The records a live batch read (Kafka ``ranges``, ``files``), unioned in input order; None: none."""
    from pyspark.sql import functions as F

    from ..sources.schema import union_inputs

    frames = []
    for stream in inputs.comp.inputs:
        inj = inputs.kafka.get(stream)
        if inj is not None:
            if ranges and any(int(end) > int(start) for start, end in ranges.get(inj.topic, {}).values()):
                frames.append(inj.batch_df(spark, ranges[inj.topic]).withColumn("stream", F.lit(stream)))
            continue
        mine = [f for f in files if "/" not in f] if stream in inputs.parquet \
            else [f for f in files if f.startswith(f"{stream}/")]
        if mine:
            frames.append(inputs.files_df(spark, mine))
    return union_inputs(frames) if frames else None


def check_kafka(spark: Any, inputs: SharedInput, commits: Sequence[ComputationCommit],
                 batches: Sequence[ComputationCommit]) -> None:
    """Raise InputGoneError when a batch's Kafka offsets are no longer in the topic, naming the horizon."""
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
