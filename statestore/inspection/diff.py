"""Read-only: the difference of one computation's state and productions between two stores."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Collection

from ..codecs import get_codec
from ..exceptions import CodecError, ConfigError, NotAStoreError, ReplayUnavailableError
from ..layout import StoreLayout
from ..objectstore.errors import raise_store_failure
from ..rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX
from ..rowtable.tables import list_computations

__all__ = ["StoreDiff", "diff_stores", "format_diff", "SAMPLE"]

SAMPLE = 5  # samples per kind of difference


@dataclass(frozen=True, kw_only=True)
class StoreDiff:
    """The difference of one computation between stores A and B: ``counts`` and ``samples`` per kind."""

    computation: str
    store_a: str
    store_b: str
    version_a: int | None
    version_b: int | None
    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing differs."""
        return not any(self.counts.values())

    def to_json(self) -> str:
        """The diff as a JSON document (``--diff-out``)."""
        return json.dumps({**dataclasses.asdict(self), "notes": list(self.notes), "empty": self.empty},
                          indent=2, sort_keys=True, default=str)


STATE_KINDS = ("added", "removed", "changed", "timers", "pending")
PRODUCTION_KINDS = ("productions_only_a", "productions_only_b", "productions_changed")


def _decode(value: bytes | None, codec: str | None) -> Any:
    if value is None:
        return None
    try:
        return get_codec(codec or "json").decode(bytes(value))
    except CodecError:
        return f"<{len(value)} bytes, codec {codec}>"


def _read(spark: Any, path: str, version: int | None, what: str) -> Any:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    try:
        return reader.load(path)
    except Exception as exc:  # AnalysisException / Delta's VersionNotFound
        raise_store_failure(exc, path)
        text = str(exc).splitlines()[0][:300]
        if version is not None and ("version" in text.lower() or "VERSION" in text):
            raise ReplayUnavailableError(f"{what}: version {version} of {path} is not available ({text}); "
                                         "pick a version DESCRIBE HISTORY still lists") from exc
        raise NotAStoreError(f"{what}: {path} is not a Delta table ({text}); check the store path") from exc


@dataclass(frozen=True)
class _Scope:
    """The keys (or intervals of ``num_intervals``) a diff is limited to (both None: every key)."""

    keys: tuple[str, ...] | None = None
    intervals: tuple[int, ...] | None = None
    num_intervals: int | None = None

    def of(self, df: Any, *, by_interval_column: bool) -> Any:
        from pyspark.sql import functions as F

        if self.keys is not None:
            df = df.where(F.col("key").isin(list(self.keys)))
        if self.intervals is not None:
            iv = F.col("interval") if by_interval_column else \
                F.pmod(F.crc32(F.col("key").cast("binary")), F.lit(self.num_intervals)).cast("int")
            df = df.where(iv.isin(list(self.intervals)))
        return df


def _rows(spark: Any, layout: StoreLayout, computation: str, version: int | None, scope: _Scope = _Scope()) -> Any:
    from pyspark.sql import functions as F

    path = layout.rows_of(computation)
    if version is None and computation not in list_computations(spark, layout):
        path = layout.rows  # no commit of it yet: the store's first rows table has its columns and no rows
    df = scope.of(_read(spark, path, version, f"store {layout.root}"), by_interval_column=True)
    return (df.where((F.col("computation") == computation) & (F.col("key") != FENCE_KEY)
                    & ~F.col("key").startswith(IDS_KEY_PREFIX))
            .select("key", "interval", "state", "codec", F.to_json(F.col("timers")).alias("timers"),
                    F.to_json(F.col("pending")).alias("pending")))


def _with_seed_pending(spark: Any, a: StoreLayout, b_rows: Any, computation: str, *, version: int,
                       intervals: Collection[int], scope: _Scope) -> Any:
    """``b_rows`` with A's pending productions as of ``version`` in rows of ``intervals`` holding none."""
    from pyspark.sql import functions as F

    seed = _rows(spark, a, computation, version, scope).select("key", F.col("pending").alias("seed_pending"))
    none = F.col("pending").isNull() | (F.col("pending") == F.lit("[]"))
    return (b_rows.join(seed, "key", "left")
            .withColumn("pending", F.when(F.col("interval").isin([int(i) for i in intervals]) & none,
                                          F.col("seed_pending")).otherwise(F.col("pending")))
            .drop("seed_pending"))


