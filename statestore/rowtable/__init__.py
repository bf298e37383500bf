"""The rows table (one row per key): the row schema, fence rows, Arrow frames of rows, the
row store behind the MERGE path, the recovery scan, dedup ids with their Bloom filter, and
the window-aware row cache.
"""
