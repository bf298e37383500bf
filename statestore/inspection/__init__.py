"""Inspection: SQL views (:mod:`.sqlviews`), the read-only check (:mod:`.readonly`), log damage
(:mod:`.damage`). It reads the tables and writes nothing."""
