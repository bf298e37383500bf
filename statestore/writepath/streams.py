"""Stream tables: one Delta table of delivered records per stream.

A stream ``clicks`` of the store at ``root`` is the Delta table
``<root>/streams/clicks``. Consumers read it with Delta's streaming source;
producers append to it idempotently (see the delivery code). Every record
carries :data:`STREAM_FORMAT_VERSION` in its ``format_version`` column. Its Delta log is
checkpointed in the background, not by the deliveries' commits (``delta/maintenance.py``). On a
local store the table's first commit is written from Python (the one Delta's ``CREATE TABLE``
writes, ``tests/test_stream_tables.py`` compares them); elsewhere, or when the session sets Delta
table defaults, through Spark.

Stream names become SQL view names (``clicks`` and ``clicks_decoded``, see
``sqlviews.py``), so they must be SQL identifiers and must not clash with the
built-in views (:data:`RESERVED_STREAM_NAMES`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from ..comments import STREAM as STREAM_COMMENTS
from ..delta.jvm import jcontext, jvm
from ..delta.log import local_path, local_table_exists
from ..delta.maintenance import COMMIT_CHECKPOINT_INTERVAL
from ..delta.storefs import table_files
from ..exceptions import ConfigError, DeltaWheelError
from ..layout import StoreLayout, validate_name
from ..sqltext import sql_path, sql_str

__all__ = [
    "STREAM_FORMAT_VERSION",
    "BUILTIN_VIEWS",
    "RESERVED_STREAM_NAMES",
    "stream_schema_ddl",
    "check_stream_name",
    "ensure_stream_table",
    "list_streams",
]

STREAM_FORMAT_VERSION = 1

#: The views ``sqlviews.register_views`` always defines.
BUILTIN_VIEWS: tuple[str, ...] = (
    "rows", "state", "timers", "pending_productions", "fences", "dead_letters", "late_data", "state_history", "audit",
)
#: Names a stream may not have: a built-in view, or its ``_decoded`` companion.
RESERVED_STREAM_NAMES: frozenset[str] = frozenset(
    n.lower() for v in BUILTIN_VIEWS for n in (v, f"{v}_decoded")
)


def stream_schema_ddl() -> str:
    """The columns of a stream table as a Spark DDL string."""
    return (
        "record_id STRING NOT NULL, key STRING NOT NULL, value BINARY, codec STRING, "
        "timestamp_ms BIGINT, event_time TIMESTAMP, producer STRING, commit_id STRING, "
        "format_version INT"
    )


def _commented_stream_ddl() -> str:
    """:func:`stream_schema_ddl` with each column's comment (its columns have no nested types)."""
    cols = [c.strip() for c in stream_schema_ddl().split(",")]
    return ", ".join(f"{c} COMMENT {sql_str(STREAM_COMMENTS[c.split()[0]])}" for c in cols)


_SPARK_TYPES = {"STRING": "string", "BINARY": "binary", "BIGINT": "long", "TIMESTAMP": "timestamp", "INT": "integer"}
#: session settings that change what Delta's CREATE TABLE writes (table property defaults, the
#: protocol): with one set, a stream table is made through Spark, so that it gets them
_DELTA_TABLE_DEFAULTS = ("spark.databricks.delta.properties.defaults.", "spark.databricks.delta.protocol.")


def _stream_properties(name: str) -> dict[str, str]:
    """The table properties of stream ``name``'s table."""
    return {"deltawheel.table": "stream", "deltawheel.stream": name,
            "deltawheel.format_version": str(STREAM_FORMAT_VERSION),
            "delta.checkpointInterval": str(COMMIT_CHECKPOINT_INTERVAL)}  # checkpoints: maintenance.py


