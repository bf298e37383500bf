"""A Delta table's first commit written from Python on a local store.

:func:`create_local_table` writes the commit Delta's ``CREATE TABLE`` writes for a new table
(commit info, metadata with the schema and properties, protocol 1/2) and the checksum file beside
it, in ~1 ms instead of a Spark statement (0.1-0.3 s; 1 s and more of JVM work on a loaded machine).
The stream tables (``writepath/streams.py``) and the metrics table (``executor/protocol/metrics.py``)
are made this way; ``tests/test_stream_tables.py`` and ``tests/test_metrics_table.py`` compare
the result with Spark's ``CREATE TABLE``'s.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Mapping

__all__ = ["create_local_table", "spark_type_json"]

#: session settings that change what Delta's CREATE TABLE writes (table property defaults, the
#: protocol): with one set, a table is made through Spark, so that it gets them
DELTA_TABLE_DEFAULTS = ("spark.databricks.delta.properties.defaults.", "spark.databricks.delta.protocol.")

_SIMPLE = {"STRING": "string", "BINARY": "binary", "BIGINT": "long", "TIMESTAMP": "timestamp", "INT": "integer",
           "DOUBLE": "double", "BOOLEAN": "boolean"}


def spark_type_json(ddl_type: str) -> Any:
    """A Spark SQL column type of a DDL string as Delta's schema JSON holds it (the flat types and
    ``MAP<k, v>`` of them).

    >>> spark_type_json("BIGINT"), spark_type_json("MAP<STRING, DOUBLE>")
    ('long', {'type': 'map', 'keyType': 'string', 'valueType': 'double', 'valueContainsNull': True})
    """
    t = ddl_type.strip().upper()
    if t.startswith("MAP<") and t.endswith(">"):
        k, v = (x.strip() for x in t[4:-1].split(",", 1))
        return {"type": "map", "keyType": spark_type_json(k), "valueType": spark_type_json(v), "valueContainsNull": True}
    return _SIMPLE[t]


def create_local_table(spark: Any, folder: str, *, schema_json: str, properties: Mapping[str, str]) -> bool:
    """Write the first commit of a Delta table in the local ``folder``, as Delta's ``CREATE TABLE``
    writes it: ``schema_json`` (Delta's ``schemaString``), ``properties`` (its ``TBLPROPERTIES``),
    protocol 1/2, and the checksum file. Put-if-absent (``os.link`` fails if the commit exists): a
    table another writer made first is left as it is. False (nothing written): the session sets
    defaults that change what Delta writes for a new table (then Spark makes it)."""
    conf = spark.conf.getAll
    if any(k.startswith(DELTA_TABLE_DEFAULTS) for k in conf):
        return False
    props = dict(properties)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "operationParameters": {
            "partitionBy": "[]", "clusterBy": "[]", "description": None, "isManaged": "false",
            "properties": json.dumps(props, separators=(",", ":"))},
            "isolationLevel": "Serializable", "isBlindAppend": True, "operationMetrics": {},
            "engineInfo": "deltawheel", "txnId": str(uuid.uuid4())}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_json, "partitionColumns": [], "configuration": props,
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
