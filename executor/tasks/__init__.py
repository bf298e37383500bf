"""Steps 2-4 of the per-batch protocol as Spark jobs: ``image/`` and ``merge/`` write paths."""
