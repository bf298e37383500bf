"""Classifying MERGE failures: only the raised stale-sequencer error is stale (no Spark needed)."""

from __future__ import annotations

from deltawheel.statestore.exceptions import CommitConflictError, StaleSequencerError
from deltawheel.statestore.rowtable.fencing import STALE_MARKER, merge_sql, translate_commit_error


def test_raised_marker_is_stale_quoted_marker_is_not() -> None:
    raised = Exception(f"[USER_RAISED_EXCEPTION] {STALE_MARKER} computation=c interval=3 current=9 ours=4 SQLSTATE")
    err = translate_commit_error(raised, sequencers={3: 4})
    assert isinstance(err, StaleSequencerError) and "interval 3 is owned under sequencer 9" in str(err)
    # an analysis error quotes the statement (marker included) but is not a stale sequencer
    quoted = Exception("[TABLE_OR_VIEW_NOT_FOUND] ... " + merge_sql("/p", "v", computation="c", intervals=[3]))
    assert translate_commit_error(quoted, sequencers={3: 4}) is None


def test_delta_conflicts_are_retryable_conflicts() -> None:
    exc = Exception("An error occurred: io.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT_APPEND] "
                    "Files were added to partition [interval=3]")
    err = translate_commit_error(exc, sequencers={})
    assert isinstance(err, CommitConflictError) and "ConcurrentAppendException" in str(err)
    assert translate_commit_error(Exception("disk full"), sequencers={}) is None


def test_merge_names_partitions_literally() -> None:
    sql = merge_sql("/store/rows", "src", computation="o'k", intervals=[2, 1, 2])
    assert "t.computation = 'o''k' AND t.interval IN (1,2)" in sql
    first_clause = sql.split("WHEN MATCHED AND s._op")[0]
    assert ("WHEN MATCHED AND t.sequencer > s.sequencer THEN UPDATE SET t.sequencer = "
            f"CAST(raise_error(concat('{STALE_MARKER} computation=") in first_clause
