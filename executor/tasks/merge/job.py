"""The MERGE path's batch job (driver side); ``statestore/writepath/merge/`` commits what it returns."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX
from deltawheel.statestore.writepath.merge.path import MergeBatch, MergePath

from ...computation import Computation
from ..input import interval_of_key, original_text, prepare_input, with_original_text
from ..job import BatchCounts, BatchRun, Prepared, task_failure
from .task import OUT_DDL, task_fn

__all__ = ["MergeTasks", "run_in_tasks"]


def run_in_tasks(spark: Any, layout: StoreLayout, comp: Computation, prep: Any | None, *,
                 intervals: Sequence[int], input_watermark_ms: int | None, record_watermark_ms: int | None,
                 now_ms: int, dedup_horizon_ms: int | None, partitions: int, sequencers: dict[int, int],
                 commit_id: str, late_raised: Mapping[int, int] | None = None) -> Any:
    """Join input with the rows it needs and run user code per key in tasks (lazy DataFrame)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import DataType

    n = comp.num_intervals
    ivs = list(intervals)
    if prep is not None:  # join within one session: foreachBatch frames live in the query's clone
        spark = prep.sparkSession
    rows = (spark.read.format("delta").load(layout.rows_of(comp.name))
            .where((F.col("computation") == comp.name) & F.col("interval").isin(ivs) & (F.col("key") != FENCE_KEY)
                   & ~F.col("key").startswith(IDS_KEY_PREFIX)))
    due = (F.size("pending") > 0) | (F.col("next_processing_timer_ms") <= F.lit(now_ms))
    if input_watermark_ms is not None:
        due = due | (F.col("next_event_timer_ms") < F.lit(input_watermark_ms))
    if dedup_horizon_ms is not None and comp.exactly_once:
        # rows with ids past the dedup horizon run too, so their ids are trimmed
        due = due | F.exists("record_ids", lambda x: x["seen_ms"] < F.lit(dedup_horizon_ms))
    if prep is None:
        joined = rows.where(due).withColumn("recs", F.lit(None))
    else:
        owned = prep.withColumn("interval", interval_of_key(n))
        owned = owned.where(F.col("interval").isin(ivs))
        recs = owned.groupBy("key", "interval").agg(F.collect_list(F.struct(
            "record_id", "value", "codec", "timestamp_ms", "late", "stream", "position")).alias("recs"))
        joined = recs.join(rows, ["key", "interval"], "full_outer").where(F.col("recs").isNotNull() | due)
    schema = DataType.fromDDL(OUT_DDL)
    arrow = to_arrow_schema(schema, timezone="UTC")  # type: ignore[arg-type]  # a StructType (parsed from OUT_DDL)
    fn = task_fn(comp, input_watermark_ms, now_ms, dedup_horizon_ms, arrow, sequencers, commit_id,
                 wm_late=record_watermark_ms, late_raised=dict(late_raised or {}))
    return joined.repartition(partitions, "interval").mapInArrow(fn, schema)


def _exploded(out: Any, column: str) -> Any:
    """One row per element of the tasks' list column ``column`` (productions, dead letters, ...)."""
    from pyspark.sql import functions as F

    return out.select(F.explode(column).alias("x")).select("x.*")


