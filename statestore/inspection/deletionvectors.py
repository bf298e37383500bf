"""Delta deletion vectors read without Spark (from ``statestore/delta/deletionvectors.py``)."""

from __future__ import annotations

from ..delta.deletionvectors import deleted_rows, z85_decode

__all__ = ["deleted_rows", "z85_decode"]
