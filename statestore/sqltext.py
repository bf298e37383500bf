"""Quoting helpers for the SQL text deltawheel generates (table paths, literals)."""

from __future__ import annotations

__all__ = ["sql_path", "sql_str"]


def sql_path(path: str) -> str:
    """``delta.`<path>``` with backticks in the path doubled.

    >>> sql_path("/tmp/s/rows")
    'delta.`/tmp/s/rows`'
    """
    return "delta.`" + path.replace("`", "``") + "`"


def sql_str(value: str) -> str:
    """A Spark SQL string literal; quotes and backslashes escaped, control characters as ``\\uXXXX``.

    >>> sql_str("it's")
    "'it\\\\'s'"
    """
    out = []
    for ch in value:
        if ch in ("'", "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "'" + "".join(out) + "'"
