"""Per interval, the input files whose records were committed, kept in the fence row's ``state`` and
added by each commit in the same transaction (docs/rescaling.md)."""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence

from ..exceptions import CodecError

__all__ = ["INPUT_FILES_FORMAT_VERSION", "POSITIONS_KEY", "encode", "decode", "union_payloads", "union_sql",
           "commit_entry", "no_input_entry", "entry_of", "kafka_of", "ran_of"]

INPUT_FILES_FORMAT_VERSION = 1
POSITIONS_KEY = "positions"  # the commit metadata entry of a batch's input positions
_STRUCT = "struct<format_version:int,input_files:array<string>>"


def encode(files: Iterable[str]) -> bytes:
    """The fence row payload for ``files``.

    >>> encode(["b", "a", "b"])
    b'{"format_version":1,"input_files":["a","b"]}'
    >>> sorted(decode(encode(["b", "a"])))
    ['a', 'b']
    """
    return json.dumps({"format_version": INPUT_FILES_FORMAT_VERSION, "input_files": sorted(set(files))},
                      separators=(",", ":")).encode()


def decode(payload: bytes | None) -> frozenset[str]:
    """The files of a fence row payload (None or empty: none).
    Raises CodecError: not a payload of this format (or written by a newer deltawheel)."""
    if not payload:
        return frozenset()
    try:
        raw = json.loads(bytes(payload).decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"a fence row's input-file set is not JSON ({exc}); the rows table was written by "
                         "something else than deltawheel, or is damaged (docs/store-damage.md)") from exc
    if not isinstance(raw, dict) or raw.get("format_version") != INPUT_FILES_FORMAT_VERSION:
        raise CodecError(f"a fence row's input-file set has format_version "
                         f"{raw.get('format_version') if isinstance(raw, dict) else None!r}, this deltawheel "
                         f"reads {INPUT_FILES_FORMAT_VERSION}: upgrade deltawheel")
    return frozenset(str(f) for f in raw.get("input_files") or ())


def union_payloads(payloads: Iterable[bytes | None], added: Iterable[str] = ()) -> bytes | None:
    """One payload holding every file of ``payloads`` and ``added`` (None: no file at all)."""
    files = set(added).union(*(decode(p) for p in payloads))
    return encode(files) if files else None


def union_sql(target: str, source: str) -> str:
    """A Spark SQL expression: the union of the payload columns ``target`` and ``source``."""
    def files(col: str) -> str:
        return (f"coalesce(from_json(CAST({col} AS STRING), '{_STRUCT}').input_files, "
                "CAST(array() AS ARRAY<STRING>))")

    both = f"array_sort(array_distinct(concat({files(target)}, {files(source)})))"
    return (f"CASE WHEN {target} IS NULL AND {source} IS NULL THEN CAST(NULL AS BINARY) ELSE "
            f"CAST(to_json(named_struct('format_version', {INPUT_FILES_FORMAT_VERSION}, 'input_files', {both})) "
            "AS BINARY) END")


def commit_entry(batch_id: int, files: Iterable[str], *,
                 kafka: Mapping[str, Mapping[str, Sequence[int]]] | None = None,
                 intervals: Iterable[int] | None = None) -> dict[str, object]:
    """The commit metadata entry recording a batch's input positions, which replay reads back.

    ``kafka``: ``{topic: {partition: [start, end)}}``; ``intervals``: the intervals the batch held.

    >>> commit_entry(3, ["b", "a"])
    {'positions': {'v': 1, 'batch_id': 3, 'files': ['a', 'b']}}
    >>> entry_of(commit_entry(3, ["b", "a"]))
    (3, ('a', 'b'))
    >>> ran_of(commit_entry(3, ["a"], intervals=[2, 0]))
    ((0, 2), ('a',))
    """
    entry: dict[str, object] = {"v": INPUT_FILES_FORMAT_VERSION, "batch_id": int(batch_id), "files": sorted(set(files))}
    if kafka is not None:
        entry["kafka"] = {t: {str(p): [int(r[0]), int(r[1])] for p, r in parts.items()} for t, parts in kafka.items()}
    if intervals is not None:
        entry["intervals"] = sorted({int(iv) for iv in intervals})
    return {POSITIONS_KEY: entry}


def ran_of(meta: object) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """(the intervals a committed batch held, its input files); None: no intervals recorded.

    >>> ran_of(commit_entry(3, ["a"])) is None
    True
    """
    if not isinstance(meta, dict) or not isinstance(meta.get(POSITIONS_KEY), dict):
        return None
    e = meta[POSITIONS_KEY]
    if e.get("v") != INPUT_FILES_FORMAT_VERSION or not isinstance(e.get("intervals"), list):
        return None
    return tuple(int(iv) for iv in e["intervals"]), tuple(str(f) for f in e.get("files") or ())


def kafka_of(meta: object) -> dict[str, dict[str, tuple[int, int]]] | None:
    """The Kafka offset ranges a commit's positions entry records (None: none).

    >>> kafka_of(commit_entry(3, [], kafka={"t": {"0": [5, 9]}}))
    {'t': {'0': (5, 9)}}
    """
    if not isinstance(meta, dict) or not isinstance(meta.get(POSITIONS_KEY), dict):
        return None
    got = meta[POSITIONS_KEY].get("kafka")
    if not isinstance(got, dict):
        return None
    return {str(t): {str(p): (int(r[0]), int(r[1])) for p, r in parts.items()} for t, parts in got.items()}


def no_input_entry() -> dict[str, object]:
    """The positions entry of a commit that read no input: no batch, no file.

    >>> entry_of(no_input_entry())
    (None, ())
    """
    return {POSITIONS_KEY: {"v": INPUT_FILES_FORMAT_VERSION, "batch_id": None, "files": []}}


def entry_of(meta: object) -> tuple[int | None, tuple[str, ...]] | None:
    """(batch id, input files) of a commit's parsed metadata (None: none; batch id None: no input).
    Raises CodecError: an entry of a newer format."""
    if not isinstance(meta, dict) or not isinstance(meta.get(POSITIONS_KEY), dict):
        return None
    e = meta[POSITIONS_KEY]
    if e.get("v") != INPUT_FILES_FORMAT_VERSION:
        raise CodecError(f"a commit's input positions have format {e.get('v')!r}, this deltawheel reads "
                         f"{INPUT_FILES_FORMAT_VERSION}: upgrade deltawheel")
    return (None if e.get("batch_id") is None else int(e["batch_id"])), tuple(str(f) for f in e.get("files") or ())
