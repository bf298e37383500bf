"""Chaos runs: the bank pipeline (``bank.py``) as two job instances under seeded, overlapping faults
(``faults.py``: driver kills and pauses, expired sessions, ZooKeeper servers and leaders killed,
operator tools), run by ``harness.py``, then checked by ``checker.py`` from the input files and
the stream tables alone; ``report.py`` prints the table. ``deltawheel chaos`` is the command
(docs/reliability.md).
"""
