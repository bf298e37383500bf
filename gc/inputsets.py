"""gc's ``input_sets`` pass: a name leaves every interval's input-file set, in one fenced commit under all
the leases, once every interval ran the file and it is gone from its source (docs/rescaling.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlparse

from deltawheel.statestore.exceptions import LeaseHeldError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.surgery.replace import Surgery, replace_intervals
from deltawheel.statestore.zk.lease_tools import list_leases

from .passes import GcAction
from .ranlog import RanLog, ran_in_log, read_ran, save_ran

__all__ = ["prune_input_sets", "prunable", "logged_paths", "ran_in_log", "with_ran", "RanLog"]

PASS = "input_sets"


def logged_paths(checkpoints: str) -> dict[str, set[str]]:
    """File name -> the full local paths the file source logs under ``checkpoints`` name."""
    out: dict[str, set[str]] = {}
    if "://" in checkpoints and not checkpoints.startswith("file:"):
        return out
    root = urlparse(checkpoints).path if checkpoints.startswith("file:") else checkpoints
    for here, dirs, files in os.walk(root):
        if os.path.basename(os.path.dirname(here)) != "sources":
            continue
        dirs.clear()
        for name in files:
            if not (name.isdigit() or name.endswith(".compact")):
                continue
            with open(os.path.join(here, name), encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("{"):
                        path = urlparse(json.loads(line)["path"])
                        if path.scheme in ("", "file"):
                            local = unquote(path.path)
                            out.setdefault(os.path.basename(local), set()).add(local)
    return out


def prunable(sets: Mapping[int, frozenset[str]], num_intervals: int, *, gone: Callable[[str], bool]) -> frozenset[str]:
    """The names to drop from every set: in each of the ``num_intervals`` sets, and ``gone``.

    >>> sorted(prunable({0: frozenset("ab"), 1: frozenset("abc")}, 2, gone=lambda n: n != "b"))
    ['a']
    >>> prunable({0: frozenset("a")}, 2, gone=lambda n: True)
    frozenset()
    """
    common = frozenset.intersection(*(sets.get(iv, frozenset()) for iv in range(num_intervals)))
    return frozenset(n for n in common if gone(n))


def with_ran(sets: Mapping[int, frozenset[str]], ran: Mapping[int, frozenset[str]], *,
             gone: Callable[[str], bool]) -> dict[int, frozenset[str]]:
    """Each interval's set with the names ``ran`` says it ran, but gone names no set holds.

    >>> sorted(with_ran({0: frozenset("a")}, {1: frozenset("ab"), 2: frozenset("c")}, gone=lambda n: n != "c").items())
    [(0, frozenset({'a'})), (1, frozenset({'a'})), (2, frozenset({'c'}))]
    """
    held = frozenset().union(*sets.values()) if sets else frozenset()
    out = dict(sets)
    for iv, names in ran.items():
        add = frozenset(n for n in names if n in held or not gone(n))
        if add:
            out[iv] = out.get(iv, frozenset()) | add
    return out


def _gone_test(layout: StoreLayout, pipeline: str, computation: str) -> Callable[[str], bool]:
    """Whether a position's file is gone from its source (False where that cannot be known)."""
    paths = logged_paths(f"{layout.root}/_checkpoints/{pipeline}/{computation}")

    def gone(position: str) -> bool:
        if "/" in position:  # a stream table's data file: {stream}/{file}
            stream, name = position.split("/", 1)
            if not layout.is_local:
                return False
            folder = layout.stream(stream)
            folder = urlparse(folder).path if folder.startswith("file:") else folder
            return not os.path.exists(os.path.join(folder, name))
        where = paths.get(position, set())
        return bool(where) and not any(os.path.exists(p) for p in where)

    return gone


def _ran_of(computation: str, *logs: RanLog) -> dict[int, frozenset[str]]:
    """interval -> the files ``logs`` together say ``computation``'s interval ran."""
    out: dict[int, frozenset[str]] = {}
    for log in logs:
        for iv, fs in log.ran.get(computation, {}).items():
            out[iv] = out.get(iv, frozenset()) | fs
    return out


def prune_input_sets(spark: Any, layout: StoreLayout, client: Any, *, pipelines: list[str], apply: bool,
                     wait_s: float = 60.0, progress: Callable[[str], None] | None = None,
                     ran: Mapping[str | None, RanLog] | None = None) -> list[GcAction]:
    """Plan (default) or run the pass over ``pipelines``' computations that keep input-file sets; one not
    handed over within ``wait_s`` is left. ``ran``: per rows table, evidence read earlier (else gc's kept)."""
    store = RowStore(spark, layout, writer="gc")
    actions: list[GcAction] = []
    got: dict[str | None, RanLog] = {}  # per table, its log's evidence, read once when a computation keeps sets
    pruned: dict[str, frozenset[str]] = {}  # per computation, the names a commit dropped from every set
    for pipeline in pipelines:
        comps: dict[str, int] = {}
        for r in list_leases(client, pipeline=pipeline):
            comps[r["computation"]] = max(comps.get(r["computation"], 0), int(r["interval"]) + 1)
        for comp, n in sorted(comps.items()):
            if not (stored := store.input_files(comp)):
                continue
            for table in (None, comp):  # the first table's log: what the computation ran before migration 8
                if table not in got:
                    got[table] = read_ran(layout, computation=table, since=(ran or {}).get(table))
            gone = _gone_test(layout, pipeline, comp)
            said = {iv: fs for iv, fs in _ran_of(comp, got[None], got[comp]).items() if 0 <= iv < n}
            sets = with_ran(stored, said, gone=gone)
            names = len(frozenset().union(*sets.values()))
            drop = prunable(sets, n, gone=gone)
            table = f"{pipeline}/{comp}"
            what = (f"{len(drop)} of {names} input-file names are gone from their source and run by "
                    f"each of the {n} intervals")
            if not apply or not drop:
                actions.append(GcAction(PASS, table, what + (": would be dropped from every set" if drop else
                                                             ": nothing to drop"), len(drop)))
                continue

            def shrink(now: Mapping[int, frozenset[str]], drop: frozenset[str] = drop,
                       said: Mapping[int, frozenset[str]] = said,
                       gone: Callable[[str], bool] = gone) -> dict[int, frozenset[str]]:
                # the sets read under the leases, with what the log says each interval ran
                return {iv: fs - drop for iv, fs in with_ran(now, said, gone=gone).items()}

            try:
                res = replace_intervals(
                    spark, layout, client, pipeline=pipeline, computation=comp, num_intervals=n,
                    build=lambda held: held.rows, wait_s=wait_s, progress=progress,
                    surgery=Surgery("gc", PASS, detail={"pruned": len(drop), "names_before": names}),
                    input_sets=shrink)
            except LeaseHeldError as exc:
                actions.append(GcAction(PASS, table, what + f"; left as they are: {exc}", 0))
                continue
            pruned[comp] = pruned.get(comp, frozenset()) | drop
            actions.append(GcAction(PASS, table, what + f": dropped from every set at rows version {res.version}",
                                    len(drop)))
    if apply:  # the next gc reads on from here
        for table, evidence in got.items():
            save_ran(layout, evidence, computation=table, forget=pruned)
    return actions