def _stream_schema_json() -> str:
    """The table's schema as Delta records it (``schemaString``): :func:`stream_schema_ddl`'s
    columns, each with its comment."""
    fields = []
    for col in (c.split() for c in stream_schema_ddl().split(",")):
        fields.append({"name": col[0], "type": _SPARK_TYPES[col[1]], "nullable": col[2:] != ["NOT", "NULL"],
                       "metadata": {"comment": STREAM_COMMENTS[col[0]]}})
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def _create_local(spark: Any, folder: str, name: str) -> bool:
    """Write the first commit of stream ``name``'s table in the local ``folder``, as Delta's
    ``CREATE TABLE`` (:func:`ensure_stream_table`) writes it: the same schema, comments,
    properties and protocol, in ~1 ms instead of a Spark statement (0.1-0.3 s, the longest step
    of a run's start on a new store). Put-if-absent (``os.link`` fails if the commit exists): a
    table another writer made first is left as it is. False (nothing written): the session sets
    defaults that change what Delta writes for a new table (then Spark makes it)."""
    conf = spark.conf.getAll
    if any(k.startswith(_DELTA_TABLE_DEFAULTS) for k in conf):
        return False
    props = _stream_properties(name)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "operationParameters": {
            "partitionBy": "[]", "clusterBy": "[]", "description": None, "isManaged": "false",
            "properties": json.dumps(props, separators=(",", ":"))},
            "isolationLevel": "Serializable", "isBlindAppend": True, "operationMetrics": {},
            "engineInfo": "deltawheel", "txnId": str(uuid.uuid4())}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": _stream_schema_json(), "partitionColumns": [], "configuration": props,
                      "createdTime": now}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
    ]
    log = os.path.join(folder, "_delta_log")
    os.makedirs(log, exist_ok=True)
    tmp = os.path.join(log, f".{uuid.uuid4().hex}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions))
    try:
        os.link(tmp, os.path.join(log, f"{0:020d}.json"))
    except FileExistsError:
        return True  # made meanwhile by another writer (with its own checksum file)
    finally:
        os.unlink(tmp)
    _write_checksum(log, actions)
    return True


# Delta's file size histogram bins (``FileSizeHistogram``'s default boundaries), as its checksum
# file of a new table lists them
_HISTOGRAM_BINS = (0, 8192, 16384, 32768, 65536, 131072, 262144, 524288, *(1048576 * m for m in (
    1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 124, 128, 132,
    136, 140, 144, 160, 176, 192, 208, 224, 240, 256, 272, 288, 304, 320, 336, 352, 368, 384, 400, 416,
    432, 448, 464, 480, 496, 512, 528, 544, 560, 576, 640, 704, 768, 832, 896, 960, 1024, 1088, 1152,
    1216, 1280, 1344, 1408, 1536, 1664, 1792, 1920, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840,
    4096, 8192, 16384, 32768, 65536, 131072, 262144)))


def _write_checksum(log: str, actions: list[dict[str, Any]]) -> None:
    """Delta's checksum file of the new table's first commit (``0.crc``, what ``CREATE TABLE``
    writes beside it): with it, the first reader or writer of the table in a session takes the
    table's protocol and metadata from it; without it Delta reconstructs them with a Spark job
    (0.3-0.4 s on the first delivery of a run). Written after the commit (a crash between leaves
    a table without one: correct, only slower to open once)."""
    info, meta, proto = actions[0]["commitInfo"], actions[1]["metaData"], actions[2]["protocol"]
    zeros = [0] * len(_HISTOGRAM_BINS)
    crc = {"txnId": info["txnId"], "tableSizeBytes": 0, "numFiles": 0, "numMetadata": 1, "numProtocol": 1,
           "setTransactions": [], "domainMetadata": [], "metadata": meta, "protocol": proto,
           "fileSizeHistogram": {"sortedBinBoundaries": list(_HISTOGRAM_BINS), "fileCounts": zeros,
                                 "totalBytes": zeros},
           "allFiles": []}
    tmp = os.path.join(log, f".{uuid.uuid4().hex}.crc.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(crc, separators=(",", ":")))
    os.replace(tmp, os.path.join(log, f"{0:020d}.crc"))


def check_stream_name(name: str) -> str:
    """Return ``name`` if it can name a stream (and its SQL views).

    >>> check_stream_name("clicks")
    'clicks'

    Raises:
        ConfigError: not an SQL identifier, or the name of a built-in view.
    """
    validate_name("stream", name)
    if name.lower() in RESERVED_STREAM_NAMES:
        raise ConfigError(
            f"stream name {name!r} clashes with the built-in SQL view of that name "
            f"(reserved: {', '.join(sorted(RESERVED_STREAM_NAMES))}); rename the stream"
        )
    return name


def ensure_stream_table(spark: Any, layout: StoreLayout, name: str) -> str:
    """Create the table of stream ``name`` if it doesn't exist yet; return its path.

    Idempotent: an existing table is left as it is.

    Raises:
        ConfigError: ``name`` cannot name a stream (see :func:`check_stream_name`), or its table
            cannot be made (e.g. a plain file sits where its folder belongs); the message says where.
    """
    check_stream_name(name)
    path = layout.stream(name)
    try:
        # a table with its first commit, seen from Python where it can (a local folder, s3a://): no Spark
        # statement needed (CREATE TABLE IF NOT EXISTS loads the table's snapshot, seconds on s3a://)
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
        cause = type(exc).__name__ + (f": {str(exc).strip().splitlines()[0]}" if str(exc).strip() else "")
        raise ConfigError(
            f"the table of stream {name!r} cannot be made at {path}: {cause}; clear that path (nothing "
            "but the stream's Delta table belongs there) and run again"
        ) from exc
    return path


def list_streams(spark: Any | None, layout: StoreLayout) -> list[str]:
    """Names of the stream tables of the store, sorted.

    A folder below ``layout.streams_root`` counts as a stream table if it has a
    ``_delta_log`` folder. Local stores are listed with :func:`os.listdir` (no
    Spark needed, ``spark`` may be ``None``). Remote stores (``s3a://``,
    ``abfss://``, ...) are listed through Hadoop's FileSystem API via
    ``spark._jvm``, so they need a session; that path is not covered by the
    tests (they run on local folders).

    Raises:
        ConfigError: a remote store and ``spark`` is ``None``.
    """
    if layout.is_local:
        root = local_path(layout.streams_root) or layout.streams_root
        if not os.path.isdir(root):
            return []
        return sorted(
            n for n in os.listdir(root)
            if os.path.isdir(os.path.join(root, n, "_delta_log"))
        )
    if spark is None:
        raise ConfigError(f"listing the streams of remote store {layout.root} needs a SparkSession")
    hfs = jvm(spark).org.apache.hadoop.fs
    hpath = hfs.Path(layout.streams_root)
    fs = hpath.getFileSystem(jcontext(spark).hadoopConfiguration())
    if not fs.exists(hpath):
        return []
    names = []
    for status in fs.listStatus(hpath):
        if status.isDirectory() and fs.exists(hfs.Path(status.getPath(), "_delta_log")):
            names.append(str(status.getPath().getName()))
    return sorted(names)
