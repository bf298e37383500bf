"""Intervals that move between job instances: exact input positions, the skip rule and catch-up.

Several instances (separate Spark applications) may share a computation's intervals; each reads
the whole input with its own streaming query (its checkpoint: ``_checkpoints/{pipeline}/{comp}/
{instance}``) and processes the records of the intervals it holds. When an interval moves from
A to B, B's input position is not the interval's committed one. Positions are kept exactly, at
file granularity (Spark's file source reads whole files per micro-batch): each interval's fence
row holds the input files committed for it (``statestore/rowtable/inputfiles.py``), added by the
same transaction as the batch's rows, on both write paths. Two rules make a move exact:

* **Skip**: a record of interval I whose input file is in I's set was processed by an earlier
  owner; it is dropped before the batch (counted as ``skipped_moved``). That covers B *behind*.
* **Catch-up**: on taking intervals, the files B's own query already consumed (its checkpoint's
  file source log, committed batches only) that are missing from a taken interval's set are
  read as a batch and processed for that interval only (the skip rule, applied to them) before
  B's next regular batch. That covers B *ahead*.

Restriction: the computation reads one :class:`ParquetInjector` and keys by its key column
(``RECORD_KEY``); other inputs (Delta stream tables, Delta injectors: their streaming source
logs table versions, not files) are refused with :class:`ConfigError`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import unquote, urlparse

from deltawheel.statestore.exceptions import ConfigError

from ..computation import RECORD_KEY, Computation
from ..tasks.merge import interval_of_key
from .sources import Injector, ParquetInjector

__all__ = ["SharedInput", "CATCH_UP_BATCH", "files_read", "source_log_files", "shared_input"]

CATCH_UP_BATCH = -1  # the batch id of a catch-up batch (reports, commit ids)
_COMPACT = re.compile(r"^(\d+)(\.compact)?$")


def source_log_files(checkpoint: str, *, source: int = 0, committed_only: bool = True) -> dict[int, list[str]]:
    """Batch id -> the names of the files Spark's file source read in it, for the batches the
    query *committed* (``<checkpoint>/commits/N``; every logged batch with ``committed_only=False``),
    from ``<checkpoint>/sources/<source>/`` (its JSON-lines log, ``.compact`` files included). A
    local checkpoint; missing: {}."""
    root = _local(checkpoint)
    logdir = os.path.join(root, "sources", str(source))
    commits = os.path.join(root, "commits")
    if not os.path.isdir(logdir):
        return {}
    done = {int(n) for n in os.listdir(commits) if n.isdigit()} if os.path.isdir(commits) else set()
    names = [(int(m.group(1)), n) for n in os.listdir(logdir) if (m := _COMPACT.match(n))]
    out: dict[int, list[str]] = {}
    for _, name in sorted(names):
        with open(os.path.join(logdir, name), encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue  # the version line ("v1")
                entry = json.loads(line)
                bid = int(entry["batchId"])
                if bid in done or not committed_only:
                    out.setdefault(bid, [])
                    base = unquote(os.path.basename(urlparse(entry["path"]).path))
                    if base not in out[bid]:
                        out[bid].append(base)
    return out


def files_read(checkpoint: str) -> frozenset[str]:
    """The names of every file a query's file sources logged (batches run or running), all its
    sources together: what an injector estimating from its pending files leaves out."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        raise ConfigError(f"watermark_percentile reads the query checkpoint's file log, which must be local for "
                          f"now; {checkpoint} is not (use watermark_delay_ms alone there)")
    root = _local(checkpoint)
    srcs = os.path.join(root, "sources")
    out: set[str] = set()
    for src in (int(n) for n in (os.listdir(srcs) if os.path.isdir(srcs) else ()) if n.isdigit()):
        for names in source_log_files(checkpoint, source=src, committed_only=False).values():
            out.update(names)
    return frozenset(out)


