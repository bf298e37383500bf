"""Progress lines of long commands: one line per step on stderr (stdout keeps the result), with
the count done of the total, the time so far and, where the total is known, an ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``step(what)`` prints ``deltawheel CMD: [i/N] what (12.3 s, about 40 s left)`` (mean time per step)."""

    def __init__(self, command: str, total: int | None, *, out: TextIO | None = None) -> None:
        self.command = command
        self.total = total
        self.done = 0
        self._out = out
        self._started = time.monotonic()

    def step(self, what: str) -> None:
        """Report that the next step (``what``) starts."""
        elapsed = time.monotonic() - self._started
        count = f"[{self.done + 1}/{self.total}] " if self.total else f"[{self.done + 1}] "
        eta = ""
        if self.total and self.done:
            eta = f", about {elapsed / self.done * (self.total - self.done):.0f} s left"
        print(f"deltawheel {self.command}: {count}{what} ({elapsed:.1f} s{eta})", file=self._out or sys.stderr,
              flush=True)
        self.done += 1
