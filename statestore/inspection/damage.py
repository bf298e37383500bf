"""Damage to a local store's Delta logs (a deleted newest commit silently rolls a table back), found
before an executor takes its leases instead of deep inside a read (docs/store-damage.md)."""

from __future__ import annotations

import json
import os
import re

from ..delta.log import DAMAGE_DOC, damaged_entry, local_path, read_snapshot
from ..exceptions import StoreDamagedError
from ..layout import StoreLayout
from ..rowtable.tables import rows_tables
from ..writepath.streams import list_streams

__all__ = ["check_log", "check_store"]

_VERSIONED = re.compile(r"^(\d{20})\.(json|crc|checkpoint\..*)$")


def check_log(path: str, *, table: str) -> int | None:
    """Check the log of the local Delta table at ``path``; its newest version (None: remote, no log).
    StoreDamagedError: a commit is missing (a gap; a checksum or _last_checkpoint past it) or unparsable."""
    root = local_path(path)
    if root is None:
        return None
    log = os.path.join(root, "_delta_log")
    try:
        names = os.listdir(log)
    except FileNotFoundError:
        return None
    jsons: list[int] = []
    crcs: list[int] = []
    cps: list[int] = []
    for n in names:
        m = _VERSIONED.match(n)
        if m:
            {"json": jsons, "crc": crcs}.get(m.group(2), cps).append(int(m.group(1)))
    if not jsons and not cps:
        return None
    jsons.sort()
    cp = max(cps, default=-1)
    newest = max(jsons[-1] if jsons else -1, cp)
    marked = max(crcs, default=-1)
    try:
        with open(os.path.join(log, "_last_checkpoint"), encoding="utf-8") as fh:
            marked = max(marked, int(json.load(fh)["version"]))
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError) as exc:
        raise damaged_entry(os.path.join(log, "_last_checkpoint"), exc) from exc
    if marked > newest:
        raise StoreDamagedError(
            f"the {table} table ({path}) is damaged: its log ends at version {newest}, but Delta's own files "
            f"show commit {marked} was made (expected at least version {marked}, found {newest}): "
            f"{marked:020d}.json is missing from {log}. Nothing was written. Restore the missing commit(s) "
            f"from a backup of the store before running anything on it ({DAMAGE_DOC})")
    after = [v for v in jsons if v > cp]
    missing = sorted(set(range(cp + 1, newest + 1)) - set(after))
    if missing:
        raise StoreDamagedError(
            f"the {table} table ({path}) is damaged: commit(s) {missing} are missing from {log} between "
            f"version {cp} and {newest}. Nothing was written. Restore them from a backup of the store ({DAMAGE_DOC})")
    for v in after:
        file = os.path.join(log, f"{v:020d}.json")
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        try:
            for line in text.splitlines():
                if line.strip():
                    json.loads(line)
        except ValueError as exc:
            raise damaged_entry(file, exc) from exc
    return newest


def check_store(layout: StoreLayout) -> None:
    """Check a local store's tables' logs, and that no stream is ahead of the rows table that delivered to it
    (else StoreDamagedError)."""
    if not layout.is_local or check_log(layout.rows, table="rows") is None:
        return
    # the streams are read before the rows: a delivery lands after its rows commit, so a commit and a
    # delivery landing while the store is checked are both in the rows' later read, never only the stream's
    delivered: dict[tuple[str, str], tuple[str, int]] = {}  # (stream, computation) -> its newest delivery
    for stream in list_streams(None, layout):
        path = layout.stream(stream)
        if check_log(path, table=f"stream {stream!r}") is None:
            continue
        snap = read_snapshot(path)
        for app, v in (snap.txns.items() if snap else ()):
            if app.startswith("deltawheel.") and app.count(".") >= 2:  # deltawheel.<computation>.<interval>
                key = (stream, app.split(".")[1])
                if key not in delivered or v > delivered[key][1]:
                    delivered[key] = (app, v)
    newest = {c: check_log(path, table=f"{c!r} rows") for c, path in rows_tables(None, layout).items()}
    for (stream, comp), (app, v) in sorted(delivered.items()):
        rows = newest.get(comp)
        rows = -1 if rows is None else rows  # its log gone meanwhile: every delivery is ahead of it
        if v > rows:
            path = layout.rows_of(comp)
            raise StoreDamagedError(
                f"the rows table of computation {comp!r} ({path}) is behind what was delivered: stream {stream!r} "
                f"records the productions of rows commit {v} (delivery {app}), but its rows table ends at "
                f"version {rows} (expected at least version {v}, found {rows}): commit(s) of the rows table were lost "
                f"and the state they held with them. Nothing was written. Restore {rows + 1:020d}.json .. "
                f"{v:020d}.json into {path}/_delta_log from a backup of the store ({DAMAGE_DOC})")
