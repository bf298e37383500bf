"""Stream tables: one Delta table of delivered records per stream, ``<root>/streams/<name>``."""

from __future__ import annotations

import json
from typing import Any

from ..comments import STREAM as STREAM_COMMENTS
from ..delta.create import create_local_table, spark_type_json, tables_below
from ..delta.log import local_path, local_table_exists
from ..delta.maintenance import COMMIT_CHECKPOINT_INTERVAL
from ..delta.storefs import table_files
from ..exceptions import ConfigError, DeltaWheelError
from ..layout import StoreLayout, validate_name
from ..objectstore.errors import raise_store_failure
from ..sqltext import sql_path, sql_str

__all__ = ["STREAM_FORMAT_VERSION", "BUILTIN_VIEWS", "RESERVED_STREAM_NAMES", "stream_schema_ddl",
           "check_stream_name", "ensure_stream_table", "list_streams"]

STREAM_FORMAT_VERSION = 1

#: The views ``sqlviews.register_views`` always defines.
BUILTIN_VIEWS: tuple[str, ...] = (
    "rows", "state", "timers", "pending_productions", "fences", "dead_letters", "late_data", "state_history", "audit",
)
#: Names a stream may not have: a built-in view, or its ``_decoded`` companion.
RESERVED_STREAM_NAMES: frozenset[str] = frozenset(n.lower() for v in BUILTIN_VIEWS
                                                   for n in (v, f"{v}_decoded"))


def stream_schema_ddl() -> str:
    """The columns of a stream table as a Spark DDL string."""
    return ("record_id STRING NOT NULL, key STRING NOT NULL, value BINARY, codec STRING, "
            "timestamp_ms BIGINT, event_time TIMESTAMP, producer STRING, commit_id STRING, "
            "format_version INT")


def _commented_stream_ddl() -> str:
    """:func:`stream_schema_ddl` with each column's comment (its columns have no nested types)."""
    cols = [c.strip() for c in stream_schema_ddl().split(",")]
    return ", ".join(f"{c} COMMENT {sql_str(STREAM_COMMENTS[c.split()[0]])}" for c in cols)


def _stream_properties(name: str) -> dict[str, str]:
    return {"deltawheel.table": "stream", "deltawheel.stream": name,
            "deltawheel.format_version": str(STREAM_FORMAT_VERSION),
            "delta.checkpointInterval": str(COMMIT_CHECKPOINT_INTERVAL)}  # checkpoints: maintenance.py


def _stream_schema_json() -> str:
    """The table's schema as Delta records it (``schemaString``), each column with its comment."""
    cols = [c.split() for c in stream_schema_ddl().split(",")]
    fields = [{"name": col[0], "type": spark_type_json(col[1]), "nullable": col[2:] != ["NOT", "NULL"],
               "metadata": {"comment": STREAM_COMMENTS[col[0]]}} for col in cols]
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def _create_local(spark: Any, folder: str, name: str) -> bool:
    """Write stream ``name``'s first commit as Delta's ``CREATE TABLE`` would (:func:`create_local_table`)."""
    return create_local_table(spark, folder, schema_json=_stream_schema_json(), properties=_stream_properties(name))


def check_stream_name(name: str) -> str:
    """Return ``name`` if it can name a stream (and its SQL views).

    >>> check_stream_name("clicks")
    'clicks'

    Raises:
        ConfigError: not an SQL identifier, or the name of a built-in view.
    """
    validate_name("stream", name)
    if name.lower() in RESERVED_STREAM_NAMES:
        raise ConfigError(f"stream name {name!r} clashes with the built-in SQL view of that name "
                          f"(reserved: {', '.join(sorted(RESERVED_STREAM_NAMES))}); rename the stream")
    return name


def ensure_stream_table(spark: Any, layout: StoreLayout, name: str) -> str:
    """Create the table of stream ``name`` if it doesn't exist yet (idempotent); return its path.

    Raises:
        ConfigError: ``name`` cannot name a stream, or its table cannot be made (the message says where).
    """
    check_stream_name(name)
    path = layout.stream(name)
    try:
        # a table with its first commit, seen from Python where it can: no Spark statement needed
        if local_table_exists(table_files(spark, path) or path):
            return path
        folder = local_path(path) if layout.is_local else None
        if folder is not None and _create_local(spark, folder, name):
            return path
        props = ", ".join(f"{sql_str(k)} = {sql_str(v)}" for k, v in _stream_properties(name).items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS {sql_path(path)} ({_commented_stream_ddl()}) USING DELTA "
                  f"TBLPROPERTIES ({props})")
    except DeltaWheelError:
        raise
    except Exception as exc:
        raise_store_failure(exc, layout.root)  # a store that does not serve is not a path to clear
        cause = type(exc).__name__ + (f": {str(exc).strip().splitlines()[0]}" if str(exc).strip() else "")
        raise ConfigError(f"the table of stream {name!r} cannot be made at {path}: {cause}; clear that path "
                          "(nothing but the stream's Delta table belongs there) and run again") from exc
    return path


def list_streams(spark: Any | None, layout: StoreLayout) -> list[str]:
    """Names of the stream tables of the store, sorted (a local store's without Spark; else ConfigError)."""
    return tables_below(spark, layout.streams_root, what="streams")
