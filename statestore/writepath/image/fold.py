"""Folding intervals' files with Delta deletion vectors into one plain Parquet file each, same rows
(read through Spark's Delta reader: ``REORG ... APPLY (PURGE)`` fails on this Spark/Delta pair)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ...delta.storefs import TableFiles
from ...delta.txn import FileEntry, TableLog, new_add, partition_file_name, write_file
from ...rowtable.frames import arrow_schema
from ...rowtable.inputfiles import no_input_entry
from ...rowtable.rows import rows_file_ddl
from ...rowtable.store import COMMIT_META_VERSION

__all__ = ["fold_intervals"]


def fold_intervals(spark: Any, log: TableLog, rows_files: TableFiles, *, name: str,
                   files: Mapping[int, Sequence[FileEntry]], version: int) -> tuple[int, dict[int, list[FileEntry]]]:
    """Replace ``name``'s intervals' live ``files`` (as of ``version``) by one file each, in one commit
    that fails if the partitions changed since; returns (its version, each interval's new file)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    ivs = sorted(files)
    schema = arrow_schema(rows_file_ddl())
    data = (spark.read.format("delta").option("versionAsOf", version).load(log.path)
            .where((F.col("computation") == name) & F.col("interval").isin(ivs)).toArrow())
    adds, new = [], {}
    for iv in ivs:
        part = data.filter(pa.compute.equal(data.column("interval"), iv)).select(schema.names).cast(schema)
        rel = partition_file_name(name, iv, "dw")
        size = write_file(part, rows_files, rel)
        add = new_add(rel, {"computation": name, "interval": str(iv)}, size, part.num_rows)
        adds.append(add)
        new[iv] = [FileEntry(path=rel, partition_values=(("computation", name), ("interval", str(iv))),
                             size=size, has_deletion_vector=False, action_json=add)]
    committed = log.commit(
        remove=[f for iv in ivs for f in files[iv]], add=adds,
        read_partitions=[f"computation = '{name}' AND interval = {iv}" for iv in ivs],
        untouched_since=(version, [{"computation": name, "interval": str(iv)} for iv in ivs]),
        user_metadata=json.dumps({"deltawheel": COMMIT_META_VERSION, "kind": "compact", "computation": name,
                                  "write_path": "image", **no_input_entry()}, sort_keys=True))
    assert committed is not None
    return committed, new
