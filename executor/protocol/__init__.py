"""The per-batch protocol of one computation (``executor.py``, ``batch.py`` and companions)."""
