"""Delta deletion vectors read without Spark: the reader lives with the log replay
(``statestore/delta/deletionvectors.py``, which the image write path also writes them with)."""

from __future__ import annotations

from ..delta.deletionvectors import deleted_rows, z85_decode

__all__ = ["deleted_rows", "z85_decode"]
