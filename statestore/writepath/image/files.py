"""The image path's state and production files: invisible until the driver's commit or delivery adds them."""

from __future__ import annotations

import re
import uuid
from typing import Any, Mapping, Sequence

from ...delta.storefs import TableFiles
from ...delta.txn import partition_file_name, write_file
from ...rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX
from .summary import ImageFile, ProductionFile

__all__ = ["write_interval_image", "write_production_files", "write_production_table", "production_table",
           "columns_table", "read_rows_file", "oldest_work", "next_processing", "is_ids_path", "ids_level",
           "IDS_FILE_TAG"]

#: the tag in a record-ids file's name (:mod:`.idsfiles`), followed by its level
IDS_FILE_TAG = "dwids"
_IDS_NAME = re.compile(rf"-{IDS_FILE_TAG}(\d+)\.")


def is_ids_path(rel: str) -> bool:
    """Whether the rows table file ``rel`` (decoded) is a record-ids file, by its name."""
    return _IDS_NAME.search(rel.rsplit("/", 1)[-1]) is not None


def ids_level(rel: str) -> int:
    """A record-ids file's compaction level (0 for any other file)."""
    m = _IDS_NAME.search(rel.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else 0


def read_rows_file(root: TableFiles, rel: str, schema: Any) -> Any:
    """One rows file in ``schema``; a column the file lacks (an older file) is read as nulls."""
    import pyarrow as pa

    if root.is_local:
        have = set(root.read_schema(rel).names)
        t = root.read_parquet(rel, columns=[n for n in schema.names if n in have])
    else:  # one read of the object: its footer and the columns
        pf = root.parquet_file(rel)
        have = set(pf.schema_arrow.names)
        t = pf.read(columns=[n for n in schema.names if n in have])
    for i, f in enumerate(schema):
        if f.name not in have:
            t = t.add_column(i, f.name, pa.nulls(t.num_rows, f.type))
    return t.select(schema.names).cast(schema)


def write_interval_image(image: Any, rows_root: TableFiles, computation: str, interval: int) -> ImageFile:
    """Write an interval's new image as a Parquet file in its partition folder (uncommitted)."""
    rel = partition_file_name(computation, interval, "dw")
    return ImageFile(rel, write_file(image, rows_root, rel), image.num_rows)


def _production_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("production_id", pa.string()), ("stream", pa.string()), ("key", pa.string()),
                      ("value", pa.binary()), ("timestamp_ms", pa.int64()), ("codec", pa.string())])


def production_table(prods: Sequence[Any]) -> Any:
    """``prods`` (``Production`` tuples) as one Arrow table of their fields, in their order."""
    import pyarrow as pa

    schema = _production_schema()
    cols = list(zip(*prods, strict=True)) if prods else [()] * len(schema)
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)], schema=schema)


def columns_table(pid: Any, stream: Any, key: Any, value: Any, ts: Any, codec: Any) -> Any:
    """A production table from its columns (Arrow arrays), typed as :func:`production_table` types them."""
    import pyarrow as pa

    schema = _production_schema()
    return pa.table([c.cast(f.type) for c, f in zip((pid, stream, key, value, ts, codec), schema, strict=True)],
                    schema=schema)


def write_production_files(prods: Sequence[Any], *, producer: str, commit_id: str | None, iv: int,
                           roots: Mapping[str, TableFiles], schema: Any, format_version: int) -> list[ProductionFile]:
    """One stream-table Parquet file per stream of ``prods`` (``Production`` tuples), not yet in the log."""
    return write_production_table(production_table(prods), producer=producer, commit_id=commit_id, iv=iv,
                                  roots=roots, schema=schema, format_version=format_version)


def write_production_table(prods: Any, *, producer: str, commit_id: str | None, iv: int,
                           roots: Mapping[str, TableFiles], schema: Any, format_version: int) -> list[ProductionFile]:
    """:func:`write_production_files` of a :func:`production_table`: one file per stream, in order."""
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
            "record_id": ps.column("production_id"), "key": ps.column("key"), "value": ps.column("value"),
            "codec": ps.column("codec"), "timestamp_ms": ts,
            "event_time": ts.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            "producer": pa.repeat(pa.scalar(producer, pa.string()), n),
            "commit_id": pa.repeat(pa.scalar(commit_id, pa.string()), n),
            "format_version": pa.repeat(pa.scalar(format_version, pa.int32()), n)}).cast(schema)
        rel = f"part-{uuid.uuid4().hex}-dw-{producer}-{iv}.snappy.parquet"
        size = write_file(table, roots[stream], rel)
        out.append(ProductionFile(stream, rel, size, n, pc.min(ts).as_py()))
    return out


def next_processing(image: Any, retention_ms: int | None = None) -> int | None:
    """The earliest processing time at which the image has work without input (None: none): a timer,
    or (given ``retention_ms``) an id or ids file leaving the dedup horizon."""
    import pyarrow.compute as pc

    first: int | None = pc.min(image.column("next_processing_timer_ms")).as_py()
    if retention_ms is not None and image.num_rows:
        is_ids = pc.starts_with(image.column("key"), IDS_KEY_PREFIX)
        inline = image.filter(pc.invert(is_ids)).column("record_ids")
        oldest = pc.min(pc.struct_field(pc.list_flatten(inline), "seen_ms")).as_py()
        if pc.any(is_ids).as_py():
            files = pc.min(image.filter(is_ids).column("updated_ms")).as_py()
            oldest = files if oldest is None else (oldest if files is None else min(oldest, files))
        if oldest is not None:
            first = oldest + retention_ms + 1 if first is None else min(first, oldest + retention_ms + 1)
    return first


def oldest_work(image: Any) -> int | None:
    """The image's oldest pending work: its earliest event-time timer or watermark hold."""
    import pyarrow.compute as pc

    user = pc.not_equal(image.column("key"), FENCE_KEY)  # the two columns only, not the whole image
    marks = [pc.min(image.column(c).filter(user)).as_py() for c in ("next_event_timer_ms", "watermark_hold_ms")]
    marks = [m for m in marks if m is not None]
    return min(marks) if marks else None
