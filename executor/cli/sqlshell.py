"""``deltawheel sql``'s statements: several per call (``;``-separated or repeated) and the
interactive shell (no query given): one Spark session for all of them."""

from __future__ import annotations

import sys
from typing import Callable, Iterable, TextIO

__all__ = ["split_statements", "shell"]

SHELL_HELP = ("end a statement with ';' (or an empty line); \\d lists the views, \\d VIEW describes one, "
              "\\q or Ctrl-D quits")


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` split at ``;`` outside quotes, backticks and ``--`` comments.

    >>> split_statements("SELECT ';' AS a; SELECT 2 -- x; y\\n;")
    ["SELECT ';' AS a", 'SELECT 2 -- x; y']
    """
    out: list[str] = []
    cur: list[str] = []
    quote = ""
    comment = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = "" if ch == quote and (not cur or cur[-1] != "\\") else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "-" and cur and cur[-1] == "-":
            comment = True
        elif ch == ";":
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return [s for s in out if s]


def _lines(stdin: TextIO, prompt: Callable[[], str]) -> Iterable[str]:
    interactive = stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    while True:
        if interactive:
            try:
                yield input(prompt())
            except EOFError:
                print(file=sys.stderr)
                return
        else:
            line = stdin.readline()
            if not line:
                return
            yield line.rstrip("\n")


def shell(run: Callable[[str], int], describe: Callable[[str | None], int], *, stdin: TextIO) -> int:
    """Read statements from ``stdin`` until EOF or ``\\q`` and ``run`` each (``describe`` for ``\\d``);
    returns the worst exit code of them (0 if all ran)."""
    if stdin.isatty():
        print(f"deltawheel sql: {SHELL_HELP}", file=sys.stderr)
    worst = 0
    buf: list[str] = []
    for line in _lines(stdin, lambda: "...> " if buf else "sql> "):
        stripped = line.strip()
        if not buf and stripped.startswith("\\"):
            cmd, _, arg = stripped.partition(" ")
            if cmd == "\\q":
                break
            if cmd == "\\d":
                worst = max(worst, describe(arg.strip() or None))
            else:
                print(f"unknown command {cmd}; {SHELL_HELP}", file=sys.stderr)
            continue
        buf.append(line)
        text = "\n".join(buf)
        if stripped.endswith(";") or (not stripped and text.strip()):
            for statement in split_statements(text):
                worst = max(worst, run(statement))
            buf.clear()
        elif not text.strip():
            buf.clear()
    for statement in split_statements("\n".join(buf)):
        worst = max(worst, run(statement))
    return worst
