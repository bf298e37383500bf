"""A step of the image path's acquisition run in a thread beside the claim's commit (:class:`Beside`)."""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["Beside"]


class Beside:
    """``fn`` run once in a thread started by :meth:`chain`'s callback; each :meth:`join` raises its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ran = False  # ran in a joining thread (never started)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._fn()
        except BaseException as exc:
            self._error = exc

    def chain(self, then: Callable[[], None] | None) -> Callable[[], None]:
        """A callback that starts ``fn``'s thread, then calls ``then``."""
        def start() -> None:
            with self._lock:
                if self._thread is None and not self._ran:
                    self._thread = threading.Thread(target=self._run, name="deltawheel-beside", daemon=True)
                    self._thread.start()
            if then is not None:
                then()
        return start

    def join(self, *, raise_error: bool = True, run: bool = True) -> None:
        """Wait for ``fn``; ``run``: run it here if its thread was never started (else return)."""
        with self._lock:
            thread = self._thread
            if thread is None and not self._ran:
                if not run:
                    return
                self._run()
                self._ran = True
        if thread is not None:
            thread.join()
        if raise_error and self._error is not None:
            raise self._error
