"""Turns at a shared rows table's commits: the instances sharing a computation's intervals queue for
its commits (EPHEMERAL_SEQUENTIAL znodes under ``/pipelines/{pipeline}/turns/{computation}``, the
lowest holds the turn) instead of racing for Delta's next version, which starves the losers
(docs/scale.md, "Taking turns").

Only an arbiter of speed, never of safety: a writer that gets no turn commits without one, and
Delta's conflict check and the fence rows still refuse whatever they refuse. No turn comes when
ZooKeeper does not answer, or when one holder keeps the turn past ``hold_s`` (killed while it held
it: its znode goes when its session expires); then this writer's commits go on without turns,
waiting for none, until that holder's znode is gone. A turn covers the Delta commit alone.

Group commit: a writer may queue with its commit's request as its znode's data. The holder reads the
requests queued behind it (:meth:`Turn.waiting`), commits those it accepts with its own in one
version (``delta/group.py``) and marks each as done at that version (:meth:`Turn.folded`, before it
hands the turn on); a waiter marked done does not commit. What is not marked done is committed by its
own writer in its own turn, so a holder that dies or refuses leaves nothing undone."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from typing import Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from ..layout import validate_name

__all__ = ["CommitTurns", "Turn", "turns_path"]

_ERRORS = (KazooException, KazooTimeoutError)
_LOOK_S = 0.5  # a waiting writer looks at who holds the turn at least this often
_REQUEST = b"R"  # a znode's data: this, then a request a holder may commit (``Turn.waiting``)
_DONE = b"D"  # ... or this, then the version a holder committed that request in
_MAX_REQUEST = 256 * 1024  # a larger request is not offered: its writer commits it itself
_ASK_S = 10.0  # the longest wait for one answer of ZooKeeper's to a holder's reads and marks


def turns_path(pipeline: str, computation: str) -> str:
    """The znode under which ``computation``'s writers queue for their turns."""
    return f"/pipelines/{pipeline}/turns/{validate_name('computation', computation)}"


def _seq(name: str) -> str:
    return name[-10:]  # ZooKeeper's sequence suffix


class Turn:
    """What :meth:`CommitTurns.turn` yields: true while this writer holds the turn. ``done``: the version
    a holder committed this writer's request in (then it holds no turn and commits nothing)."""

    def __init__(self, owner: CommitTurns | None = None, node: str | None = None, done: int | None = None) -> None:
        self._owner, self.node, self.done = owner, node, done

    def __bool__(self) -> bool:
        return self.node is not None and self.done is None

    def waiting(self, limit: int = 64) -> list[tuple[str, bytes]]:
        """(znode, request) of up to ``limit`` writers queued behind this holder with a request, in queue
        order ([] without the turn, or when ZooKeeper does not answer: each commits its own)."""
        if not self or self._owner is None or self.node is None:
            return []
        parent, name = self.node.rsplit("/", 1)
        client = self._owner.client
        try:
            behind = sorted((k for k in client.get_children(parent) if _seq(k) > _seq(name)), key=_seq)[:limit]
            asked = [(f"{parent}/{kid}", client.get_async(f"{parent}/{kid}")) for kid in behind]  # one round trip
            out = []
            for node, answer in asked:
                try:
                    data, _stat = answer.get(timeout=_ASK_S)
                except NoNodeError:
                    continue
                if data.startswith(_REQUEST):
                    out.append((node, bytes(data[len(_REQUEST):])))
            return out
        except _ERRORS:
            return []

    def folded(self, nodes: list[str], version: int) -> list[str]:
        """Mark the requests of ``nodes`` committed in ``version`` (before the turn is handed on); returns
        those not marked (ZooKeeper did not answer, or the waiter left): their writers find their commit
        in the log themselves (``delta/group.py``)."""
        assert self._owner is not None
        mark = _DONE + str(int(version)).encode()
        asked = [(node, self._owner.client.set_async(node, mark)) for node in nodes]
        missed = []
        for node, answer in asked:
            try:
                answer.get(timeout=_ASK_S)
            except (NoNodeError, *_ERRORS):
                missed.append(node)
        self._owner.folded += len(nodes) - len(missed)
        return missed


