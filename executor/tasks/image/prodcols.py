"""An interval's productions as one Arrow table, written to the stream tables without a Python
object per production (the columnar path's, ``columnar.py``).

The table and its writer are the image write path's (``statestore/writepath/image/files.py``:
:func:`production_table` turns the key loop's ``Production`` tuples into the same columns, so both
kinds concatenate; :func:`write_production_table` writes the files ``write_production_files``
writes for the same productions); :func:`columns_table` builds one from Arrow columns.
"""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.writepath.image.files import production_table, write_production_table

__all__ = ["PRODUCTION_COLUMNS", "columns_table", "production_table", "write_production_table"]

# a production's columns, in ``Production``'s order
PRODUCTION_COLUMNS = ("production_id", "stream", "key", "value", "timestamp_ms", "codec")


def columns_table(pid: Any, stream: Any, key: Any, value: Any, ts: Any, codec: Any) -> Any:
    """A production table from its columns (Arrow arrays), as :func:`production_table` types them."""
    import pyarrow as pa

    schema = production_table([]).schema
    return pa.table([c.cast(f.type) for c, f in zip((pid, stream, key, value, ts, codec), schema, strict=True)],
                    schema=schema)
