"""Small Spark frames built from Python values via Arrow on the driver, without a Python worker."""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

__all__ = ["spark_type", "arrow_schema", "local_frame"]


@functools.cache
def spark_type(ddl: str) -> Any:
    """Parsed DDL, cached (parsing is a JVM round trip)."""
    from pyspark.sql.types import DataType

    return DataType.fromDDL(ddl)


@functools.cache
def arrow_schema(ddl: str) -> Any:
    """The Arrow schema Spark uses for ``ddl``, cached."""
    from pyspark.sql.pandas.types import to_arrow_schema

    # TIMESTAMP columns as UTC instants, as Spark's JVM exchanges them
    return to_arrow_schema(spark_type(ddl), timezone="UTC")


def local_frame(spark: Any, rows: Sequence[Mapping[str, Any] | Sequence[Any]], ddl: str) -> Any:
    """A DataFrame of ``rows`` (dicts by column name, or tuples in column order) typed by ``ddl``."""
    import pyarrow as pa

    schema = arrow_schema(ddl)
    if rows and not isinstance(rows[0], Mapping):
        names = schema.names
        rows = [dict(zip(names, r, strict=True)) for r in rows]
    return spark.createDataFrame(pa.Table.from_pylist(list(rows), schema=schema), schema=spark_type(ddl))