class CommitTurns:
    """One writer's turns at its computations' commits; ``turn(computation, request)`` is a context
    manager yielding a :class:`Turn`. Threads of one writer take theirs one at a time."""

    def __init__(self, client: KazooClient, *, pipeline: str, writer: str, hold_s: float = 5.0,
                 acls: object = None) -> None:
        self.client, self.pipeline, self.writer, self.hold_s, self.acls = client, pipeline, writer, hold_s, acls
        self._local: dict[str, threading.Lock] = {}
        self._stuck: dict[str, str] = {}  # computation -> the holder's znode taken as stuck
        self._orphans: list[str] = []  # own znodes whose removal failed: removed at the next turn
        self._guard = threading.Lock()
        self.taken = 0  # turns taken
        self.skipped = 0  # commits made without a turn
        self.folded = 0  # others' requests this writer committed with its own
        self.served = 0  # own requests another holder committed

    @contextlib.contextmanager
    def turn(self, computation: str, request: bytes | None = None) -> Iterator[Turn]:
        """Hold ``computation``'s turn for the block; the :class:`Turn` is false where it goes on without
        one, or where a holder committed ``request`` (``done``)."""
        with self._guard:
            local = self._local.setdefault(computation, threading.Lock())
        with local:
            got = Turn()
            try:
                got = self._queue(computation, request)
            except _ERRORS as exc:
                self._say(computation, f"committing without a turn ({type(exc).__name__}: {exc}); Delta's "
                          "conflict check still guards the commit")
            self.served += got.done is not None
            self.taken += bool(got)
            self.skipped += got.node is None
            try:
                yield got
            finally:
                if got.node is not None:
                    self._remove(got.node)

    def _queue(self, computation: str, request: bytes | None) -> Turn:
        """Queue and wait for the turn (a turn without a node: a stuck holder, no turn)."""
        path = turns_path(self.pipeline, computation)
        for orphan in list(self._orphans):
            self._remove(orphan)
        kids = self._children(path)
        stuck = self._stuck.get(computation)
        if stuck is not None:
            if stuck in kids:
                return Turn()  # its holder's session has not expired yet: no wait
            del self._stuck[computation]
        prefix = f"{uuid.uuid4().hex}-"
        data = _REQUEST + request if request is not None and len(request) < _MAX_REQUEST else self.writer.encode()
        try:
            mine = self.client.create(f"{path}/{prefix}", data, ephemeral=True, sequence=True, acl=self.acls)
        except _ERRORS:
            self._orphans += [f"{path}/{k}" for k in self._children(path) if k.startswith(prefix)]
            raise
        try:
            return self._wait(computation, path, mine)
        except BaseException:
            self._remove(mine)
            raise

    def _wait(self, computation: str, path: str, mine: str) -> Turn:
        name = mine.rsplit("/", 1)[1]
        head, since = None, time.monotonic()
        moved = threading.Event()
        while True:
            kids = sorted(self._children(path), key=_seq)
            if name not in kids:  # gone with a session that expired meanwhile
                return Turn()
            # read after the children: a holder marks its folded requests before it hands the turn on
            done = self._done(mine, moved if kids[0] != name else None)
            if done is not None:
                return Turn(self, mine, done)
            if kids[0] == name:
                return Turn(self, mine)
            if kids[0] != head:
                head, since = kids[0], time.monotonic()
            elif time.monotonic() - since > self.hold_s:
                self._stuck[computation] = str(head)
                self._remove(mine)
                self._say(computation, f"the commit turn held by {head} for over {self.hold_s:g} s: committing "
                          "without turns until its holder's session ends")
                return Turn()
            ahead = [k for k in kids if _seq(k) < _seq(name)]
            if ahead and self.client.exists(f"{path}/{ahead[-1]}", watch=lambda _e, m=moved: m.set()) is not None:
                moved.wait(_LOOK_S)
            moved.clear()

    def _done(self, node: str, wake: threading.Event | None) -> int | None:
        """The version a holder committed this znode's request in (None: not committed by one); ``wake``
        is set when its data changes."""
        try:
            data, _stat = self.client.get(node, watch=None if wake is None else (lambda _e: wake.set()))
        except NoNodeError:
            return None
        return int(data[len(_DONE):]) if data.startswith(_DONE) else None

    def _children(self, path: str) -> list[str]:
        try:
            return list(self.client.get_children(path))
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                self.client.create(path, b"", makepath=True, acl=self.acls)
            return []

    def _remove(self, node: str) -> None:
        try:
            self.client.delete(node)
        except NoNodeError:
            pass
        except _ERRORS as exc:  # tried again at the next turn (or it goes with the session)
            self._orphans.append(node)
            self._say(node, f"handing the commit turn on failed ({type(exc).__name__}: {exc})")
            return
        with contextlib.suppress(ValueError):
            self._orphans.remove(node)

    @staticmethod
    def _say(what: str, text: str) -> None:
        print(f"deltawheel: {what}: {text}", file=sys.stderr)
