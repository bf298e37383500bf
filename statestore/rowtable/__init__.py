"""The rows table (one row per key): the row schema, fence rows, Arrow frames of rows, the
row store behind the MERGE path, the recovery scan, the Bloom filters of dedup ids.
"""
