"""The MERGE write path: one fenced Delta MERGE per batch (any store)."""
