"""What a store holds, for ``deltawheel status`` and ``report``: read without Spark where local."""

from __future__ import annotations

from typing import Any

from ..delta.deletionvectors import live_table
from ..delta.log import local_table_exists, read_snapshot
from ..delta.storefs import TableFiles, local_path
from ..delta.txn import decode_path
from ..layout import StoreLayout
from ..rowtable.rows import RESERVED_PREFIX
from ..rowtable.tables import rows_tables

__all__ = ["read_columns", "state_sizes", "pending_productions"]


def _local_files(path: str) -> tuple[TableFiles, list[dict[str, Any]]] | None:
    """The table's root and live add actions, when it is a local table with a readable log."""
    local = local_path(path)
    if local is None or not local_table_exists(path):
        return None
    snap = read_snapshot(path)
    return None if snap is None else (TableFiles(local), list(snap.adds))


def _live(root: TableFiles, add: dict[str, Any], columns: list[str]) -> Any:
    """The rows of one data file that its deletion vector leaves live (a pyarrow table)."""
    return live_table(root, decode_path(add["path"]), add.get("deletionVector"), columns=columns)


def read_columns(path: str, columns: list[str], *, spark: Any = None) -> list[dict[str, Any]]:
    """``columns`` of every row of the Delta table at ``path`` ([] if there is none)."""
    local = _local_files(path)
    if local is not None:
        root, adds = local
        return [row for a in adds for row in _live(root, a, columns).to_pylist()]
    if local_path(path) is not None and not local_table_exists(path):
        return []
    if spark is None:
        raise ValueError(f"reading {path} needs a SparkSession")
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [r.asDict() for r in spark.read.format("delta").load(path).select(*columns).collect()]


def _tables(layout: StoreLayout, spark: Any) -> dict[str, str] | None:
    """computation -> its rows table; None: a remote store and no ``spark`` to list them."""
    if not layout.is_local and spark is None:
        return None
    return rows_tables(spark, layout)


def state_sizes(layout: StoreLayout, spark: Any) -> dict[str, dict[str, int]]:
    """Per computation, from its rows table: ``keys``, ``rows``, ``bytes``, ``files`` (0: Spark counted)."""
    import pyarrow.compute as pc

    out: dict[str, dict[str, int]] = {}
    for comp, path in (_tables(layout, spark) or {}).items():
        local = _local_files(path)
        if local is not None:
            root, adds = local
            for a in adds:
                s = out.setdefault(comp, {"keys": 0, "rows": 0, "bytes": 0, "files": 0})
                keys = _live(root, a, ["key"]).column(0)
                s["rows"] += len(keys)
                if len(keys):
                    s["keys"] += len(keys) - int(pc.sum(pc.starts_with(keys, RESERVED_PREFIX)).as_py())
                s["bytes"] += int(a.get("size", 0))
                s["files"] += 1
        elif spark is not None and (local_path(path) is None or local_table_exists(path)):
            from pyspark.sql import functions as F

            user = (~F.col("key").startswith(RESERVED_PREFIX)).cast("int")
            for r in (spark.read.format("delta").load(path).groupBy("computation")
                      .agg(F.count("*").alias("rows"), F.sum(user).alias("keys")).collect()):
                out[r["computation"]] = {"keys": int(r["keys"] or 0), "rows": int(r["rows"]), "bytes": 0, "files": 0}
    return out


def pending_productions(layout: StoreLayout, spark: Any) -> dict[str, dict[str, int]] | None:
    """Per computation, the productions its rows table checkpoints (``checkpointed``) and how many are not
    in their stream (``undelivered``); None: not local and no ``spark``."""
    tables = _tables(layout, spark)
    if tables is None:
        return None
    held: list[tuple[str, str, str]] = []  # computation, stream, production id
    for comp, path in tables.items():
        local = _local_files(path)
        if local is not None:
            root, adds = local
            for a in adds:
                for lst in _live(root, a, ["pending"]).column(0).to_pylist():
                    held += [(comp, p["stream"], p["production_id"]) for p in lst or ()]
        elif local_path(path) is not None and not local_table_exists(path):
            continue
        elif spark is None:
            return None
        else:
            from pyspark.sql import functions as F

            for r in (spark.read.format("delta").load(path).select("computation", F.explode("pending").alias("p"))
                      .select("computation", "p.stream", "p.production_id").collect()):
                held.append((r[0], r[1], r[2]))
    landed: set[str] = set()
    for stream in sorted({st for _, st, _ in held}):
        try:
            landed |= {r["record_id"] for r in read_columns(layout.stream(stream), ["record_id"], spark=spark)}
        except ValueError:  # a local stream table only Spark reads
            return None
    out: dict[str, dict[str, int]] = {}
    for comp, _stream, pid in held:
        c = out.setdefault(comp, {"checkpointed": 0, "undelivered": 0})
        c["checkpointed"] += 1
        c["undelivered"] += pid not in landed
    return out
