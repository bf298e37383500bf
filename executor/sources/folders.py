"""What the file injectors know of a folder without Spark: its visible files, a Parquet file's footer."""

from __future__ import annotations

import os
from typing import Any

from deltawheel.statestore.delta.log import local_path
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import ConfigError

__all__ = ["local_folder_token", "make_local_dir"]


def local_folder_token(folder: str) -> tuple[tuple[str, int, int], ...] | None:
    """(name, size, mtime ns) of the files Spark reads from a local folder; None if remote or unreadable."""
    local = local_path(folder)
    if local is None:
        return None
    try:
        with os.scandir(local) as it:
            entries = [(e.name, e.stat()) for e in it if not e.name.startswith(("_", ".")) and e.is_file()]
    except OSError:
        return None
    return tuple(sorted((n, st.st_size, st.st_mtime_ns) for n, st in entries))


def make_local_dir(path: str) -> None:
    """Make a local folder (or ``file://`` URI) that does not exist yet; a remote one is left alone.
    ConfigError: the path exists and is not a folder, or cannot be made."""
    local = local_path(path)
    if local is None or os.path.isdir(local):
        return
    try:
        os.makedirs(local, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"input folder {path} is not a folder and cannot be made one ({exc}); point the "
                          "injector at a folder") from exc


def _local_parquet_schema(folder: str) -> Any | None:
    """A local Parquet folder's Spark schema from its first file's footer; ``None``: Spark must infer it."""
    found = _first_file_footer(folder)
    return None if found is None else _spark_schema(found[1])


def _first_file_footer(folder: str, files: TableFiles | None = None) -> tuple[str, Any] | None:
    """The name and Arrow schema of a folder's first visible Parquet file, or None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if files is not None and not files.is_local:
        try:
            names = sorted(n for n, _size, _mtime in files.list_files() or () if not n.startswith(("_", ".")))
            return (names[0], files.read_schema(names[0])) if names else None
        except (OSError, pa.ArrowException):
            return None
    local, found = local_path(folder), local_folder_token(folder)
    if local is None or not found:
        return None
    try:
        return found[0][0], pq.read_schema(os.path.join(local, found[0][0]))
    except (OSError, pa.ArrowException):
        return None


def _check_footer(injector: str, file: str, arrow: Any, schema: Any) -> None:
    """ConfigError unless every column of ``schema`` is in the file's footer, of the same type where it
    maps plainly."""
    import pyarrow as pa

    in_file = {f.name: f for f in arrow}
    problems = []
    for field in schema.fields:
        got = in_file.get(field.name)
        if got is None:
            problems.append(f"{field.name} is missing")
            continue
        spark = _spark_schema(pa.schema([got]))
        if spark is not None and spark.fields[0].dataType != field.dataType:
            problems.append(f"{field.name} is {spark.fields[0].dataType.simpleString().upper()} in the file, "
                            f"{field.dataType.simpleString().upper()} in the schema")
    if problems:
        raise ConfigError(f"injector {injector}: file {file} does not match the given schema: {'; '.join(problems)}; "
                          "fix the schema= or move the file out of the folder")


def _spark_schema(arrow: Any | None) -> Any | None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    if arrow is None:
        return None
    t = pa.types
    fields = []
    for f in arrow:
        ty = f.type
        simple = (t.is_string(ty) or t.is_binary(ty) or t.is_boolean(ty) or t.is_signed_integer(ty)
                  or t.is_float32(ty) or t.is_float64(ty) or t.is_date32(ty) or t.is_decimal128(ty)
                  or (t.is_timestamp(ty) and ty.tz is not None and ty.unit in ("ms", "us")))
        if not simple:
            return None
        fields.append(StructField(f.name, from_arrow_type(ty), True))  # file sources read every column as nullable
    return StructType(fields)
