"""``deltawheel history``: a key's versions in the rows table, newest first, decoded; read-only and
without Spark or leases (``statestore/inspection/history.py``; docs/history.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import (
    BucketMissingError,
    ConfigError,
    DeltaWheelError,
    NotAStoreError,
    ObjectStoreAuthError,
    ObjectStoreError,
    ObjectStoreUnreachableError,
)
from deltawheel.statestore.inspection.history import Change, key_history
from deltawheel.statestore.inspection.sqlviews import format_rows, row_json
from deltawheel.statestore.objectstore.s3a import bucket_of, files_from_env

from .common import add_store_arg, layout_from

__all__ = ["register", "change_json"]


def register(subparsers: Any) -> None:
    """Add the ``history`` subcommand."""
    p = subparsers.add_parser(
        "history", help="a key's versions, newest first: state decoded, timers, pending productions, dedup ids held, "
        "writer, sequencer, commit version and time",
        description="Reads the rows table's Delta log and files (no Spark, no lease). A version is listed where "
        "the key's row changed: its state, timers, dedup ids or pending productions (change: insert, update, or "
        "delete when its state and timers were emptied). ids: the dedup ids the store held for the key at that "
        "version, in its row or in its interval's ids files (the image path).")
    add_store_arg(p)
    p.add_argument("--computation", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--limit", type=int, default=None, metavar="N", help="the newest N versions only")
    p.add_argument("--json", action="store_true", help="one JSON object per version (JSON Lines), everything decoded")
    p.add_argument("--allow-pickle", action="store_true", help="decode pickled values (runs code!)")
    p.set_defaults(func=_history)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def change_json(c: Change, *, allow_pickle: bool = False) -> dict[str, Any]:
    """One version of a key as plain values: the commit's facts, its record ids then, the row decoded."""
    row = None if c.row is None else row_json(c.row, allow_pickle=allow_pickle)
    return {"version": c.commit.version, "commit_time": _iso(c.commit.timestamp_ms),
            "commit_time_ms": c.commit.timestamp_ms, "change": c.change, "writer": c.commit.writer,
            "kind": c.commit.meta.get("kind") or c.commit.operation, "n_record_ids": c.n_record_ids, "row": row}


# pyarrow's S3 errors name the AWS error kind ("AWS Error ACCESS_DENIED during ListObjectsV2 ...")
_DENIED = ("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY_ID", "AccessDenied")
_UNREACHABLE = ("NETWORK_CONNECTION", "Couldn't connect", "curlCode", "UNKNOWN (HTTP status 0)")


def _store_error(exc: OSError, root: str) -> DeltaWheelError:
    """The typed error for an object store that failed a read of ``root`` (pyarrow's ``OSError``)."""
    text = str(exc)
    bucket = bucket_of(root) or "?"
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return _missing(bucket, root)
    if any(d in text for d in _DENIED):
        return ObjectStoreAuthError(
            f"the object store refused the credentials for {root} ({text[:200]}): set $DELTAWHEEL_S3_ACCESS_KEY "
            "and $DELTAWHEEL_S3_SECRET_KEY to the store's ('deltawheel objectstore status' prints the local "
            "server's)")
    if any(u in text for u in _UNREACHABLE):
        return ObjectStoreUnreachableError(
            f"no object store answers for {root} ({text[:200]}): start it ('deltawheel objectstore start' for "
            "the local server) or fix $DELTAWHEEL_S3_ENDPOINT")
    return ObjectStoreError(f"reading {root} failed: {text}; check that the object store answers and "
                            "$DELTAWHEEL_S3_ENDPOINT and its keys ('deltawheel objectstore status')")


def _missing(bucket: str, root: str) -> BucketMissingError:
    return BucketMissingError(f"bucket {bucket!r} of {root} does not exist on the object store; create it (for "
                              f"the local server: 'deltawheel objectstore create-bucket {bucket}') or fix --store")


def _check_bucket(files: TableFiles, root: str) -> None:
    """Raise :class:`BucketMissingError` when the bucket of an ``s3a://`` store does not exist (S3
    lists a missing bucket's prefix as empty, as it lists a missing folder)."""
    from pyarrow import fs as pafs

    bucket = files.root.split("/", 1)[0]
    try:
        missing = files.fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as exc:
        raise _store_error(exc, root) from exc
    if missing:
        raise _missing(bucket, root)


def _history(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}; leave it out for every version")
    layout = layout_from(args)
    files = files_from_env(layout.rows)
    if files is None:
        raise ConfigError(f"--store {args.store}: history reads local folders, file: and s3a:// stores only; for "
                          "another scheme, query the state_history view (deltawheel sql)")
    try:
        listed = files.listdir("_delta_log")
    except OSError as exc:  # the object store did not answer, or refused (pyarrow's error)
        raise _store_error(exc, layout.root) from exc
    if listed is None and not files.is_local:
        _check_bucket(files, layout.root)
    if listed is None:
        raise NotAStoreError(f"--store {args.store} holds no rows table ({layout.rows}/_delta_log is missing): "
                             "pass the folder of a store a pipeline has run on")
    try:
        got = key_history(files, computation=args.computation, key=args.key, limit=args.limit)
    except OSError as exc:
        if files.is_local:
            raise
        raise _store_error(exc, layout.root) from exc
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
