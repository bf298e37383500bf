"""Creating Delta tables by path (shared by the numbered migrations)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.exceptions import MigrationError
from deltawheel.statestore.sqltext import sql_path, sql_str

__all__ = ["sql_path", "sql_str", "create_table"]


def create_table(spark: Any, path: str, columns: str, *, partitioned_by: Sequence[str] = (),
                 properties: Mapping[str, str] = {}) -> None:
    """``CREATE TABLE IF NOT EXISTS`` a Delta table at ``path``; ``columns`` as Spark DDL."""
    _refuse_a_half_created_table(spark, path)
    sql = f"CREATE TABLE IF NOT EXISTS {sql_path(path)} ({columns}) USING DELTA"
    if partitioned_by:
        sql += " PARTITIONED BY (" + ", ".join(f"`{c}`" for c in partitioned_by) + ")"
    if properties:
        props = ", ".join(f"{sql_str(k)} = {sql_str(v)}" for k, v in properties.items())
        sql += f" TBLPROPERTIES ({props})"
    spark.sql(sql)
    _check_columns(spark, path, columns)


def _refuse_a_half_created_table(spark: Any, path: str) -> None:
    """Raise :class:`MigrationError` when ``path`` has a ``_delta_log`` folder with no commit in it
    (Delta neither creates nor reads it; a creation in flight looks the same: the user removes it)."""
    from deltawheel.statestore.delta.log import local_table_exists
    from deltawheel.statestore.delta.storefs import table_files

    if (files := table_files(spark, path)) is None:
        return  # a scheme Python does not reach: Delta's own error stands
    names = files.sub("_delta_log").listdir()  # None: no such folder (an object store lists files only)
    if names is not None and local_table_exists(files) is False:
        raise MigrationError(
            f"{path} has a _delta_log folder without any commit: a table creation that failed part way (on "
            "an object store, e.g. a Spark session without deltawheel's log store). It holds no data. If no "
            f"other migration is running, remove {path} and re-run 'deltawheel migrate --apply'")


def _check_columns(spark: Any, path: str, columns: str) -> None:
    """Raise :class:`MigrationError` if an existing table at ``path`` lacks a wanted column."""
    from pyspark.sql.types import StructType

    want = StructType.fromDDL(columns)
    assert isinstance(want, StructType)
    have = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    wrong = [f"{f.name} {f.dataType.simpleString()}" for f in want.fields
             if f.name not in have or have[f.name] != f.dataType]
    if wrong:
        raise MigrationError(f"the Delta table at {path} already exists with other columns: it lacks "
                             f"{', '.join(wrong)}. Move it away (it is not deltawheel's) and re-run the "
                             "migration")
