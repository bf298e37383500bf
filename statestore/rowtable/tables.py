"""One rows table per computation, ``<root>/computations/<name>/rows``: made on a computation's first
fenced commit with the schema, properties and protocol of the store's first rows table, recorded in
``<root>/_computations/<name>`` (a table lost later is refused, not made again empty), and listed for
the readers of every computation (docs/tables.md, "The rows tables")."""

from __future__ import annotations

import json
import os
import threading
from functools import reduce
from typing import Any, Iterable

from ..comments import ROWS as ROWS_COMMENTS
from ..comments import comment_table
from ..delta.create import create_local_table, tables_below
from ..delta.jvm import jsession, jvm
from ..delta.log import local_path, local_table_exists
from ..delta.storefs import TableFiles, table_files
from ..exceptions import ConfigError, DeltaWheelError, StoreDamagedError
from ..layout import StoreLayout, validate_name
from ..sqltext import sql_path, sql_str
from .rows import rows_schema_ddl

__all__ = ["ensure_rows_table", "list_computations", "rows_tables", "rows_frame"]

_made: set[str] = set()  # shards this process saw with their first commit
_lock = threading.Lock()


def list_computations(spark: Any | None, layout: StoreLayout) -> list[str]:
    """Names of the computations with a rows table in the store, sorted (a local store's without Spark).
    Raises ConfigError: a remote store and ``spark`` is ``None``."""
    return tables_below(spark, layout.computations_root, inner="rows", what="computations")


def rows_tables(spark: Any | None, layout: StoreLayout) -> dict[str, str]:
    """computation -> the path of its rows table, for every computation of the store."""
    return {c: layout.rows_of(c) for c in list_computations(spark, layout)}


def rows_frame(spark: Any, layout: StoreLayout, computations: Iterable[str] | None = None) -> Any | None:
    """One DataFrame over the rows tables of ``computations`` (default: every one); None: none exists."""
    names = list_computations(spark, layout)
    if computations is not None:
        names = sorted(set(names) & set(computations))
    frames = [spark.read.format("delta").load(layout.rows_of(c)) for c in names]
    return reduce(lambda a, b: a.unionByName(b), frames) if frames else None


def _first_rows_template(spark: Any, layout: StoreLayout) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metaData, protocol) of the store's first rows table: from its newest JSON commits where they hold
    them (a local store), else from Delta's snapshot."""
    folder = local_path(layout.rows) if layout.is_local else None
    if folder is not None:
        log = os.path.join(folder, "_delta_log")
        names = sorted((n for n in os.listdir(log) if n.endswith(".json") and n[:20].isdigit()), reverse=True)[:50]
        meta = proto = None
        for name in names:
            with open(os.path.join(log, name), encoding="utf-8") as f:
                for line in f:
                    action = json.loads(line)
                    meta = meta or action.get("metaData")
                    proto = proto or action.get("protocol")
            if meta and proto:
                return meta, proto
    txn = jvm(spark).org.apache.spark.sql.delta.DeltaLog.forTable(jsession(spark), layout.rows).startTransaction()
    return json.loads(txn.metadata().json())["metaData"], json.loads(txn.protocol().json())["protocol"]


def ensure_rows_table(spark: Any, layout: StoreLayout, computation: str) -> str:
    """Create ``computation``'s rows table if it doesn't exist yet (idempotent); return its path.
    Raises ConfigError: its table cannot be made in a local store (e.g. a plain file sits where its folder
    belongs); on an object store the failure is raised as it is."""
    validate_name("computation", computation)
    path = layout.rows_of(computation)
    if path in _made:
        return path
    made = table_files(spark, layout.computations_made)
    try:
        if local_table_exists(table_files(spark, path) or path):
            _record(made, computation)  # a table made before the records were kept
            with _lock:
                _made.add(path)
            return path
        if made is not None and made.read_text(computation) is not None:
            raise StoreDamagedError(
                f"the rows table of computation {computation!r} is gone from {path}, though this store made "
                f"it ({made.path(computation)} records it): its state, timers and dedup ids went with it. "
                "Restore the store's computations folder from a backup; deltawheel does not start a computation "
                "again from empty state (to start one afresh, give it a new name)")
        _create(spark, layout, path)
        _record(made, computation)
    except DeltaWheelError:
        raise
    except Exception as exc:
        if not layout.is_local:
            raise  # an object store that does not serve is not a path to clear: the caller types it
        cause = type(exc).__name__ + (f": {str(exc).strip().splitlines()[0]}" if str(exc).strip() else "")
        raise ConfigError(f"the rows table of computation {computation!r} cannot be made at {path}: {cause}; "
                          "clear that path (nothing but the computation's Delta table belongs there) and run "
                          "again") from exc
    with _lock:
        _made.add(path)
    return path


def _record(made: TableFiles | None, computation: str) -> None:
    """Record that the store made ``computation``'s rows table (once: kept while the store lives)."""
    if made is not None and made.read_text(computation) is None:
        made.write_text(computation, json.dumps({"computation": computation, "format": 1}) + "\n")


def _create(spark: Any, layout: StoreLayout, path: str) -> None:
    meta, proto = _first_rows_template(spark, layout)
    folder = local_path(path) if layout.is_local else None
    if folder is not None and create_local_table(
            spark, folder, schema_json=meta["schemaString"], properties=meta.get("configuration") or {},
            partition_columns=meta.get("partitionColumns") or (), protocol=proto):
        return
    props = ", ".join(f"{sql_str(k)} = {sql_str(v)}" for k, v in (meta.get("configuration") or {}).items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {sql_path(path)} ({rows_schema_ddl()}) USING DELTA "
              f"PARTITIONED BY (`computation`, `interval`) TBLPROPERTIES ({props})")
    comment_table(spark, path, ROWS_COMMENTS)
