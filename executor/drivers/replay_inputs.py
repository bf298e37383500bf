"""What a replay's input is; a gone input file is refused before anything is written."""

from __future__ import annotations

import os
from typing import Any, Sequence

from deltawheel.statestore.exceptions import ConfigError, InputGoneError
from deltawheel.statestore.inspection.positions import ComputationCommit
from deltawheel.statestore.layout import StoreLayout

from ..computation import Computation
from ..protocol.rescale import SharedInput, kafka_input, shared_input
from ..sources.injector import Injector

__all__ = ["stream_exists", "check_inputs", "input_bytes", "replay_input", "check_files"]


def stream_exists(spark: Any, store: StoreLayout, stream: str) -> bool:
    """``stream`` is a stream table of ``store``."""
    if store.is_local:
        return os.path.isdir(store.stream(stream))
    from deltawheel.statestore.delta.log import local_table_exists
    from deltawheel.statestore.delta.storefs import table_files

    files = table_files(spark, store.stream(stream))
    return files is None or bool(local_table_exists(files))  # another scheme: Spark says when it reads


def _sizes(spark: Any, store: StoreLayout, streams: set[str]) -> dict[str, dict[str, int]] | None:
    """stream -> data file name -> size, one listing each; None: a scheme not listed."""
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
    """Refuse (InputGoneError) a plan reading a gone stream-table file; returns the files and sizes."""
    streams = {f.partition("/")[0] for c in batches for f in c.files or () if "/" in f}
    sizes = _sizes(spark, store, streams)
    if sizes is None:
        return None  # read when the batch runs (files_df raises it then)
    for c, f in reversed([(b, f) for b in batches for f in b.files or ()]):  # the last gone one is named
        stream, _, name = f.partition("/")
        if name and name not in sizes.get(stream, {}):
            raise InputGoneError(f"the input of live batch {c.batch_id} (rows version {c.version}) is gone: "
                                 f"{f} was removed from {store.root} (VACUUM after a compaction); replay "
                                 f"from rows version {c.version} or later (--from-version)")
    return sizes


def replay_input(spark: Any, store: StoreLayout, into: StoreLayout, code: Computation,
                 injectors: Sequence[Injector]) -> SharedInput:
    """The input of a replay of ``code``; ConfigError for an injector not given or without positions."""
    by_name = {i.name: i for i in injectors}
    missing = [s for s in code.inputs if s not in by_name and not stream_exists(spark, store, s)]
    if missing:
        raise ConfigError(f"{code.name} reads {missing}, which are not stream tables of {store.root} but "
                          "injectors: give the live pipeline with --source MODULE:PIPELINE (what `deltawheel run` "
                          "takes), or pass them to replay(..., injectors=...)")
    unused = os.path.join(into.root, "_unused")  # the replay reads no query checkpoint
    try:
        return shared_input(code, by_name, table_of=store.stream, checkpoint=unused)
    except ConfigError:
        kafka = kafka_input(code, by_name, checkpoint=unused, table_of=store.stream)
        if kafka is None:
            raise
        return kafka


def check_files(inputs: SharedInput, batches: Sequence[ComputationCommit]) -> None:
    """Refuse (InputGoneError) a replay whose ``batches`` read a gone local input file."""
    for c in reversed(batches):  # the last batch with gone files is named
        lost = [f for f in c.files or () if inputs.gone(f)]
        if lost:
            folder = inputs.folder_of(lost[0])[0] or "its input"
            raise InputGoneError(
                f"{inputs.comp.name}: the input of live batch {c.batch_id} (rows version {c.version}) is "
                f"gone: {len(lost)} of its input files (e.g. {lost[0]}) are no longer in {folder}. A replay "
                "re-reads the input files of every batch it re-runs: restore them there (the same names; a "
                "replay stopped here continues when run again), or replay from rows version "
                f"{c.version} or later (--from-version {c.version})")


def input_bytes(sizes: dict[str, dict[str, int]] | None, files: Sequence[str]) -> int | None:
    """The bytes of the stream-table data files ``files``; None: not known."""
    if sizes is None:
        return None
    total = 0
    for f in files:
        stream, _, name = f.partition("/")
        if not name or name not in sizes.get(stream, {}):
            return None
        total += sizes[stream][name]
    return total
