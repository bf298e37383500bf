"""What gc keeps of its reads of each rows table's log in ``<store>/_gc/`` (local stores only):
``ran_in_log.json`` (what each interval ran) and ``audit_checked.json``; each used only while its last
commit is in the log with the same bytes, so the next gc opens only the commits after it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.delta.log import batch_metas, commit_info_in, json_commit_versions, log_files
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.inputfiles import ran_of

__all__ = ["RanLog", "ran_in_log", "read_ran", "save_ran", "saved_path", "RAN_LOG_FORMAT_VERSION",
           "AUDIT_MARK_FORMAT_VERSION", "checked_upto", "mark_path", "save_checked", "table_of"]

RAN_LOG_FORMAT_VERSION = 1
AUDIT_MARK_FORMAT_VERSION = 1

_LOG = logging.getLogger(__name__)

Ran = Mapping[str, Mapping[int, frozenset[str]]]  # computation -> interval -> input files it ran


@dataclass(frozen=True)
class RanLog:
    """What the JSON commits up to ``upto`` (-1: none; ``fingerprint``: its SHA-256) say was ``ran``."""

    ran: Ran
    upto: int = -1
    fingerprint: str | None = None
    read: int = 0


def table_of(layout: StoreLayout, computation: str | None = None) -> str:
    """The rows table gc's marks of ``computation`` are about (None: the store's first rows table)."""
    return layout.rows if computation is None else layout.rows_of(computation)


def saved_path(layout: StoreLayout, computation: str | None = None) -> str | None:
    """Where gc keeps the evidence it read of :func:`table_of` ``computation`` (None: not a local store)."""
    return _kept_path(layout, "ran_in_log.json", computation)


def mark_path(layout: StoreLayout, computation: str | None = None) -> str | None:
    """Where gc keeps the audit check's version of :func:`table_of` ``computation`` (None: not local)."""
    return _kept_path(layout, "audit_checked.json", computation)


def ran_in_log(rows: str) -> dict[str, dict[int, frozenset[str]]]:
    """computation -> interval -> input files, as the JSON commits of the rows table ``rows`` say ({}: unreadable)."""
    return {c: dict(per) for c, per in _read(rows, after=-1, ran={}).ran.items()}


def read_ran(layout: StoreLayout, *, computation: str | None = None, since: RanLog | None = None) -> RanLog:
    """``since`` (else the saved evidence, where still valid) plus the commits after its ``upto``."""
    start = since if since is not None else _load(layout, computation)
    return _read(table_of(layout, computation), after=start.upto, ran=start.ran, fingerprint=start.fingerprint,
                 read=start.read if since is None else 0)


def save_ran(layout: StoreLayout, got: RanLog, *, computation: str | None = None,
             forget: Mapping[str, Iterable[str]] | None = None) -> bool:
    """Keep ``got`` for the next gc, without ``forget``'s names; False: not kept (e.g. a remote store)."""
    path = saved_path(layout, computation)
    if path is None or got.upto < 0 or got.fingerprint is None:
        return False
    drop = {c: frozenset(names) for c, names in (forget or {}).items()}
    ran = {c: {str(iv): sorted(fs - drop.get(c, frozenset())) for iv, fs in sorted(per.items())}
           for c, per in sorted(got.ran.items())}
    doc = {"format_version": RAN_LOG_FORMAT_VERSION, "upto": got.upto, "fingerprint": got.fingerprint, "ran": ran}
    return _keep_json(path, doc, what="the input_sets evidence")


def checked_upto(layout: StoreLayout, computation: str | None = None) -> int | None:
    """The kept version up to which every tool commit has its audit row; None: read every commit."""
    doc = _kept_doc(mark_path(layout, computation), AUDIT_MARK_FORMAT_VERSION)
    return None if doc is None or not _unchanged(layout, doc, computation) else int(doc["upto"])


def save_checked(layout: StoreLayout, upto: int, computation: str | None = None) -> bool:
    """Keep ``upto`` (a version of :func:`table_of` ``computation``) for the next gc; False: not kept."""
    path, log = mark_path(layout, computation), log_files(table_of(layout, computation))
    if path is None or log is None or upto < 0:
        return False
    if (text := log.read_text(f"{upto:020d}.json")) is None:
        return False
    doc = {"format_version": AUDIT_MARK_FORMAT_VERSION, "upto": upto, "fingerprint": _fingerprint(text)}
    return _keep_json(path, doc, what="the audit check's version")


