"""A start that runs in a thread: :class:`BackgroundStart`; :func:`beside`: one step in a thread."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, TypeVar

from deltawheel.statestore.ownership.owner import IntervalOwner

__all__ = ["BackgroundStart", "beside"]

T = TypeVar("T")


def beside(fn: Callable[[], T], *, name: str) -> concurrent.futures.Future[T]:
    """``fn()`` in a daemon thread named ``deltawheel-<name>``; the future holds its outcome."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            got = fn()
        except BaseException as exc:
            done.set_exception(exc)
        else:
            done.set_result(got)

    threading.Thread(target=run, name=f"deltawheel-{name}", daemon=True).start()
    return done


class BackgroundStart:
    """``start()``, then ``then()``, in a daemon thread; ``leased`` is set once the leases are granted."""

    def __init__(self, start: Callable[[], None], *, owner: IntervalOwner, name: str,
                 then: Callable[[], None] | None = None) -> None:
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.leased = threading.Event()
        self._start, self._owner, self._name, self._then = start, owner, name, then

    def begin(self) -> None:
        """Start the thread."""
        threading.Thread(target=self._run, name=f"deltawheel-start-{self._name}", daemon=True).start()

    def failed(self) -> bool:
        """The start has ended, and raised."""
        return self.done.done() and self.done.exception() is not None

    def _run(self) -> None:
        self._owner.on_granted = self.leased.set
        try:
            self._start()
            if self._then is not None:
                self._then()
        except BaseException as exc:
            self.done.set_exception(exc)
        else:
            self.done.set_result(None)
        finally:
            self._owner.on_granted = None
            self.leased.set()
