"""``sql --as-of``: which version of each of a store's tables the views read, one instant for all:
each table's newest version committed by ``TIMESTAMP`` (naive: UTC), or by the commit of the rows
table's ``VERSION``. A table with no version by then has no view."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..exceptions import ConfigError, VersionNotFoundError
from ..layout import StoreLayout

__all__ = ["AsOf", "resolve_as_of", "parse_as_of", "table_versions", "store_tables"]

_VERSION = re.compile(r"^\d+$")


@dataclass(frozen=True)
class AsOf:
    """The instant asked for and the version of each table (path -> version; None: no version yet)."""

    asked: str
    instant_ms: int
    rows_version: int
    versions: Mapping[str, int | None]

    def version_of(self, path: str) -> int | None:
        """The version of the table at ``path`` as of the instant (None: it did not exist yet)."""
        return self.versions.get(path)

    def describe(self, layout: StoreLayout) -> str:
        """One line naming every table's version."""
        parts = [f"{p[len(layout.root) + 1:]} " + ("(not yet created)" if v is None else f"v{v}")
                 for p, v in sorted(self.versions.items())]
        return f"as of {self.asked}: {_iso(self.instant_ms)}; " + ", ".join(parts)


def parse_as_of(value: str) -> int | dt.datetime:
    """A version (digits) or a timestamp (ISO 8601; naive: UTC).

    >>> parse_as_of("12")
    12
    >>> parse_as_of("2026-01-02 03:04:05").isoformat()
    '2026-01-02T03:04:05+00:00'
    """
    text = value.strip()
    if _VERSION.match(text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--as-of {value!r} is neither a version (digits) nor a timestamp; give e.g. 12 or "
                          "'2026-11-25 21:00:00' (UTC unless an offset is given)") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def table_versions(spark: Any, path: str) -> list[tuple[int, int]]:
    """(version, commit time in ms) of each version still in the table's log, oldest first."""
    from delta.tables import DeltaTable

    hist = DeltaTable.forPath(spark, path).history().selectExpr("version", "unix_millis(timestamp) AS ms")
    return sorted((int(r["version"]), int(r["ms"])) for r in hist.collect())


def _at(history: list[tuple[int, int]], instant_ms: int) -> int | None:
    return max((v for v, ms in history if ms <= instant_ms), default=None)


def resolve_as_of(spark: Any, layout: StoreLayout, value: str, tables: list[str]) -> AsOf:
    """The version of the rows table and of each of ``tables`` (paths) as of ``value``.

    Raises:
        ConfigError: ``value`` is neither a version nor a timestamp.
        VersionNotFoundError: the rows table has no such version (or none by that time) in its log.
    """
    asked = parse_as_of(value)
    rows = table_versions(spark, layout.rows)
    span = f"its log holds versions {rows[0][0]}-{rows[-1][0]}, committed " \
           f"{_iso(rows[0][1])} to {_iso(rows[-1][1])}"
    if isinstance(asked, int):
        at = dict(rows)
        if asked not in at:
            raise VersionNotFoundError(f"the rows table has no version {asked}: {span}. Pick one of those "
                                       "(deltawheel history lists a key's versions)")
        instant, rows_version = at[asked], asked
    else:
        instant = int(asked.timestamp() * 1000)
        found = _at(rows, instant)
        if found is None:
            raise VersionNotFoundError(f"the rows table has no version at or before {_iso(instant)}: {span}. "
                                       "Pick a later time")
        rows_version = found
    versions = {p: _at(table_versions(spark, p), instant) for p in tables if p != layout.rows}
    return AsOf(value, instant, rows_version, {layout.rows: rows_version, **versions})


def store_tables(spark: Any, layout: StoreLayout) -> list[str]:
    """The paths of the store's tables the views read (rows, dead letters, late data, streams) that exist."""
    from delta.tables import DeltaTable

    from ..writepath.streams import list_streams

    paths = [layout.rows, layout.dead_letters, layout.late_data,
             *(layout.stream(n) for n in list_streams(spark, layout))]
    return [p for p in paths if DeltaTable.isDeltaTable(spark, p)]


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
