"""What a replay's input is: the live store's stream tables (local or on an object store) and
the data files its planned batches read (``drivers/replay.py``)."""

from __future__ import annotations

import os
from typing import Any, Sequence

from deltawheel.statestore.exceptions import InputGoneError
from deltawheel.statestore.inspection.positions import ComputationCommit
from deltawheel.statestore.layout import StoreLayout

__all__ = ["stream_exists", "check_inputs", "input_bytes"]


def stream_exists(spark: Any, store: StoreLayout, stream: str) -> bool:
    """``stream`` is a stream table of ``store`` (on an object store: its Delta log has a commit)."""
    if store.is_local:
        return os.path.isdir(store.stream(stream))
    from deltawheel.statestore.delta.log import local_table_exists
    from deltawheel.statestore.delta.storefs import table_files

    files = table_files(spark, store.stream(stream))
    return files is None or bool(local_table_exists(files))  # another scheme: Spark says when it reads


def _sizes(spark: Any, store: StoreLayout, streams: set[str]) -> dict[str, dict[str, int]] | None:
    """stream -> data file name -> size of the stream tables ``streams`` (one listing each; a
    local store's folders, an ``s3a://`` store's prefixes); None: another scheme (not listed)."""
    from deltawheel.statestore.delta.storefs import table_files

    out: dict[str, dict[str, int]] = {}
    for stream in sorted(streams):
        files = table_files(spark, store.stream(stream)) if not store.is_local else None
        if not store.is_local and files is None:
            return None
        if files is None:
            folder = store.stream(stream)
            names = os.listdir(folder) if os.path.isdir(folder) else []
            out[stream] = {n: os.path.getsize(os.path.join(folder, n)) for n in names}
        else:
            out[stream] = {n: size for n, size, _ in files.list_files() or []}
    return out


def check_inputs(spark: Any, store: StoreLayout, batches: Sequence[ComputationCommit]) -> dict[str, dict[str, int]] | None:
    """Refuse a plan whose batches read a stream-table data file that is gone (VACUUM after a
    compaction), naming the first version a replay can start from; returns the stream tables'
    data files and sizes (:func:`input_bytes`; None: not listed here).

    Raises:
        InputGoneError: a data file of a replayed batch is gone.
    """
    streams = {f.partition("/")[0] for c in batches for f in c.files or () if "/" in f}
    sizes = _sizes(spark, store, streams)
    if sizes is None:
        return None  # read when the batch runs (files_df raises it then)
    gone_at = None
    for c in batches:
        for f in c.files or ():
            stream, _, name = f.partition("/")
            if name and name not in sizes.get(stream, {}):
                gone_at = (c, f)
    if gone_at is not None:
        c, f = gone_at
        raise InputGoneError(f"the input of live batch {c.batch_id} (rows version {c.version}) is gone: {f} was removed "
                             f"from {store.root} (VACUUM after a compaction); replay from rows version {c.version} "
                             "or later (--from-version)")
    return sizes


def input_bytes(sizes: dict[str, dict[str, int]] | None, files: Sequence[str]) -> int | None:
    """The bytes of the stream-table data files ``files`` (``{stream}/{name}``); None: not known
    (not listed, or an injector's file among them: its folder is the injector's)."""
    if sizes is None:
        return None
    total = 0
    for f in files:
        stream, _, name = f.partition("/")
        if not name or name not in sizes.get(stream, {}):
            return None
        total += sizes[stream][name]
    return total
