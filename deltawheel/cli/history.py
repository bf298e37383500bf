"""``deltawheel history``: a key's versions, newest first, decoded; no Spark, no leases (docs/history.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from deltawheel.statestore.inspection.history import Change, store_key_history
from deltawheel.statestore.inspection.sqlviews import format_rows, row_json

from .common import add_key_args, add_store_arg, layout_from

__all__ = ["register", "change_json"]


def register(subparsers: Any) -> None:
    """Add the ``history`` subcommand."""
    p = subparsers.add_parser(
        "history", help="a key's versions, newest first: state decoded, timers, pending productions, dedup ids held, "
        "writer, sequencer, commit version and time",
        description="Reads the rows table's Delta log and files (no Spark, no lease); a version is listed "
        "where the key's row changed; ids: the dedup ids the store held for the key then (docs/history.md).")
    add_store_arg(p)
    add_key_args(p)
    p.add_argument("--limit", type=int, default=None, metavar="N", help="the newest N versions only")
    p.add_argument("--json", action="store_true", help="one JSON object per version (JSON Lines), everything decoded")
    p.set_defaults(func=_history)


def change_json(c: Change, *, allow_pickle: bool = False) -> dict[str, Any]:
    """One version of a key as plain values: the commit's facts, its record ids then, the row decoded."""
    row = None if c.row is None else row_json(c.row, allow_pickle=allow_pickle)
    iso = dt.datetime.fromtimestamp(c.commit.timestamp_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return {"version": c.commit.version, "commit_time": iso,
            "commit_time_ms": c.commit.timestamp_ms, "change": c.change, "writer": c.commit.writer,
            "kind": c.commit.meta.get("kind") or c.commit.operation, "n_record_ids": c.n_record_ids, "row": row}


def _history(args: argparse.Namespace) -> int:
    got = store_key_history(layout_from(args), computation=args.computation, key=args.key, limit=args.limit)
    found = [change_json(c, allow_pickle=args.allow_pickle) for c in got.changes]
    if args.json:
        for f in found:
            print(json.dumps(f, ensure_ascii=False))
        return 0
    rows = []
    for f in found:
        r = f["row"] or {}
        rows.append((f["version"], f["commit_time"], f["change"], f["writer"], r.get("sequencer"),
                     None if f["row"] is None else json.dumps(r["state"], sort_keys=True, ensure_ascii=False),
                     len(r.get("timers", ())), len(r.get("pending", ())), f["n_record_ids"]))
    sys.stdout.write(format_rows(["version", "commit_time", "change", "writer", "sequencer", "state", "timers",
                                  "pending", "ids"], rows))
    print(f"{args.computation}/{args.key}: {len(found)} version(s) shown; the log holds versions "
          f"{got.first_version}-{got.latest_version} (--json for timers and pending productions in full)",
          file=sys.stderr)
    return 0
