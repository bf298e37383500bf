"""Group commit at a shared table: the writer holding the table's turn (``zk/turns.py``) commits the
requests queued behind it with its own in one Delta version (docs/scale.md, "Group commit").

Each writer's batch stays its own and all-or-nothing: the holder takes a request only where no commit
since that writer's read touched its partitions (the check each writer's own commit makes) and no
request before it holds one of them; the version's ``userMetadata`` lists every batch's own
(kind ``group``; :func:`.log.batch_metas` reads them), so replay, recovery and history find each batch.
Fencing is unchanged: a takeover is a claim commit touching the interval's partition, which refuses
every request that read before it, folded or not. A request the holder does not take, or whose writer
never saw it marked done, is its writer's to commit: in its own turn, where a commit already made for
it is found in the log (:func:`landed`) instead of made twice."""

from __future__ import annotations

import json
from typing import Any, Callable, ContextManager, NamedTuple, Sequence

from ..exceptions import StaleFilesError
from .log import batch_metas, user_metadata
from .txn import CommitRequest, TableLog

__all__ = ["Landed", "TurnsOf", "commit_in_turn", "group_meta", "landed"]


#: computation, request -> the turn around its commit (``RowStore.turns``)
TurnsOf = Callable[[str, bytes | None], ContextManager[Any]]


class Landed(NamedTuple):
    """Where a request's commit landed: its ``version``, and whether that version holds other writers'
    batches too (``grouped``: a writer's kept snapshot of the table cannot be advanced by its own alone)."""

    version: int
    grouped: bool


def group_meta(metas: Sequence[str]) -> str:
    """The ``userMetadata`` of a version holding the batches of ``metas`` (the holder's first)."""
    batches = [user_metadata(m) or {"userMetadata": m} for m in metas]
    first = batches[0]
    sequencers: dict[str, Any] = {}
    for b in batches:
        sequencers.update(b.get("sequencers") or {})
    return json.dumps({"deltawheel": first.get("deltawheel", 1), "kind": "group", "computation": first.get("computation"),
                       "writer": first.get("writer"), "sequencers": sequencers, "batches": batches}, sort_keys=True)


def landed(log: TableLog, request: CommitRequest) -> int | None:
    """The version after the request's read that holds its batch (by its commit id; None: none, or the
    log is not readable here)."""
    commit_id = (user_metadata(request.user_metadata) or {}).get("commit_id")
    infos = None if commit_id is None else log.commits_after(request.read_version)
    for v, info in infos or ():
        if any(b.get("commit_id") == commit_id for b in batch_metas(user_metadata(info.get("userMetadata")))):
            return v
    return None


def commit_in_turn(log: TableLog, turns: TurnsOf, computation: str, request: CommitRequest,
                   own: Callable[[], int]) -> Landed:
    """Commit ``request`` in ``computation``'s turn: ``own()`` (the writer's usual commit of it) where no
    one waits behind it, with the waiting requests in one version where some do, or not at all where a
    holder already committed it. Raises what ``own`` and :meth:`.TableLog.commit_requests` raise, but
    :class:`StaleFilesError` only where the request did not land meanwhile."""
    with turns(computation, request.to_bytes()) as turn:
        done = getattr(turn, "done", None)
        if done is not None:
            return Landed(int(done), True)
        queued = turn.waiting() if turn and hasattr(turn, "waiting") else []
        others = [(node, r) for node, data in queued if (r := CommitRequest.from_bytes(data)) is not None]
        try:
            if not others:
                return Landed(own(), False)
            seen = {node for node, _r in others}

            def more() -> list[CommitRequest]:
                # those that queued while the holder's snapshot updated join too: just served, they
                # were writing their next batch's files when the turn passed
                late = [(node, r) for node, data in turn.waiting() if node not in seen
                        and (r := CommitRequest.from_bytes(data)) is not None]
                others.extend(late)
                return [r for _n, r in late]

            version, held = log.commit_requests([request, *(r for _n, r in others)], group_meta=group_meta,
                                                more=more)
        except StaleFilesError:
            # a holder may have committed it with its own and not marked it (ZooKeeper, or a turn given up)
            found = landed(log, request)
            if found is None:
                raise
            return Landed(found, True)
        if len(held) > 1:
            turn.folded([others[i - 1][0] for i in held[1:]], version)
        return Landed(version, len(held) > 1)
