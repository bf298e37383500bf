"""An interval's productions as one Arrow table, written to the stream tables without a Python
object per production (the columnar path's, ``columnar.py``).

:func:`production_table` turns the key loop's ``Production`` tuples into the same columns
(``PRODUCTION_COLUMNS``), so both kinds concatenate; :func:`write_production_table` writes the
files :func:`~deltawheel.statestore.writepath.image.files.write_production_files` writes for the
same productions in the same order: one Parquet file per stream, the same columns and names.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping, Sequence

from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.delta.txn import write_file
from deltawheel.statestore.writepath.image.summary import ProductionFile

__all__ = ["PRODUCTION_COLUMNS", "production_table", "write_production_table"]

# a production's columns, in ``Production``'s order
PRODUCTION_COLUMNS = ("production_id", "stream", "key", "value", "timestamp_ms", "codec")


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("production_id", pa.string()), ("stream", pa.string()), ("key", pa.string()),
                      ("value", pa.binary()), ("timestamp_ms", pa.int64()), ("codec", pa.string())])


def production_table(prods: Sequence[Any]) -> Any:
    """``prods`` (``Production`` tuples) as a table of :data:`PRODUCTION_COLUMNS`."""
    import pyarrow as pa

    cols = list(zip(*prods, strict=True)) if prods else [()] * len(PRODUCTION_COLUMNS)
    schema = _schema()
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema)


def columns_table(pid: Any, stream: Any, key: Any, value: Any, ts: Any, codec: Any) -> Any:
    """A production table from its columns (Arrow arrays)."""
    import pyarrow as pa

    schema = _schema()
    return pa.table([c.cast(f.type) for c, f in zip((pid, stream, key, value, ts, codec), schema, strict=True)],
                    schema=schema)


def write_production_table(prods: Any, *, producer: str, commit_id: str | None, iv: int,
                           roots: Mapping[str, TableFiles], schema: Any, format_version: int) -> list[ProductionFile]:
    """One stream-table Parquet file per stream of ``prods`` (a :func:`production_table`), each
    with that stream's productions in the table's order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: list[ProductionFile] = []
    if not prods.num_rows:
        return out
    streams = prods.column("stream")
    names = sorted(pc.unique(streams).to_pylist())
    for stream in names:
        ps = prods.filter(pc.equal(streams, stream)) if len(names) > 1 else prods
        n = ps.num_rows
        ts = ps.column("timestamp_ms").combine_chunks()
        table = pa.table({
            "record_id": ps.column("production_id"),
            "key": ps.column("key"),
            "value": ps.column("value"),
            "codec": ps.column("codec"),
            "timestamp_ms": ts,
            "event_time": ts.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            "producer": pa.repeat(pa.scalar(producer, pa.string()), n),
            "commit_id": pa.repeat(pa.scalar(commit_id, pa.string()), n),
            "format_version": pa.repeat(pa.scalar(format_version, pa.int32()), n),
        }).cast(schema)
        rel = f"part-{uuid.uuid4().hex}-dw-{producer}-{iv}.snappy.parquet"
        size = write_file(table, roots[stream], rel)
        out.append(ProductionFile(stream, rel, size, n, pc.min(ts).as_py()))
    return out
