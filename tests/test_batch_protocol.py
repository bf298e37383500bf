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
