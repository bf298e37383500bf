"""Turns at a shared rows table's commits: the instances sharing a computation's intervals queue for
its commits (EPHEMERAL_SEQUENTIAL znodes under ``/pipelines/{pipeline}/turns/{computation}``, the
lowest holds the turn) instead of racing for Delta's next version, which starves the losers
(docs/scale.md, "Taking turns").

Only an arbiter of speed, never of safety: a writer that gets no turn commits without one, and
Delta's conflict check and the fence rows still refuse whatever they refuse. No turn comes when
ZooKeeper does not answer, or when one holder keeps the turn past ``hold_s`` (killed while it held
it: its znode goes when its session expires); then this writer's commits go on without turns,
waiting for none, until that holder's znode is gone. A turn covers the Delta commit alone."""

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

__all__ = ["CommitTurns", "turns_path"]

_ERRORS = (KazooException, KazooTimeoutError)
_LOOK_S = 0.5  # a waiting writer looks at who holds the turn at least this often


def turns_path(pipeline: str, computation: str) -> str:
    """The znode under which ``computation``'s writers queue for their turns."""
    return f"/pipelines/{pipeline}/turns/{validate_name('computation', computation)}"


def _seq(name: str) -> str:
    return name[-10:]  # ZooKeeper's sequence suffix


class CommitTurns:
    """One writer's turns at its computations' commits; ``turn(computation)`` is a context manager
    yielding whether this writer holds the turn. Threads of one writer take theirs one at a time."""

    def __init__(self, client: KazooClient, *, pipeline: str, writer: str, hold_s: float = 5.0,
                 acls: object = None) -> None:
        self.client, self.pipeline, self.writer, self.hold_s, self.acls = client, pipeline, writer, hold_s, acls
        self._local: dict[str, threading.Lock] = {}
        self._stuck: dict[str, str] = {}  # computation -> the holder's znode taken as stuck
        self._orphans: list[str] = []  # own znodes whose removal failed: removed at the next turn
        self._guard = threading.Lock()
        self.taken = 0  # turns taken
        self.skipped = 0  # commits made without a turn

    @contextlib.contextmanager
    def turn(self, computation: str) -> Iterator[bool]:
        """Hold ``computation``'s turn for the block; yields False where it goes on without one."""
        with self._guard:
            local = self._local.setdefault(computation, threading.Lock())
        with local:
            mine = None
            try:
                mine = self._queue(computation)
            except _ERRORS as exc:
                self._say(computation, f"committing without a turn ({type(exc).__name__}: {exc}); Delta's "
                          "conflict check still guards the commit")
            self.taken += mine is not None
            self.skipped += mine is None
            try:
                yield mine is not None
            finally:
                if mine is not None:
                    self._remove(mine)

    def _queue(self, computation: str) -> str | None:
        """Queue and wait for the turn: the own znode's path, or None (a stuck holder: no turn)."""
        path = turns_path(self.pipeline, computation)
        for orphan in list(self._orphans):
            self._remove(orphan)
        kids = self._children(path)
        stuck = self._stuck.get(computation)
        if stuck is not None:
            if stuck in kids:
                return None  # its holder's session has not expired yet: no wait
            del self._stuck[computation]
        prefix = f"{uuid.uuid4().hex}-"
        try:
            mine = self.client.create(f"{path}/{prefix}", self.writer.encode(), ephemeral=True, sequence=True,
                                      acl=self.acls)
        except _ERRORS:
            self._orphans += [f"{path}/{k}" for k in self._children(path) if k.startswith(prefix)]
            raise
        try:
            return self._wait(computation, path, mine)
        except BaseException:
            self._remove(mine)
            raise

    def _wait(self, computation: str, path: str, mine: str) -> str | None:
        name = mine.rsplit("/", 1)[1]
        head, since = None, time.monotonic()
        while True:
            kids = sorted(self._children(path), key=_seq)
            if name not in kids:  # gone with a session that expired meanwhile
                return None
            if kids[0] == name:
                return mine
            if kids[0] != head:
                head, since = kids[0], time.monotonic()
            elif time.monotonic() - since > self.hold_s:
                self._stuck[computation] = str(head)
                self._remove(mine)
                self._say(computation, f"the commit turn held by {head} for over {self.hold_s:g} s: committing "
                          "without turns until its holder's session ends")
                return None
            ahead = [k for k in kids if _seq(k) < _seq(name)]
            moved = threading.Event()
            if ahead and self.client.exists(f"{path}/{ahead[-1]}", watch=lambda _e, m=moved: m.set()) is not None:
                moved.wait(_LOOK_S)

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