class MergeTasks:
    """The MERGE path's batch job: input joined with the rows it needs, user code per key in tasks."""

    def __init__(self, spark: Any, comp: Computation, layout: StoreLayout, path: MergePath, *, partitions: int,
                 event_ahead_ms: Mapping[str, int]) -> None:
        self.spark, self.comp, self.layout, self.path = spark, comp, layout, path
        self.partitions, self.event_ahead_ms = partitions, event_ahead_ms
        self._prep_cache: dict[Any, Any] = {}  # input-preparation column expressions (prepare_input)

    def prepare(self, df: Any | None, *, wm_late: int | None, now: int, batch_id: int | None = None,
                direct: Any = None) -> Prepared:
        """The owned intervals' input, materialized, its dead letters apart (``direct`` is not used)."""
        from pyspark.sql import functions as F

        if df is None:
            return Prepared(input=None)
        comp, owned = self.comp, self.path.owner.intervals
        prep = prepare_input(df, comp, wm_late, cache=self._prep_cache, ahead=(now, self.event_ahead_ms))
        if len(owned) < comp.num_intervals:  # the records of our intervals only
            iv = interval_of_key(comp.num_intervals)
            prep = prep.where(F.coalesce(iv, F.lit(0)).isin(list(owned)))
        try:
            prep = prep.localCheckpoint(eager=True)
        except Exception as exc:  # the input's read (or a key extractor) failed in a task
            raise task_failure(exc, comp.name, batch_id) from exc
        ok_ts = F.when(F.col("_bad").isNull(), F.col("timestamp_ms"))  # dead letters move no watermark
        agg = prep.agg(F.count(F.lit(1)).alias("n"), F.max(ok_ts).alias("mx"), F.min(ok_ts).alias("mn"),
                       F.sum(F.when(F.col("_bad").isNotNull(), 1).otherwise(0)).alias("bad")).collect()[0]
        dead_in = int(agg["bad"] or 0)
        # late records are routed by the tasks, after dedup
        return Prepared(input=prep.where(F.col("_bad").isNull()),
                        dead=prep.where(F.col("_bad").isNotNull()) if dead_in else None,
                        records_in=int(agg["n"]), dead_in=dead_in, obs_min=agg["mn"], obs_max=agg["mx"],
                        raw=original_text(df))

    def run(self, prepared: Prepared, *, batch_id: int, wm_in: int | None, wm_late: int | None, now: int,
            horizon: int | None, commit_id: str, strong: bool, mark: Callable[[str], None],
            late_raised: Mapping[int, int] | None = None) -> BatchRun[MergeBatch]:
        """Load the rows (one join), run user code, materialize once; count what it did."""
        from pyspark.sql import functions as F

        comp, owner = self.comp, self.path.owner
        out = run_in_tasks(self.spark, self.layout, comp, prepared.input, intervals=owner.intervals,
                           input_watermark_ms=wm_in, record_watermark_ms=wm_late, now_ms=now,
                           dedup_horizon_ms=horizon, partitions=self.partitions, sequencers=owner.sequencers,
                           commit_id=commit_id, late_raised=late_raised)
        try:
            out = out.localCheckpoint(eager=True)
        except Exception as exc:
            raise task_failure(exc, comp.name, batch_id) from exc
        stats = out.agg(*[F.sum(c).alias(c) for c in ("processed", "duplicates", "fired", "late", "n_prods",
                                                       "n_dead", "n_routed", "ids_expired", "keys_expired")],
                        F.sum(F.when(F.col("_op") != "none", 1).otherwise(0)).alias("written"),
                        F.min(F.when(F.col("_op") != "delete", F.col("next_event_timer_ms"))).alias("event_timer")
                        ).collect()[0]
        st = {k: int(v or 0) for k, v in stats.asDict().items() if k != "event_timer"}
        mark("load_and_user_code")
        counts = BatchCounts(records_in=prepared.records_in, processed=st["processed"], duplicates=st["duplicates"],
                             late=st["late"], dead_letters=st["n_dead"] + prepared.dead_in, timers_fired=st["fired"],
                             productions=st["n_prods"], keys_written=st["written"], ids_expired=st["ids_expired"],
                             keys_expired=st["keys_expired"])
        batch = MergeBatch(out.where(F.col("_op") != "none"), _exploded(out, "new_prods"), st["written"],
                           st["n_prods"])
        dead = _exploded(out, "dead") if st["n_dead"] else None
        if dead is not None and prepared.raw is not None:
            dead = with_original_text(dead, prepared.raw)
        return BatchRun(batch=batch, counts=counts, dead=dead,
                        late=_exploded(out, "routed") if st["n_routed"] else None,
                        event_timer_ms=stats["event_timer"], obs_min=prepared.obs_min,
                        obs_max=prepared.obs_max)

    def checkpoint(self, run: BatchRun[MergeBatch]) -> bool:
        """The productions are at hand: the commit writes them into the rows' ``pending``."""
        from pyspark.sql import functions as F

        run.batch.checkpointed = True
        run.prod_min_ts = run.batch.prods.agg(F.min("timestamp_ms")).collect()[0][0]
        return True

    def observe(self, run: BatchRun[MergeBatch]) -> None:
        """Nothing to learn: Spark places the tasks."""
