"""Inspection: SQL views, the read-only check, log damage; it reads the tables and writes nothing."""
