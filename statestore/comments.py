"""Column comments: what every column of the store's tables and SQL views means.

Tables carry them as Delta column metadata; views inherit them or name theirs (:func:`view_columns`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .sqltext import sql_path, sql_str

__all__ = ["ROWS", "STREAM", "DEAD_LETTERS", "LATE_DATA", "VIEWS", "VALUE_JSON", "comment_table",
           "view_columns", "describe"]

ROWS: Mapping[str, str] = {
    "computation": "the computation this row belongs to (partition column)",
    "interval": "key interval: crc32(key) mod num_intervals; the unit of leases and fencing (partition column)",
    "key": "the key (one row per computation and key)",
    "state": "the key's user state, encoded by codec (see the state view's state_json)",
    "codec": "codec of state: json, msgpack, or pickle (decoded only with --allow-pickle)",
    "timers": "the key's pending timers: tag, domain (event_time/processing_time), time_ms",
    "next_event_timer_ms": "earliest event-time timer of the key, ms since the epoch (pruned scans of due keys)",
    "next_processing_timer_ms": "earliest processing-time timer of the key, ms since the epoch",
    "record_ids": "ids of input records already processed (exactly-once dedup), kept for dedup_retention",
    "pending": "productions checkpointed by the row's last commit; cleared by the interval's next commit "
               "once delivered, so a stopped pipeline keeps its last batch's delivered productions here",
    "watermark_hold_ms": "holds the computation's low watermark back to this time (ms since the epoch)",
    "sequencer": "the last writer's lease sequencer (fencing: a stale one cannot commit)",
    "commit_id": "id of the commit that wrote this row",
    "updated_ms": "when the row was last written, ms since the epoch (processing time)",
    "format_version": "row format version (migrations are keyed by it)",
    "timer_seq": "the key's timer firing counter: timer productions take unique record ids from it",
}

STREAM: Mapping[str, str] = {
    "record_id": "the record's unique id (its producer's production id; consumers dedup on it)",
    "key": "the record's key",
    "value": "the record's value, encoded by codec (see the <stream>_decoded view's value_json)",
    "codec": "codec of value: json, msgpack or pickle",
    "timestamp_ms": "the record's event time, ms since the epoch",
    "event_time": "the record's event time as a timestamp (sources that carry one)",
    "producer": "the computation (or source) that produced the record",
    "commit_id": "the producer's rows commit whose productions this record is one of",
    "format_version": "stream record format version",
}

DEAD_LETTERS: Mapping[str, str] = {
    "computation": "the computation that could not process the record",
    "stream": "the input stream the record came from",
    "record_id": "the record's id, when it had one",
    "key": "the record's key, when one could be extracted",
    "raw_value": "the record's value as it came in (bytes; malformed input keeps its original text)",
    "error": "why it could not be processed (the error's type and message)",
    "source_position": "where the record was in its source (e.g. file and offset), when known",
    "event_time_ms": "the record's event time, ms since the epoch, when it had one",
    "batch_id": "the Spark micro-batch that met the record",
    "recorded_ms": "when it was recorded here, ms since the epoch",
    "format_version": "dead-letter format version",
}

LATE_DATA: Mapping[str, str] = {
    "computation": "the computation the late record was for (LatePolicy.ROUTE)",
    "stream": "the input stream the record came from",
    "record_id": "the record's id",
    "key": "the record's key",
    "value": "the record's value, encoded by codec",
    "codec": "codec of value",
    "event_time_ms": "the record's event time, ms since the epoch",
    "watermark_ms": "the watermark it was judged late against (behind it: late)",
    "reason": "why it was routed here",
    "batch_id": "the Spark micro-batch that met the record",
    "recorded_ms": "when it was recorded here, ms since the epoch",
    "format_version": "late-data format version",
}

VALUE_JSON = "value decoded by its codec, as JSON text (<pickle: N bytes> unless --allow-pickle)"

# the derived views: every column, in the order the view's SELECT gives them
VIEWS: Mapping[str, Mapping[str, str]] = {
    "state": {
        **{c: ROWS[c] for c in ("computation", "interval", "key", "codec")},
        "state_json": "the key's state decoded by its codec, as JSON text "
                      "(<pickle: N bytes> unless --allow-pickle)",
        "next_event_timer": "earliest event-time timer of the key",
        "next_processing_timer": "earliest processing-time timer of the key",
        "n_timers": "number of pending timers of the key (the timers view lists them)",
        "n_record_ids": "number of input record ids the store holds for the key's dedup: in its row and in "
                        "its interval's ids files (the image path)",
        "n_checkpointed": "productions checkpointed by the row's last commit, delivered or not: not data at risk. "
                          "A commit clears the previous batch's (delivered by then), so a stopped pipeline "
                          "shows its last batch's here; 'deltawheel recover' counts those not in their stream",
        "watermark_hold": "holds the computation's low watermark back to this time",
        **{c: ROWS[c] for c in ("sequencer", "commit_id")},
        "updated": "when the row was last written (processing time)",
    },
    "timers": {
        **{c: ROWS[c] for c in ("computation", "key")},
        "tag": "the timer's tag (set_timer's name for it)",
        "domain": "event_time (fires when the low watermark passes) or processing_time (wall clock)",
        "fire_time": "when the timer fires",
        "time_ms": "when the timer fires, ms since the epoch",
    },
    "pending_productions": {
        "computation": ROWS["computation"],
        "key": "the producing key",
        "production_id": "the production's id (its record_id in the stream table)",
        "stream": "the stream it goes to",
        "out_key": "the produced record's key",
        "value_json": VALUE_JSON,
        "timestamp": "the produced record's event time",
    },
    "fences": {
        **{c: ROWS[c] for c in ("computation", "interval")},
        "sequencer": "the sequencer of the interval's current owner: commits carrying an older one are refused",
        "commit_id": "the commit that last wrote the fence",
    },
    "state_history": {
        "computation": ROWS["computation"],
        "interval": "the key interval of the row (NULL for a delete)",
        "key": ROWS["key"],
        "version": "the rows table's version whose commit wrote this row (Delta's time travel: VERSION AS OF)",
        "commit_time": "when that version was committed, as Delta's time travel orders them (TIMESTAMP AS OF)",
        "change": "insert (the key had no row), update, or delete (state and timers emptied: the row went)",
        "writer": "the job instance that committed the version (NULL: not a deltawheel commit)",
        "kind": "deltawheel's commit kind (commit, fence, claim) or Delta's operation",
        "codec": ROWS["codec"],
        "state_json": "the key's state in that version, decoded by its codec, as JSON text "
                      "(<pickle: N bytes> unless --allow-pickle; NULL for a delete)",
        "n_timers": "number of pending timers of the key in that version",
        "timers": "the key's timers in that version: tag, domain, time_ms",
        "n_record_ids": "number of input record ids the store held for the key's dedup at that version, in its "
                        "row and in its interval's ids files (a delete too: the ids stay); later drops of ids "
                        "files past the dedup horizon show in the state view, not here",
        "n_checkpointed": "productions checkpointed in that version's row",
        "watermark_hold": "the key's watermark hold in that version",
        **{c: ROWS[c] for c in ("sequencer", "commit_id")},
        "updated": "when the row was written (processing time)",
    },
}


def comment_table(spark: Any, path: str, comments: Mapping[str, str]) -> int:
    """Set the differing comments of the table at ``path`` in one commit (if any); how many were set."""
    fields = spark.read.format("delta").load(path).schema.fields
    todo = [(f.name, comments[f.name]) for f in fields
            if f.name in comments and f.metadata.get("comment") != comments[f.name]]
    if todo:
        spark.sql(f"ALTER TABLE {sql_path(path)} ALTER COLUMN "
                  + ", ".join(f"`{name}` COMMENT {sql_str(text)}" for name, text in todo))
    return len(todo)


def view_columns(columns: Sequence[str], comments: Mapping[str, str]) -> str:
    """The column list of a ``CREATE VIEW name (...)`` naming ``columns`` with their comments.

    >>> view_columns(["a", "b"], {"a": "the a"})
    "(`a` COMMENT 'the a', `b`)"
    """
    return "(" + ", ".join(f"`{c}` COMMENT {sql_str(comments[c])}" if comments.get(c) else f"`{c}`"
                           for c in columns) + ")"


def describe(spark: Any, name: str) -> list[tuple[str, str, str]]:
    """(column, type, comment) of table or view ``name`` ("" where it has no comment)."""
    return [(f.name, f.dataType.simpleString(), str(f.metadata.get("comment") or ""))
            for f in spark.table(name).schema.fields]
