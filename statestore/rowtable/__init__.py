"""The rows table (one row per key): schema, fence rows, frames, the row store, recovery, Bloom filters."""
