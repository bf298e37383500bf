"""Pruning the rescaling input-file sets (``deltawheel gc``'s ``input_sets`` pass).

Each interval's fence row holds the input positions committed for it (``statestore/rowtable/
inputfiles.py``; the skip rule and the catch-up of ``executor/protocol/rescale.py`` read them), and
every commit only adds to it. This pass removes a name from **every** interval's set of a
computation, in one fenced commit under the leases of all its intervals, when

(a) every interval's set holds it (every interval has run the file), and
(b) the file is gone from its source: a Parquet injector's file from its folder (its full path read
    from the query checkpoints' file source logs, ``_checkpoints/{pipeline}/{computation}/...``), a
    stream table's data file from the table's folder (VACUUM).

Why that is exact (the proof in docs/rescaling.md, "Bounded sets"): a gone file is listed as new
input by no query again (names are never reused), so the skip rule never meets it; the catch-up
leaves out a consumed position that is gone and in no interval's set (``SharedInput.missing``):
by (a), after the pass exactly the pruned names (and names of files deleted before any interval
ran them) are such positions.

Where a name's full path cannot be known (no local checkpoint logged it, a remote store) it stays.
The commit goes through ``statestore/surgery/replace.py`` (hand-over from a running owner at a
batch boundary, fence, recovery, one fenced commit, an audit row of tool ``gc``).
"""

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

__all__ = ["prune_input_sets", "prunable", "logged_paths"]

PASS = "input_sets"


def logged_paths(checkpoints: str) -> dict[str, set[str]]:
    """File name -> the full local paths the file source logs under ``checkpoints`` name (every
    query checkpoint below it: ``sources/*/`` of each), local checkpoints only; missing: {}."""
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
    """The names to drop from every set: in the set of each of the ``num_intervals`` intervals,
    and ``gone`` from their source.

    >>> sorted(prunable({0: frozenset("ab"), 1: frozenset("abc")}, 2, gone=lambda n: n != "b"))
    ['a']
    >>> prunable({0: frozenset("a")}, 2, gone=lambda n: True)
    frozenset()
    """
    common = frozenset.intersection(*(sets.get(iv, frozenset()) for iv in range(num_intervals)))
    return frozenset(n for n in common if gone(n))


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


def prune_input_sets(spark: Any, layout: StoreLayout, client: Any, *, pipelines: list[str], apply: bool,
                     wait_s: float = 60.0, progress: Callable[[str], None] | None = None) -> list[GcAction]:
    """Plan (default) or run the pass over the computations of ``pipelines`` (those bound to the
    store) that keep input-file sets: one action per such computation, its count the names pruned
    (or that would be). A computation whose intervals a running owner does not hand over within
    ``wait_s`` is left as it is (said in its action); a racing takeover fails the commit likewise."""
    store = RowStore(spark, layout, writer="gc")
    actions: list[GcAction] = []
    for pipeline in pipelines:
        comps: dict[str, int] = {}
        for r in list_leases(client, pipeline=pipeline):
            comps[r["computation"]] = max(comps.get(r["computation"], 0), int(r["interval"]) + 1)
        for comp, n in sorted(comps.items()):
            sets = store.input_files(comp)
            if not sets:
                continue
            names = len(frozenset().union(*sets.values()))
            drop = prunable(sets, n, gone=_gone_test(layout, pipeline, comp))
            table = f"{pipeline}/{comp}"
            what = (f"{len(drop)} of {names} input-file names are gone from their source and in the set of "
                    f"each of the {n} intervals")
            if not apply or not drop:
                actions.append(GcAction(PASS, table, what + (": would be dropped from every set" if drop else
                                                             ": nothing to drop"), len(drop)))
                continue
            def shrink(now: Mapping[int, frozenset[str]], drop: frozenset[str] = drop) -> dict[int, frozenset[str]]:
                return {iv: fs - drop for iv, fs in now.items()}

            try:
                res = replace_intervals(
                    spark, layout, client, pipeline=pipeline, computation=comp, num_intervals=n,
                    build=lambda held: held.rows, wait_s=wait_s, progress=progress,
                    surgery=Surgery("gc", PASS, detail={"pruned": len(drop), "names_before": names}),
                    input_sets=shrink)
            except LeaseHeldError as exc:
                actions.append(GcAction(PASS, table, what + f"; left as they are: {exc}", 0))
                continue
            actions.append(GcAction(PASS, table, what + f": dropped from every set at rows version {res.version}",
                                    len(drop)))
    return actions
