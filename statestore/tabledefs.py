"""The columns (Spark DDL) of the store's side tables: ``dead_letters``, ``late_data`` and ``audit``."""

from __future__ import annotations

__all__ = ["DEAD_LETTERS_COLUMNS", "LATE_DATA_COLUMNS", "AUDIT_COLUMNS"]

DEAD_LETTERS_COLUMNS = ("computation STRING, stream STRING, record_id STRING, key STRING, raw_value BINARY, "
                        "error STRING, source_position STRING, event_time_ms BIGINT, batch_id BIGINT, "
                        "recorded_ms BIGINT, format_version INT")
LATE_DATA_COLUMNS = ("computation STRING, stream STRING, record_id STRING, key STRING, value BINARY, "
                     "codec STRING, event_time_ms BIGINT, watermark_ms BIGINT, reason STRING, "
                     "batch_id BIGINT, recorded_ms BIGINT, format_version INT")
AUDIT_COLUMNS = ("audit_id STRING, recorded_ms BIGINT, who STRING, tool STRING, pipeline STRING, computation STRING, "
                 "source STRING, intervals ARRAY<INT>, rows_upserted BIGINT, rows_deleted BIGINT, rows_changed BIGINT, "
                 "commit_version BIGINT, sequencers STRING, detail STRING, format_version INT")