def _state_diff(spark: Any, a: Any, b: Any, counts: dict[str, int],
                samples: dict[str, list[dict[str, Any]]]) -> None:
    from pyspark.sql import functions as F

    j = a.alias("a").join(b.alias("b"), F.col("a.key") == F.col("b.key"), "full_outer").select(
        F.coalesce(F.col("a.key"), F.col("b.key")).alias("key"),
        F.col("a.key").isNull().alias("only_b"), F.col("b.key").isNull().alias("only_a"),
        F.col("a.state").alias("a_state"), F.col("a.codec").alias("a_codec"),
        F.col("b.state").alias("b_state"), F.col("b.codec").alias("b_codec"),
        F.col("a.timers").alias("a_timers"), F.col("b.timers").alias("b_timers"),
        F.col("a.pending").alias("a_pending"), F.col("b.pending").alias("b_pending"))
    both = ~F.col("only_a") & ~F.col("only_b")
    conds = {
        "added": F.col("only_b"),
        "removed": F.col("only_a"),
        "changed": both & ~F.col("a_state").eqNullSafe(F.col("b_state")),
        "timers": both & ~F.col("a_timers").eqNullSafe(F.col("b_timers")),
        "pending": both & ~F.col("a_pending").eqNullSafe(F.col("b_pending")),
    }
    j = j.withColumn("kinds", F.array(*[F.when(c, F.lit(k)) for k, c in conds.items()])).cache()
    try:
        agg = j.select(*[F.sum(F.when(c, 1).otherwise(0)).alias(k) for k, c in conds.items()]).collect()[0]
        for k in STATE_KINDS:
            counts[k] = int(agg[k] or 0)
            if not counts[k]:
                continue
            rows = j.where(conds[k]).orderBy("key").limit(SAMPLE).collect()
            state = k not in ("timers", "pending")  # else the sample shows that column of A and B
            samples[k] = [{"key": r["key"], "a": _decode(r["a_state"], r["a_codec"]) if state else None,
                           "b": _decode(r["b_state"], r["b_codec"]) if state else None,
                           **({} if state else {f"a_{k}": r[f"a_{k}"], f"b_{k}": r[f"b_{k}"]})} for r in rows]
    finally:
        j.unpersist()


def _productions(spark: Any, layout: StoreLayout, computation: str, streams: Collection[str],
                 batch_ids: Collection[int] | None, scope: _Scope = _Scope(),
                 exclude_commits: Collection[str] = ()) -> Any | None:
    from pyspark.sql import functions as F

    frames = []
    for s in sorted(streams):
        try:
            df = spark.read.format("delta").load(layout.stream(s))
        except Exception as exc:  # no such stream table in this store: nothing delivered to it
            raise_store_failure(exc, layout.stream(s))
            continue
        df = scope.of(df.where(F.col("producer") == computation), by_interval_column=False)
        if batch_ids is not None:
            batch = F.split(F.col("commit_id"), ":").getItem(1).cast("long")
            df = df.where(batch.isin([int(b) for b in batch_ids]))
        if exclude_commits:
            df = df.where(~F.col("commit_id").isin(sorted(exclude_commits)))
        frames.append(df.select(F.lit(s).alias("stream"), "key", "timestamp_ms", "value", "codec"))
    if not frames:
        return None
    out = functools.reduce(lambda x, y: x.unionByName(y), frames)
    # several productions of one (stream, key, event time): compared as a sorted list of values
    return out.groupBy("stream", "key", "timestamp_ms").agg(
        F.array_sort(F.collect_list(F.hex("value"))).alias("values"), F.first("codec").alias("codec"))


