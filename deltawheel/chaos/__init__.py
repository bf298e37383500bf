"""Chaos runs (``deltawheel chaos``, docs/reliability.md): the bank pipeline (``bank.py``) under seeded
faults (``faults.py``), run by ``harness.py``, checked by ``checker.py``, reported by ``report.py``."""
