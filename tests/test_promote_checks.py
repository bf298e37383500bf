"""The proof a promotion makes before its commit (``executor/drivers/promote_checks.py``): the replay
re-ran every live commit that changes user rows of the promoted intervals up to the version it
replaces, or the promotion is refused naming the versions. Pure: commit records built by hand."""

from __future__ import annotations

from typing import Any

import pytest
from deltawheel.executor.drivers.promote_checks import behind, prove_caught_up
from deltawheel.statestore.exceptions import ReplayBehindError
from deltawheel.statestore.inspection.positions import ComputationCommit
from deltawheel.statestore.rowtable.inputfiles import commit_entry, no_input_entry


def _commit(version: int, kind: str = "commit", meta: dict[str, Any] | None = None,
            files: tuple[str, ...] = ("f",)) -> ComputationCommit:
    meta = commit_entry(version, files) if meta is None else meta
    pos = meta.get("positions")
    return ComputationCommit(version=version, timestamp_ms=0, kind=kind,
                             batch_id=None if pos is None else pos["batch_id"],
                             files=None if pos is None else tuple(pos["files"]), input_ms=None, late_ms=None,
                             meta=meta)


# seed 3; batches 5, 8 (8 read no input: a timers-only batch, as a graceful stop's flush);
# a claim at 4, a promotion at 6 (tools' commits are never re-run)
COMMITS = [_commit(3), _commit(4, "claim", {}), _commit(5), _commit(6, "promote", no_input_entry()),
           _commit(8, files=())]


def _prove(marker: dict[str, Any], commits: list[ComputationCommit] = COMMITS, **kw: Any) -> None:
    prove_caught_up(commits, marker, into="/shadow", computation="balance", num_intervals=4, **kw)


def test_a_replay_that_ran_every_live_batch_since_its_seed_is_proven() -> None:
    _prove({"from_version": 3, "ran": [5, 8]})
    _prove({"from_version": 5, "ran": [8]})
    _prove({"from_version": 3, "ran": [5]}, upto=7)  # the version it replaces is before batch 8


def test_a_live_batch_the_replay_did_not_rerun_is_refused_naming_it() -> None:
    with pytest.raises(ReplayBehindError, match=r"has not run 1 live commits of balance up to rows version 8, "
                                                r"the state it would replace: 8 \(batch 8, without input: not "
                                                r"re-run by the replay\).*continue the replay into /shadow"):
        _prove({"from_version": 3, "ran": [5]})


def test_a_commit_without_input_positions_is_refused() -> None:
    commits = [*COMMITS, _commit(9, meta={})]
    with pytest.raises(ReplayBehindError, match=r"9 \(kind commit: records no input positions\).*cannot be "
                                                r"replayed: replay from the newest such version"):
        _prove({"from_version": 3, "ran": [5, 8]}, commits)


def test_an_older_marker_without_the_versions_it_ran_is_refused() -> None:
    with pytest.raises(ReplayBehindError, match=r"has not run 2 live commits .*made by an older deltawheel"):
        _prove({"from_version": 3})


def test_many_missing_versions_are_named_up_to_five_and_counted() -> None:
    commits = [_commit(v) for v in range(10, 18)]
    with pytest.raises(ReplayBehindError, match=r"has not run 8 live commits .*: 10 .*; 14 \(batch 14: not "
                                                r"re-run by the replay\); and 3 more"):
        _prove({"from_version": 9, "ran": []}, commits)


def test_behind_is_what_a_catch_up_still_runs() -> None:
    assert [c.version for c in behind(COMMITS, 5)] == [8]
    assert [c.version for c in behind(COMMITS, 3)] == [5, 8]
