"""Hand-over requests: a tool asks the running owner of some intervals to give them back.

One EPHEMERAL znode per computation: a tool whose session is LOST leaves no request behind; while
SUSPENDED it stays, and the tool's commit is fenced by its lease sequencers anyway."""

from __future__ import annotations

import json
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from ..exceptions import CodecError, LeaseHeldError

__all__ = ["HANDOVER_FORMAT_VERSION", "HandoverRequest", "handover_path", "request_handover", "read_handover",
           "clear_handover"]

HANDOVER_FORMAT_VERSION = 1


def handover_path(pipeline: str, computation: str) -> str:
    """The request znode of ``computation``.

    >>> handover_path("p", "c")
    '/pipelines/p/handover/c'
    """
    return f"/pipelines/{pipeline}/handover/{computation}"


@dataclass(frozen=True, kw_only=True)
class HandoverRequest:
    """A tool's request for some intervals of one computation."""

    pipeline: str
    computation: str
    intervals: tuple[int, ...]
    tool: str
    by: str
    requested_ms: int

    def to_payload(self) -> bytes:
        """JSON for the znode (carries ``format_version``)."""
        return json.dumps({"format_version": HANDOVER_FORMAT_VERSION, "intervals": list(self.intervals),
                           "tool": self.tool, "by": self.by, "requested_ms": self.requested_ms},
                          sort_keys=True).encode()


def request_handover(client: KazooClient, *, pipeline: str, computation: str, intervals: Sequence[int],
                     tool: str, by: str) -> HandoverRequest:
    """Create the request (EPHEMERAL: it ends with ``client``'s session).
    Raises LeaseHeldError: another tool's request for the computation is open; run one tool at a time."""
    req = HandoverRequest(pipeline=pipeline, computation=computation, intervals=tuple(sorted(set(intervals))),
                          tool=tool, by=by, requested_ms=int(time.time() * 1000))
    path = handover_path(pipeline, computation)
    try:
        client.create(path, req.to_payload(), ephemeral=True, makepath=True)
    except NodeExistsError as exc:
        other = read_handover(client, pipeline, computation)
        raise LeaseHeldError(
            f"another tool is changing {pipeline}/{computation} (its hand-over request {path}"
            + (f": {other.tool} by {other.by}, intervals {list(other.intervals)}" if other else "")
            + "); wait for it to finish and run this one again") from exc
    return req


def read_handover(client: KazooClient, pipeline: str, computation: str) -> HandoverRequest | None:
    """The open request for ``computation`` (None: none).
    Raises CodecError: the znode holds something else (or a newer format)."""
    path = handover_path(pipeline, computation)
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return None
    try:
        raw = json.loads(data.decode())
        if raw.get("format_version") != HANDOVER_FORMAT_VERSION:
            raise ValueError(f"format_version {raw.get('format_version')!r}")
        return HandoverRequest(pipeline=pipeline, computation=computation,
                               intervals=tuple(int(i) for i in raw["intervals"]), tool=str(raw["tool"]),
                               by=str(raw["by"]), requested_ms=int(raw["requested_ms"]))
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise CodecError(f"the hand-over request {path} is unreadable ({exc}); delete it (it is ephemeral: it "
                         "goes with the session of the tool that made it)") from exc


def clear_handover(client: KazooClient, pipeline: str, computation: str) -> None:
    """Delete the request (gone already: nothing to do)."""
    with suppress(NoNodeError):
        client.delete(handover_path(pipeline, computation))
