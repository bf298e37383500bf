"""A Delta table's first commit written from Python on a local store, as ``CREATE TABLE`` writes it, and
the tables below a folder."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Mapping, Sequence

from ..exceptions import ConfigError
from .storefs import local_path

__all__ = ["create_local_table", "spark_type_json", "tables_below"]

#: session settings that change what Delta's CREATE TABLE writes: with one set, Spark makes the table
DELTA_TABLE_DEFAULTS = ("spark.databricks.delta.properties.defaults.", "spark.databricks.delta.protocol.")

_SIMPLE = {"STRING": "string", "BINARY": "binary", "BIGINT": "long", "TIMESTAMP": "timestamp", "INT": "integer",
           "DOUBLE": "double", "BOOLEAN": "boolean"}


def spark_type_json(ddl_type: str) -> Any:
    """A flat or ``MAP<k, v>`` Spark SQL DDL type as Delta's schema JSON holds it.

    >>> spark_type_json("BIGINT"), spark_type_json("MAP<STRING, DOUBLE>")
    ('long', {'type': 'map', 'keyType': 'string', 'valueType': 'double', 'valueContainsNull': True})
    """
    t = ddl_type.strip().upper()
    if t.startswith("MAP<") and t.endswith(">"):
        k, v = (x.strip() for x in t[4:-1].split(",", 1))
        return {"type": "map", "keyType": spark_type_json(k), "valueType": spark_type_json(v), "valueContainsNull": True}
    return _SIMPLE[t]


def create_local_table(spark: Any, folder: str, *, schema_json: str, properties: Mapping[str, str],
                       partition_columns: Sequence[str] = (), protocol: Mapping[str, Any] | None = None) -> bool:
    """Write the first commit of a Delta table (``schemaString``, ``TBLPROPERTIES``) in the local
    ``folder``, put-if-absent; False (nothing written): the session sets :data:`DELTA_TABLE_DEFAULTS`.
    ``protocol``: the table's protocol action (default: reader 1, writer 2)."""
    if any(k.startswith(DELTA_TABLE_DEFAULTS) for k in spark.conf.getAll):
        return False
    props = dict(properties)
    parts = list(partition_columns)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "operationParameters": {
            "partitionBy": json.dumps(parts), "clusterBy": "[]", "description": None, "isManaged": "false",
            "properties": json.dumps(props, separators=(",", ":"))},
            "isolationLevel": "Serializable", "isBlindAppend": True, "operationMetrics": {},
            "engineInfo": "deltawheel", "txnId": str(uuid.uuid4())}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_json, "partitionColumns": parts, "configuration": props,
                      "createdTime": now}},
        {"protocol": dict(protocol) if protocol else {"minReaderVersion": 1, "minWriterVersion": 2}},
    ]
    log = os.path.join(folder, "_delta_log")
    os.makedirs(log, exist_ok=True)
    tmp = os.path.join(log, f".{uuid.uuid4().hex}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions))
    try:
        os.link(tmp, os.path.join(log, f"{0:020d}.json"))
    except FileExistsError:
        return True  # made meanwhile by another writer
    finally:
        os.unlink(tmp)
    _write_checksum(log, actions)
    return True


# Delta's default ``FileSizeHistogram`` boundaries, as a new table's checksum file lists them
_HISTOGRAM_BINS = (0, 8192, 16384, 32768, 65536, 131072, 262144, 524288, *(1048576 * m for m in (
    1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 124, 128, 132,
    136, 140, 144, 160, 176, 192, 208, 224, 240, 256, 272, 288, 304, 320, 336, 352, 368, 384, 400, 416,
    432, 448, 464, 480, 496, 512, 528, 544, 560, 576, 640, 704, 768, 832, 896, 960, 1024, 1088, 1152,
    1216, 1280, 1344, 1408, 1536, 1664, 1792, 1920, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840,
    4096, 8192, 16384, 32768, 65536, 131072, 262144)))


def _write_checksum(log: str, actions: list[dict[str, Any]]) -> None:
    """Delta's ``0.crc`` beside the first commit (without it Delta needs a Spark job to open the table)."""
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


def tables_below(spark: Any | None, folder: str, *, inner: str = "", what: str = "tables") -> list[str]:
    """Names of the folders in ``folder`` holding a Delta table at ``<name>/<inner>``, sorted (a local
    folder without Spark).
    Raises ConfigError: a remote folder and ``spark`` is ``None`` (``what`` names what was listed)."""
    local = local_path(folder)
    if local is not None:
        if not os.path.isdir(local):
            return []
        return sorted(n for n in os.listdir(local) if os.path.isdir(os.path.join(local, n, inner, "_delta_log")))
    if spark is None:
        raise ConfigError(f"listing the {what} of {folder} needs a SparkSession")
    from .jvm import jcontext, jvm

    hfs = jvm(spark).org.apache.hadoop.fs
    hpath = hfs.Path(folder)
    fs = hpath.getFileSystem(jcontext(spark).hadoopConfiguration())
    if not fs.exists(hpath):
        return []
    log = f"{inner}/_delta_log" if inner else "_delta_log"
    return sorted(str(s.getPath().getName()) for s in fs.listStatus(hpath)
                  if s.isDirectory() and fs.exists(hfs.Path(s.getPath(), log)))