def _kept_path(layout: StoreLayout, name: str, computation: str | None) -> str | None:
    if not layout.is_local:
        return None
    folder = os.path.join(layout.root.removeprefix("file://").removeprefix("file:"), "_gc")
    if computation is not None:
        table_of(layout, computation)  # a valid name: no path outside _gc/
        folder = os.path.join(folder, "computations", computation)
    return os.path.join(folder, name)


def _keep_json(path: str, doc: Mapping[str, Any], *, what: str) -> bool:
    """Write ``doc`` to ``path`` aside, then rename; False, with a warning naming ``what``, on failure."""
    staged = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(staged, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, separators=(",", ":"))
        os.replace(staged, path)
    except OSError as exc:
        _LOG.warning("deltawheel gc: could not keep %s in %s (%s); the next gc reads every commit of the rows "
                     "table's log", what, path, exc)
        with suppress(OSError):
            os.unlink(staged)
        return False
    return True


def _kept_doc(path: str | None, format_version: int) -> dict[str, Any] | None:
    """The document kept at ``path`` with an int ``upto`` and a str ``fingerprint`` (None: none, or not ours)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict) or doc.get("format_version") != format_version:
            return None
        doc["upto"], doc["fingerprint"] = int(doc["upto"]), str(doc["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return doc


def _unchanged(layout: StoreLayout, doc: Mapping[str, Any], computation: str | None) -> bool:
    """Whether the commit ``doc`` names is in the log of :func:`table_of` ``computation`` with the same bytes."""
    log = log_files(table_of(layout, computation))
    text = None if log is None else log.read_text(f"{doc['upto']:020d}.json")
    return text is not None and _fingerprint(text) == doc["fingerprint"]


def _fingerprint(text: str) -> str:
    """The SHA-256 of a JSON commit's text: the same commit of the same log, or not."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _load(layout: StoreLayout, computation: str | None) -> RanLog:
    """The saved evidence if valid for the log now, else none (upto -1); ``read`` counts the check."""
    if (doc := _kept_doc(saved_path(layout, computation), RAN_LOG_FORMAT_VERSION)) is None:
        return RanLog({})
    try:
        ran = {str(c): {int(iv): frozenset(str(n) for n in names) for iv, names in per.items()}
               for c, per in doc["ran"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):  # not ours: the full read
        return RanLog({})
    if not _unchanged(layout, doc, computation):  # another log, or that commit cleaned up
        return RanLog({}, read=1)
    return RanLog(ran, doc["upto"], doc["fingerprint"], read=1)


def _read(rows: str, *, after: int, ran: Ran, fingerprint: str | None = None, read: int = 0) -> RanLog:
    """``ran`` plus the evidence of the JSON commits of ``rows`` after version ``after``."""
    log = log_files(rows)
    versions = json_commit_versions(rows)
    if log is None or versions is None:  # a remote table: its log is not read here
        return RanLog(ran, after, fingerprint, read)
    out: dict[str, dict[int, set[str]]] = {c: {iv: set(fs) for iv, fs in per.items()} for c, per in ran.items()}
    upto = after
    for v in (v for v in versions if v > after):
        name = f"{v:020d}.json"
        text = log.read_text(name)
        if text is None:  # cleaned up since the listing: it says nothing (as a commit cleaned before)
            continue
        read += 1
        upto, fingerprint = v, _fingerprint(text)
        _fold(out, commit_info_in(log.path(name), text.splitlines()))
    return RanLog({c: {iv: frozenset(fs) for iv, fs in per.items()} for c, per in out.items()}, upto, fingerprint,
                  read)


def _fold(out: dict[str, dict[int, set[str]]], info: Mapping[str, Any] | None) -> None:
    """Add what one commit's ``commitInfo`` says its batch's intervals ran."""
    try:
        meta = json.loads((info or {}).get("userMetadata") or "{}")
    except ValueError:
        return
    for batch in batch_metas(meta if isinstance(meta, dict) else None):  # a group commit's each
        got = ran_of(batch)
        if got is None or not isinstance(batch.get("computation"), str):
            continue
        ivs, files = got
        comp = out.setdefault(batch["computation"], {})
        for iv in ivs:
            comp.setdefault(iv, set()).update(files)
