"""The batch protocol's retry of steps 3-5 on a stale view (``executor/protocol/batch.py``).

``retry_stale_view`` is a pure loop over plain callables: no Spark, no ZooKeeper. The whole
protocol, stale views by another writer included, runs in tests/test_executor.py.
"""

from __future__ import annotations

import pytest
from deltawheel.executor.protocol.batch import STALE_VIEW_ATTEMPTS, retry_stale_view
from deltawheel.executor.protocol.faults import BatchFailedError
from deltawheel.statestore.exceptions import StaleSequencerError, StaleViewError


def test_a_stale_view_is_reloaded_and_the_steps_run_again() -> None:
    calls: list[str] = []

    def attempt() -> str:
        calls.append("attempt")
        if calls.count("attempt") < STALE_VIEW_ATTEMPTS:
            raise StaleViewError("someone else committed to the partitions")
        return "committed"

    assert retry_stale_view(attempt, reload=lambda: calls.append("reload"), attempts=STALE_VIEW_ATTEMPTS,
                            failed="unused") == "committed"
    assert calls == ["attempt", "reload"] * (STALE_VIEW_ATTEMPTS - 1) + ["attempt"]


def test_a_view_stale_at_every_attempt_fails_the_batch_typed() -> None:
    calls: list[str] = []

    def attempt() -> str:
        calls.append("attempt")
        raise StaleViewError("someone else committed to the partitions")

    with pytest.raises(BatchFailedError, match="c batch 7: the interval images kept changing"):
        retry_stale_view(attempt, reload=lambda: calls.append("reload"), attempts=STALE_VIEW_ATTEMPTS,
                         failed="c batch 7: the interval images kept changing under this writer")
    assert calls == ["attempt", "reload"] * STALE_VIEW_ATTEMPTS  # every stale view reloaded, takeover or not


def test_a_takeover_found_by_the_reload_ends_the_retry() -> None:
    calls: list[str] = []

    def attempt() -> str:
        calls.append("attempt")
        raise StaleViewError("someone else committed to the partitions")

    def reload() -> None:
        raise StaleSequencerError("fenced out by a newer owner")

    with pytest.raises(StaleSequencerError, match="fenced out"):
        retry_stale_view(attempt, reload=reload, attempts=STALE_VIEW_ATTEMPTS, failed="unused")
    assert calls == ["attempt"]


def test_other_errors_are_not_retried() -> None:
    calls: list[str] = []

    def attempt() -> str:
        calls.append("attempt")
        raise BatchFailedError("user code failed")

    with pytest.raises(BatchFailedError, match="user code failed"):
        retry_stale_view(attempt, reload=lambda: calls.append("reload"), attempts=STALE_VIEW_ATTEMPTS,
                         failed="unused")
    assert calls == ["attempt"]


def test_a_batch_moves_through_its_statuses_in_order_only() -> None:
    from deltawheel.executor.protocol.batch import BatchState, BatchStatus
    from deltawheel.executor.protocol.lateness import ActedMark

    def fresh() -> BatchState:
        return BatchState(batch_id=7, df=None, started=0.0, now=0, wm_in=None, wm_late=None,
                          acted=ActedMark(batch_id=None, late_ms=None, input_ms=None, intervals=()), horizon=None, commit_id="c:7:0", strong=False)

    b = fresh()
    for to in (BatchStatus.PREPARED, BatchStatus.COMMITTED, BatchStatus.DELIVERED):
        b.advance(to)
        assert b.status is to
    with pytest.raises(RuntimeError, match=r"batch 7: committed after delivered: the protocol's steps ran out of order"):
        b.advance(BatchStatus.COMMITTED)
    b = fresh()
    with pytest.raises(RuntimeError, match="batch 7: committed after started"):
        b.advance(BatchStatus.COMMITTED)  # a commit before its input was prepared
    b.advance(BatchStatus.FAILED)
    with pytest.raises(RuntimeError, match="failed after failed"):
        b.advance(BatchStatus.FAILED)
