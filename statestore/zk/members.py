"""The live job instances of a pipeline (EPHEMERAL ``members/{instance}``), the intervals each should
hold, and operator moves (PERSISTENT ``moves/{computation}``). A LOST session leaves; while SUSPENDED
an instance acts only through :class:`LeaseManager`, which refuses. docs/operations.md has the layout."""

from __future__ import annotations

import json
import time
from contextlib import suppress
from typing import Any, Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from ..exceptions import CodecError, ConfigError
from ..layout import validate_name
from .client import children

__all__ = ["MEMBER_FORMAT_VERSION", "Membership", "assign", "live_members", "member_session", "members_path",
           "request_move", "read_move",
           "clear_move", "standbys", "target", "parse_assign"]

MEMBER_FORMAT_VERSION = 1


def _members(pipeline: str) -> str:
    return f"/pipelines/{pipeline}/members"


def members_path(pipeline: str) -> str:
    """The znode whose children are ``pipeline``'s live instances (a watch on it sees each join and leave)."""
    return _members(pipeline)


def _move(pipeline: str, computation: str) -> str:
    return f"/pipelines/{pipeline}/moves/{computation}"


def assign(members: Sequence[str], num_intervals: int) -> dict[str, tuple[int, ...]]:
    """Contiguous blocks of intervals, in member-name order; sizes differ by at most one.

    >>> assign(["b", "a", "c"], 8)
    {'a': (0, 1, 2), 'b': (3, 4, 5), 'c': (6, 7)}
    >>> assign([], 4)
    {}
    """
    names = sorted(set(members))
    out: dict[str, list[int]] = {m: [] for m in names}
    for iv in range(num_intervals if names else 0):
        out[names[iv * len(names) // num_intervals]].append(iv)
    return {m: tuple(ivs) for m, ivs in out.items()}


def member_session(client: KazooClient, pipeline: str, instance: str) -> int | None:
    """The id of the ZooKeeper session holding ``instance``'s member znode (None: not a member)."""
    stat = client.exists(f"{_members(pipeline)}/{instance}")
    return None if stat is None else int(stat.ephemeralOwner)


def live_members(client: KazooClient, pipeline: str) -> list[str]:
    """The instances with a member znode (a live ZooKeeper session), sorted."""
    return children(client, _members(pipeline))


def standbys(client: KazooClient, pipeline: str, live: Sequence[str]) -> set[str]:
    """Those of the ``live`` members that joined as standbys (their member znode says so)."""
    pending = {m: client.get_async(f"{_members(pipeline)}/{m}") for m in live}
    out: set[str] = set()
    for m, res in pending.items():
        try:
            data, _ = res.get()
        except NoNodeError:
            continue  # left meanwhile
        with suppress(ValueError, AttributeError):
            if json.loads(data.decode()).get("standby") is True:
                out.add(m)
    return out


def request_move(client: KazooClient, pipeline: str, computation: str,
                 assignment: Mapping[str, Sequence[int]]) -> None:
    """Write (or replace) the operator's assignment of ``computation``'s intervals to instances."""
    payload = json.dumps({"format_version": MEMBER_FORMAT_VERSION,
                          "assign": {m: sorted(set(ivs)) for m, ivs in sorted(assignment.items())}}).encode()
    path = _move(pipeline, computation)
    try:
        client.create(path, payload, makepath=True)
    except NodeExistsError:
        client.set(path, payload)


def read_move(client: KazooClient, pipeline: str, computation: str) -> dict[str, tuple[int, ...]] | None:
    """The move request for ``computation`` (None: none).
    Raises CodecError: the znode holds something else (or a newer format)."""
    try:
        data, _ = client.get(_move(pipeline, computation))
    except NoNodeError:
        return None
    try:
        raw = json.loads(data.decode())
        if raw.get("format_version") != MEMBER_FORMAT_VERSION:
            raise ValueError(f"format_version {raw.get('format_version')!r}")
        return {str(m): tuple(int(i) for i in ivs) for m, ivs in raw["assign"].items()}
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise CodecError(f"the move request {_move(pipeline, computation)} is unreadable ({exc}); replace it "
                         "with `deltawheel rebalance` or delete it") from exc


def clear_move(client: KazooClient, pipeline: str, computation: str) -> bool:
    """Delete the move request (back to the automatic assignment); returns whether there was one."""
    try:
        client.delete(_move(pipeline, computation))
        return True
    except NoNodeError:
        return False


def target(client: KazooClient, pipeline: str, computation: str, num_intervals: int) -> dict[str, tuple[int, ...]]:
    """Who should hold which interval: a valid move request of live instances, else :func:`assign` over
    the live instances that are not standbys (over the standbys when none is left)."""
    live = live_members(client, pipeline)
    move = read_move(client, pipeline, computation)
    if move is not None and set(move) <= set(live):
        named = [iv for ivs in move.values() for iv in ivs]
        if len(named) == len(set(named)) and all(0 <= iv < num_intervals for iv in named):
            return {m: move.get(m, ()) for m in live}
    spare = standbys(client, pipeline, live)
    return {**{m: () for m in spare}, **assign([m for m in live if m not in spare] or live, num_intervals)}


class Membership:
    """This instance's member znode; a join replaces one of the same name of another session."""

    def __init__(self, client: KazooClient, *, pipeline: str, instance: str, acls: Any = None,
                 standby: bool = False) -> None:
        validate_name("instance", instance)
        self.client, self.pipeline, self.instance, self.acls = client, pipeline, instance, acls
        self.standby = standby  # it holds intervals only while no other kind of member is live
        self.replaced = False

    @property
    def path(self) -> str:
        """This instance's member znode."""
        return f"{_members(self.pipeline)}/{self.instance}"

    def join(self) -> None:
        """Create the member znode (EPHEMERAL), replacing one of the same name of another session."""
        payload = json.dumps({"format_version": MEMBER_FORMAT_VERSION, "instance": self.instance,
                              "joined_ms": int(time.time() * 1000), **({"standby": True} if self.standby else {})
                              }).encode()
        while True:
            with suppress(NodeExistsError):
                self.client.create(self.path, payload, ephemeral=True, makepath=True, acl=self.acls)
                return
            stat = self.client.exists(self.path)
            if stat is None:
                continue
            if stat.ephemeralOwner == self.client.client_id[0]:
                return
            tx = self.client.transaction()
            tx.delete(self.path, version=stat.version)
            tx.create(self.path, payload, ephemeral=True, acl=self.acls)
            if not any(isinstance(r, Exception) for r in tx.commit()):
                self.replaced = True
                return

    def leave(self) -> None:
        """Delete the member znode (gone already: nothing to do)."""
        with suppress(NoNodeError):
            self.client.delete(self.path)


def parse_assign(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``["a=0,1", "b=2-4"]`` -> ``{"a": (0, 1), "b": (2, 3, 4)}``.
    Raises ConfigError: an item that is not ``INSTANCE=I[,J-K...]``, or an interval named twice.

    >>> parse_assign(["a=0,1", "b=2-4"])
    {'a': (0, 1), 'b': (2, 3, 4)}
    """
    out: dict[str, tuple[int, ...]] = {}
    seen: set[int] = set()
    for item in items:
        name, sep, spec = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            ivs: list[int] = []
            for part in filter(None, spec.split(",")):
                lo, _, hi = part.partition("-")
                ivs += range(int(lo), int(hi or lo) + 1)
        except ValueError:
            raise ConfigError(f"--assign {item!r}: write INSTANCE=I,J-K (e.g. a=0,1 b=2-3)") from None
        if seen & set(ivs):
            raise ConfigError(f"--assign: intervals {sorted(seen & set(ivs))} are given to two instances; "
                                  "give each interval to one instance")
        seen |= set(ivs)
        out[name] = out.get(name, ()) + tuple(ivs)
    return out
