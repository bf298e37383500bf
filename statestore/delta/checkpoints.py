"""A Delta table's newest complete checkpoint (classic, multi-part or V2), read with pyarrow."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator
from urllib.parse import unquote

from .storefs import TableFiles

__all__ = ["Checkpoint", "UnreadableCheckpoint", "newest_checkpoint", "checkpoint_actions", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint\..+")  # any checkpoint file, of any kind
_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_PART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\.(json|parquet)$")
# the actions a checkpoint holds that make up a snapshot (``remove`` rows are tombstones)
_KINDS = ("add", "metaData", "protocol", "txn", "sidecar")
_MAPS = frozenset({"partitionValues", "tags", "configuration", "options"})


class UnreadableCheckpoint(Exception):
    """A checkpoint this reader cannot read exactly (the caller asks Delta instead)."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its version and its files in ``_delta_log`` (one, or every part in order)."""

    version: int
    files: tuple[str, ...]


def newest_checkpoint(names: Iterable[str]) -> tuple[Checkpoint | None, bool]:
    """(the newest complete checkpoint among ``names``, or None; False: a newer one it cannot take).

    >>> c, ok = newest_checkpoint([f"{2:020d}.checkpoint.parquet", f"{4:020d}.checkpoint.0000000001.0000000002.parquet"])
    >>> (c.version, ok)
    (2, False)
    """
    whole: dict[int, tuple[str, ...]] = {}
    parts: dict[tuple[int, int], set[int]] = {}
    other: set[int] = set()
    for n in names:
        if (m := _CLASSIC.match(n)) or (m := _UUID.match(n)):
            whole.setdefault(int(m.group(1)), (n,))
        elif m := _PART.match(n):
            parts.setdefault((int(m.group(1)), int(m.group(3))), set()).add(int(m.group(2)))
        elif m := CHECKPOINT_NAME.match(n):
            other.add(int(m.group(1)))
    for (v, p), got in parts.items():
        if got == set(range(1, p + 1)):
            whole.setdefault(v, tuple(f"{v:020d}.checkpoint.{o:010d}.{p:010d}.parquet" for o in range(1, p + 1)))
        else:
            other.add(v)
    best = max(whole, default=-1)
    cp = Checkpoint(best, whole[best]) if best >= 0 else None
    return cp, not any(v > best for v in other)


def _clean(value: Any) -> Any:
    """A checkpoint struct (pyarrow ``to_pylist``) as the JSON Delta writes: no nulls, maps as objects."""
    if isinstance(value, dict):
        return {k: (dict(v) if k in _MAPS else _clean(v)) for k, v in value.items()
                if v is not None and not k.endswith("_parsed")}
    if isinstance(value, list):
        return [_clean(x) for x in value]
    return value


def _parquet_actions(log: TableFiles, name: str, kinds: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    pf = log.parquet_file(name)
    cols = [k for k in kinds if k in pf.schema_arrow.names]
    table = pf.read(columns=cols)
    for k in cols:
        for value in table.column(k).to_pylist():
            if value is not None:
                yield k, _clean(value)


def _json_actions(log: TableFiles, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    text = log.read_text(name)
    if text is None:
        raise UnreadableCheckpoint(f"{name} is gone")
    for line in text.splitlines():
        if line.strip():
            for k, value in json.loads(line).items():
                if k in _KINDS:
                    yield k, value


def checkpoint_actions(log: TableFiles, cp: Checkpoint) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, action) of every ``add``, ``metaData``, ``protocol`` and ``txn`` of ``cp``, sidecars included.
    Raises UnreadableCheckpoint: a sidecar named by a path outside ``_delta_log/_sidecars``."""
    sidecars: list[str] = []
    for name in cp.files:
        found = _json_actions(log, name) if name.endswith(".json") else _parquet_actions(log, name, _KINDS)
        for kind, action in found:
            if kind == "sidecar":
                sidecars.append(str(action["path"]))
            else:
                yield kind, action
    for path in sidecars:
        rel = unquote(path)
        if "/" in rel or ":" in rel:
            raise UnreadableCheckpoint(f"sidecar {path} of {cp.files[0]} is not in _delta_log/_sidecars")
        yield from _parquet_actions(log.sub("_sidecars"), rel, ("add",))