def _production_diff(a: Any | None, b: Any | None, counts: dict[str, int],
                     samples: dict[str, list[dict[str, Any]]]) -> None:
    from pyspark.sql import functions as F

    counts.update(dict.fromkeys(PRODUCTION_KINDS, 0))
    if a is None and b is None:
        return
    if a is None or b is None:  # a side with no stream table: an empty frame of the other's columns
        empty = next(f for f in (a, b) if f is not None).limit(0)
        a, b = (empty if a is None else a), (empty if b is None else b)
    on = [F.col("a.stream") == F.col("b.stream"), F.col("a.key") == F.col("b.key"),
          F.col("a.timestamp_ms") == F.col("b.timestamp_ms")]
    j = a.alias("a").join(b.alias("b"), on, "full_outer").select(
        F.coalesce("a.stream", "b.stream").alias("stream"), F.coalesce("a.key", "b.key").alias("key"),
        F.coalesce("a.timestamp_ms", "b.timestamp_ms").alias("timestamp_ms"),
        F.col("a.values").alias("a_values"), F.col("b.values").alias("b_values"),
        F.coalesce("a.codec", "b.codec").alias("codec"))
    conds = {"productions_only_a": F.col("b_values").isNull(), "productions_only_b": F.col("a_values").isNull(),
             "productions_changed": F.col("a_values").isNotNull() & F.col("b_values").isNotNull()
             & ~F.col("a_values").eqNullSafe(F.col("b_values"))}
    agg = j.select(*[F.sum(F.when(c, 1).otherwise(0)).alias(k) for k, c in conds.items()]).collect()[0]

    def values(hexes: list[str] | None, codec: str | None) -> list[Any] | None:
        return None if hexes is None else [_decode(bytes.fromhex(h), codec) for h in hexes]

    for k, c in conds.items():
        counts[k] = int(agg[k] or 0)
        if counts[k]:
            samples[k] = [{"stream": r["stream"], "key": r["key"], "timestamp_ms": r["timestamp_ms"],
                           "a": values(r["a_values"], r["codec"]), "b": values(r["b_values"], r["codec"])}
                          for r in j.where(c).orderBy("stream", "key", "timestamp_ms").limit(SAMPLE).collect()]


def diff_stores(spark: Any, a: StoreLayout, b: StoreLayout, computation: str, *, version_a: int | None = None,
                version_b: int | None = None, streams: Collection[str] = (),
                batch_ids: Collection[int] | None = None, keys: Collection[str] | None = None,
                intervals: Collection[int] | None = None, num_intervals: int | None = None,
                exclude_commits: Collection[str] = (), seed_version: int | None = None,
                seed_intervals: Collection[int] = ()) -> StoreDiff:
    """The difference of ``computation``'s rows and productions to ``streams`` between ``a`` and ``b``,
    limited to ``keys``, ``intervals`` and ``batch_ids`` if given. ``seed_version``: B is a replay seeded
    from A then: in ``seed_intervals`` B's rows without pending are compared with A's pending as of it.

    Raises:
        NotAStoreError: a store has no rows table.
        ReplayUnavailableError: a version that does not exist (or is past Delta's retention).
    """
    counts: dict[str, int] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    scope = _Scope(None if keys is None else tuple(keys), None if intervals is None else tuple(intervals),
                   num_intervals)
    if scope.intervals is not None and not num_intervals:
        raise ConfigError("diff_stores: intervals need the computation's num_intervals (num_intervals=...)")
    if seed_intervals and seed_version is None:
        raise ConfigError("diff_stores: seed_intervals need the version B was seeded from (seed_version=...)")
    b_rows = _rows(spark, b, computation, version_b, scope)
    if seed_intervals:
        assert seed_version is not None
        b_rows = _with_seed_pending(spark, a, b_rows, computation, version=seed_version, intervals=seed_intervals,
                                    scope=scope)
    _state_diff(spark, _rows(spark, a, computation, version_a, scope), b_rows, counts, samples)
    _production_diff(_productions(spark, a, computation, streams, batch_ids, scope, exclude_commits),
                     _productions(spark, b, computation, streams, batch_ids, scope, exclude_commits), counts, samples)
    return StoreDiff(computation=computation, store_a=a.root, store_b=b.root, version_a=version_a,
                     version_b=version_b, counts=counts, samples=samples)


def format_diff(d: StoreDiff) -> str:
    """The diff as a table of counts, then its samples, for a terminal."""
    lines = [f"diff of {d.computation}: A = {d.store_a}" + (f" @ v{d.version_a}" if d.version_a is not None else "")
             + f", B = {d.store_b}" + (f" @ v{d.version_b}" if d.version_b is not None else ""),
             f"{'what':<22}{'count':>8}"]
    lines += [f"{k:<22}{d.counts.get(k, 0):>8}" for k in STATE_KINDS + PRODUCTION_KINDS]
    lines += [f"note: {n}" for n in d.notes]
    lines.append("no difference" if d.empty else "samples (A -> B):")
    lines += [f"  {k}: {json.dumps(r, sort_keys=True, default=str)}"
              for k, rows in d.samples.items() for r in rows]
    return "\n".join(lines)
