"""The image path's recovery scan: what the interval images still hold to do and to deliver.

Each file an image path commit adds carries its interval's facts after that commit (its oldest
work, next processing time, whether it holds checkpoints, the writer's sequencer) in the add
action's tag :data:`FACTS_TAG`. The scan takes an interval's facts from there when nothing but
claims was added since and it holds no checkpoint, and reads the interval's files otherwise: a
restart then reads no image whole (the first batch reads those it needs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ...delta.log import batch_metas, commit_info, json_commit_versions, user_metadata
from ...delta.storefs import TableFiles
from ...delta.txn import FileEntry, decode_path
from ...rowtable.rows import FENCE_KEY, Production
from ...rowtable.store import raise_if_fenced
from .files import next_processing, oldest_work

__all__ = ["Checkpoint", "Recovery", "scan", "resolve", "FACTS_TAG", "facts_tag"]

#: the add action tag holding an interval's facts after the commit that added the file
FACTS_TAG = "deltawheel.facts"
_FACTS_VERSION = 1


def facts_tag(*, oldest: int | None, next_proc: int | None, pending: int | None, sequencer: int,
              retention_ms: int | None, base: int | None) -> dict[str, str] | None:
    """The tags of a file an image commit adds for an interval (None: its facts are not known).
    ``base``: the table version the commit was made on (later commits of the interval: higher)."""
    if pending is None:
        return None
    return {FACTS_TAG: json.dumps({"v": _FACTS_VERSION, "oldest": oldest, "next_proc": next_proc,
                                   "pending": int(pending), "seq": int(sequencer), "retention_ms": retention_ms,
                                   "base": -1 if base is None else int(base)}, sort_keys=True)}


def _facts(entries: Sequence[FileEntry], retention_ms: int | None) -> tuple[dict[str, Any], list[FileEntry]] | None:
    """The facts the newest image commit recorded for an interval and the claim files beside them, or
    None (read the files): a file of another writer (gc's fold, the MERGE path, a tool), a deletion
    vector, checkpoints held, another dedup retention, or facts of an unknown form."""
    tagged: list[tuple[FileEntry, dict[str, Any]]] = []
    claims: list[FileEntry] = []
    for f in entries:
        if f.has_deletion_vector:
            return None
        raw = ((json.loads(f.action_json).get("add") or {}).get("tags") or {}).get(FACTS_TAG)
        if raw is not None:
            tagged.append((f, json.loads(raw)))
        elif decode_path(f.path).endswith("-claim.snappy.parquet"):
            claims.append(f)
        else:
            return None
    if not tagged:
        return None
    # the newest commit's (a checkpoint's files all have its version as added_at: ordered by base)
    newest = max(fa.get("base", -1) for _f, fa in tagged)
    facts = [fa for _f, fa in tagged if fa.get("base", -1) == newest]
    got = facts[0]
    if any(fa != got for fa in facts) or got.get("v") != _FACTS_VERSION or got.get("pending") != 0 \
            or got.get("retention_ms") != retention_ms:
        return None
    return got, claims


@dataclass(kw_only=True)
class Checkpoint:
    """One interval's checkpointed productions of one stream, found by the recovery scan."""

    stream: str
    interval: int
    version: int | None  # the rows commit that checkpointed them (an upper bound unless exact; None: unknown)
    exact: bool  # ``version`` is that commit's own (looked up by ``commit_id``), not a bound
    commit_id: str | None  # that commit's id, its delivery's commit_id column (None: several commits')
    prods: list[Production]


@dataclass
class Recovery:
    """The recovery scan: work per interval, checkpoints to deliver by append (known commit) or MERGE."""

    oldest: dict[int, int | None]
    next_processing: dict[int, int | None]
    appends: list[Checkpoint]
    merge: list[Checkpoint]


def scan(root: TableFiles, files: Mapping[int, Sequence[FileEntry]], *, name: str, sequencers: Mapping[int, int],
         retention_ms: int | None, use_facts: bool = True) -> tuple[Recovery, list[Checkpoint]]:
    """The recovery scan of the images ``files``, with every checkpoint they hold (see :func:`resolve`);
    StaleSequencerError: an image's fence row carries a newer sequencer (checked first). ``use_facts``:
    take an interval's facts from its files' tags where they hold (the module's docstring)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = ["key", "sequencer", "next_event_timer_ms", "next_processing_timer_ms", "watermark_hold_ms", "pending",
            "commit_id", "record_ids", "updated_ms"]
    out = Recovery({}, {}, [], [])
    checkpoints: list[Checkpoint] = []
    for iv, entries in sorted(files.items()):
        known = _facts(entries, retention_ms) if use_facts and entries else None
        if known is not None:
            facts, claims = known
            fences = [facts["seq"]] + [pc.max(root.read_parquet(decode_path(f.path), columns=["sequencer"])
                                              .column("sequencer")).as_py() for f in claims]
            raise_if_fenced(name, {iv: max(s for s in fences if s is not None)}, {iv: sequencers[iv]})
            out.oldest[iv], out.next_processing[iv] = facts["oldest"], facts["next_proc"]
            continue
        # (plain files: :meth:`~.path.ImagePath.acquire` purged any deletion vector before the scan)
        parts = [root.read_parquet(decode_path(f.path), columns=cols) for f in entries]
        if not parts:
            out.oldest[iv] = out.next_processing[iv] = None
            continue
        image = pa.concat_tables(parts, promote_options="permissive")
        fence = pc.max(image.filter(pc.equal(image.column("key"), FENCE_KEY)).column("sequencer")).as_py()
        if fence is not None:
            raise_if_fenced(name, {iv: fence}, {iv: sequencers[iv]})
        out.oldest[iv] = oldest_work(image)
        out.next_processing[iv] = next_processing(image, retention_ms)
        found: dict[str, Checkpoint] = {}
        for f, part in zip(entries, parts, strict=True):
            has = pc.fill_null(pc.greater(pc.list_value_length(part.column("pending")), 0), False)
            held = part.filter(has)
            for lst, cid in zip(held.column("pending").to_pylist(), held.column("commit_id").to_pylist(),
                                strict=True):
                for row in lst:
                    prod = Production.from_row(row)
                    c = found.get(prod.stream)
                    if c is None:
                        c = found[prod.stream] = Checkpoint(stream=prod.stream, interval=iv,
                                                            version=f.added_at, exact=False, commit_id=cid,
                                                            prods=[])
                    else:
                        if c.commit_id != cid:
                            c.commit_id = None  # rows of several commits (not written by this path)
                        c.version = None if c.version is None or f.added_at is None else \
                            max(c.version, f.added_at)
                    c.prods.append(prod)
        checkpoints += found.values()
    return out, checkpoints


def resolve(rows_files: TableFiles, c: Checkpoint, delivered: int, *, name: str) -> bool | None:
    """Whether checkpoint ``c`` is still to deliver: None (delivered), True (as its commit's own delivery;
    ``c.version`` becomes that commit's) or False (by insert-only MERGE). Its commit absent from a complete
    log between the stream's version and the bound means delivered (a later commit clears checkpoints)."""
    if c.version is None or c.commit_id is None:
        return False
    present = set(json_commit_versions(rows_files) or ())
    for v in range(c.version, delivered, -1):  # newest first: usually the bound itself
        if v not in present:
            return False  # the log was cleaned up past it: cannot tell
        metas = batch_metas(user_metadata((commit_info(rows_files, v) or {}).get("userMetadata")))
        meta = next((m for m in metas if m.get("commit_id") == c.commit_id), None)  # a group commit's batches each
        if meta is not None:
            if meta.get("kind") == "commit" and meta.get("write_path") == "image" \
                    and meta.get("computation") == name:
                c.version, c.exact = v, True
                return True
            return False
    return None if delivered >= 0 else False
