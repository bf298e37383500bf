"""Inspection, read-only: the SQL views over every table of the store (:mod:`.sqlviews`), the
check that a SQL statement only reads (:mod:`.readonly`) and the damage check of the store's
Delta logs at start (:mod:`.damage`). Above the rows table and the write paths, whose tables it
reads; it writes nothing.
"""