def _local(uri: str) -> str:
    if uri.startswith("file:"):
        return urlparse(uri).path
    if "://" in uri:
        raise ConfigError(f"sharing intervals between instances reads the query checkpoint's file log, which "
                          f"must be local for now; {uri} is not")
    return uri


def shared_input(comp: Computation, injectors: Mapping[str, Injector]) -> tuple[str, ParquetInjector]:
    """(stream, injector) of a computation whose intervals instances may share.

    Raises:
        ConfigError: it does not read exactly one Parquet injector by its key column.
    """
    if len(comp.inputs) == 1:
        ((stream, extractor),) = comp.inputs.items()
        inj = injectors.get(stream)
        if isinstance(inj, ParquetInjector) and extractor == RECORD_KEY:
            return stream, inj
    raise ConfigError(f"{comp.name}: instances can share a computation's intervals only when it reads one "
                      f"Parquet injector keyed by the injector's key column (inputs: {dict(comp.inputs)}); the "
                      "input position of a moved interval is kept per input file, and other sources (Delta "
                      "stream tables, Delta injectors) give no file positions. Run it as one instance "
                      "(no instance name), or feed it from a Parquet injector")


def file_column() -> Any:
    """The input file name of a stream-schema record of a Parquet injector (its ``commit_id``
    is ``file={name}#row={n}``)."""
    from pyspark.sql import functions as F

    return F.regexp_extract(F.col("commit_id"), r"^file=(.*)#row=[0-9]+$", 1)


@dataclass
class SharedInput:
    """One computation's input when instances share its intervals: what the executor needs for
    the skip rule and catch-up.

    ``done``: per interval held, the files processed for it (read from the fence rows when the
    interval is taken, grown by every commit of this instance)."""

    stream: str
    injector: ParquetInjector
    checkpoint: str
    num_intervals: int
    done: dict[int, frozenset[str]] = field(default_factory=dict)

    def batch_files(self, batch_id: int) -> list[str]:
        """The files of the query's micro-batch ``batch_id`` (the file source logs a batch before
        running it); raises if the log does not name it."""
        files = source_log_files(self.checkpoint, committed_only=False).get(batch_id)
        if files is None:
            raise ConfigError(f"micro-batch {batch_id} is not in the file source log of {self.checkpoint}: this "
                              "executor's batches must come from the query whose checkpoint that is")
        return files

    def skip(self, df: Any, files: Iterable[str], intervals: Sequence[int]) -> tuple[Any, int]:
        """(``df`` without the records of an interval whose file is in its set, how many were dropped)."""
        from pyspark.sql import functions as F

        files = set(files)
        cond = None
        for iv in intervals:
            seen = sorted(self.done.get(iv, frozenset()) & files)
            if seen:
                c = (interval_of_key(self.num_intervals) == F.lit(iv)) & file_column().isin(seen)
                cond = c if cond is None else cond | c
        if cond is None:
            return df, 0
        cond = F.coalesce(cond, F.lit(False))
        skipped = df.where(cond).count()
        return df.where(~cond), skipped

    def committed(self, files: Iterable[str], intervals: Iterable[int]) -> None:
        """A batch of ``files`` committed for ``intervals``."""
        files = frozenset(files)
        for iv in intervals:
            self.done[iv] = self.done.get(iv, frozenset()) | files

    def missing(self, intervals: Iterable[int]) -> list[str]:
        """The files this instance's query consumed (committed batches) that some of ``intervals``
        has not processed: what a catch-up batch reads."""
        consumed = set().union(*source_log_files(self.checkpoint).values())
        out: set[str] = set()
        for iv in intervals:
            out |= consumed - self.done.get(iv, frozenset())
        return sorted(out)

    def files_df(self, spark: Any, files: Sequence[str]) -> Any:
        """The records of ``files`` as the stream frame the query gives (``stream`` column included)."""
        from pyspark.sql import functions as F

        return self.injector.files_df(spark, files).withColumn("stream", F.lit(self.stream))
