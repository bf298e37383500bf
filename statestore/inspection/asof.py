"""``sql --as-of``: the version of each of a store's tables the views read, one instant for all (a
timestamp, or the commit of ``COMPUTATION@N``); a table with no version by then has no view."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..exceptions import ConfigError, VersionNotFoundError
from ..layout import StoreLayout

__all__ = ["AsOf", "resolve_as_of", "parse_as_of", "table_versions", "store_tables"]

_VERSION = re.compile(r"^\d+$")
_AT_VERSION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,63})@(\d+)$")


@dataclass(frozen=True)
class AsOf:
    """The instant asked for and the version of each table (path -> version; None: no version yet)."""

    asked: str
    instant_ms: int
    versions: Mapping[str, int | None]

    def version_of(self, path: str) -> int | None:
        """The version of the table at ``path`` as of the instant (None: it did not exist yet)."""
        return self.versions.get(path)

    def describe(self, layout: StoreLayout) -> str:
        """One line naming every table's version."""
        parts = [f"{p[len(layout.root) + 1:]} " + ("(not yet created)" if v is None else f"v{v}")
                 for p, v in sorted(self.versions.items())]
        return f"as of {self.asked}: {_iso(self.instant_ms)}; " + ", ".join(parts)


def parse_as_of(value: str) -> int | tuple[str, int] | dt.datetime:
    """A version (digits), a computation's version (``COMPUTATION@N``) or a timestamp (ISO 8601; naive: UTC).

    >>> parse_as_of("12")
    12
    >>> parse_as_of("counter@12")
    ('counter', 12)
    >>> parse_as_of("2026-01-02 03:04:05").isoformat()
    '2026-01-02T03:04:05+00:00'
    """
    text = value.strip()
    if _VERSION.match(text):
        return int(text)
    at = _AT_VERSION.match(text)
    if at:
        return at.group(1), int(at.group(2))
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--as-of {value!r} is neither a version (COMPUTATION@N, e.g. counter@12; N alone in a "
                          "store of one computation) nor a timestamp; give e.g. counter@12 or "
                          "'2026-11-25 21:00:00' (UTC unless an offset is given)") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def table_versions(spark: Any, path: str) -> list[tuple[int, int]]:
    """(version, commit time in ms) of each version still in the table's log, oldest first."""
    from delta.tables import DeltaTable

    hist = DeltaTable.forPath(spark, path).history().selectExpr("version", "unix_millis(timestamp) AS ms")
    return sorted((int(r["version"]), int(r["ms"])) for r in hist.collect())


def _at(history: list[tuple[int, int]], instant_ms: int) -> int | None:
    return max((v for v, ms in history if ms <= instant_ms), default=None)


def _span(history: list[tuple[int, int]]) -> str:
    if not history:
        return "its log holds no version"
    return (f"its log holds versions {history[0][0]}-{history[-1][0]}, committed "
            f"{_iso(history[0][1])} to {_iso(history[-1][1])}")


def resolve_as_of(spark: Any, layout: StoreLayout, value: str, tables: list[str]) -> AsOf:
    """The version of each of ``tables`` (paths, :func:`store_tables`) as of ``value``.

    Raises:
        ConfigError: not a version nor a timestamp; a bare version in a store not of one computation;
            a computation without a rows table.
        VersionNotFoundError: no such version in the log; no rows table has a version by that time.
    """
    from ..rowtable.tables import list_computations

    asked = parse_as_of(value)
    names = list_computations(spark, layout)
    histories = {p: table_versions(spark, p) for p in tables}
    pinned: dict[str, int] = {}
    if isinstance(asked, dt.datetime):
        instant = int(asked.timestamp() * 1000)
        rows = {c: histories.get(layout.rows_of(c)) or table_versions(spark, layout.rows_of(c)) for c in names}
        if not any(_at(h, instant) is not None for h in rows.values()):
            told = "; ".join(f"{c}: {_span(h)}" for c, h in rows.items()) or "no computation has committed yet"
            raise VersionNotFoundError(f"the rows tables have no version at or before {_iso(instant)} ({told}). "
                                       "Pick a later time")
    else:
        if isinstance(asked, int):
            if len(names) != 1:
                raise ConfigError(f"--as-of {value!r}: a version is the version of one computation's rows table; "
                                  f"give it as COMPUTATION@{asked} (this store's computations: "
                                  f"{', '.join(names) or 'none yet'})")
            computation, version = names[0], asked
        else:
            computation, version = asked
        if computation not in names:
            raise ConfigError(f"--as-of {value!r}: computation {computation!r} has no rows table in this store "
                              f"(its computations: {', '.join(names) or 'none yet'}); names are case-sensitive")
        path = layout.rows_of(computation)
        history = histories.get(path) or table_versions(spark, path)
        at = dict(history)
        if version not in at:
            raise VersionNotFoundError(f"the rows table of {computation!r} has no version {version}: "
                                       f"{_span(history)}. Pick one of those (deltawheel history lists a key's "
                                       "versions)")
        instant, pinned[path] = at[version], version
    versions = {p: pinned.get(p, _at(h, instant)) for p, h in histories.items()}
    return AsOf(value, instant, {**versions, **pinned})


def store_tables(spark: Any, layout: StoreLayout) -> list[str]:
    """The paths of the existing tables the views read: rows tables, dead letters, late data, streams."""
    from delta.tables import DeltaTable

    from ..rowtable.tables import rows_tables
    from ..writepath.streams import list_streams

    others = [layout.rows, layout.dead_letters, layout.late_data, *(layout.stream(n) for n in list_streams(spark, layout))]
    return [*rows_tables(spark, layout).values(), *(p for p in others if DeltaTable.isDeltaTable(spark, p))]


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
