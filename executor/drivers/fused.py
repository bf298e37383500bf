"""Fused stages: a computation run in its upstream's micro-batch, on the stream-table versions that
batch's delivery committed, with no query of its own (``Pipeline.fused``; docs/continuous.md, "Fused
stages").

Its position is a small file in its query checkpoint folder, written ahead of each batch as Spark's
offset log is: ``fused.json`` holds the batch id, the versions ``[first, stop)`` of its input table it
reads, and ``done`` once the batch returned (its commit landed). A batch that did not finish runs
again with the same id on the same versions, as Spark replays a planned micro-batch: its record ids
drop what landed, its lateness is judged as at its first attempt. Its commits record the files read,
as an unfused stage's do, so replay, promote and repair read a fused stage's commits alike.

Only the driver holding the stage's leases moves the position: each write first reads the file back,
and a position other than the one this driver last wrote means another driver took the stage over
(this one was stopped past its ZooKeeper session, a zombie): it stops with ``StaleSequencerError``
instead of moving the new owner's position back. Its commits are fenced by their sequencers."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from deltawheel.statestore.delta.log import latest_local_version
from deltawheel.statestore.delta.sourceoffsets import add_file_name, source_boundary, version_adds
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import ConfigError, InputGoneError, StaleSequencerError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import stream_schema_ddl

from ..computation import RECORD_KEY, Computation
from ..protocol.host import BatchInputs
from ..protocol.reports import BatchReport
from ..tasks.image.direct import table_source
from .inputs import query_of, upstream_caps
from .pipeline import Pipeline
from .stage import Stage

__all__ = ["FUSED_FILE", "FusedBatch", "FusedFeed", "refuse_unfused", "feed_downstream", "fused_batch",
           "fused_in_process"]

FUSED_FILE = "fused.json"


@dataclass(frozen=True)
class FusedBatch:
    """A fused stage's batch: its id and the input table's versions ``first`` .. ``stop - 1``."""

    batch_id: int
    first: int
    stop: int
    done: bool

    def text(self) -> str:
        """As ``fused.json`` holds it."""
        return json.dumps({"format_version": 1, "batch_id": self.batch_id, "first": self.first, "stop": self.stop,
                           "done": self.done})


def _read(chk: TableFiles) -> FusedBatch | None:
    text = chk.read_text(FUSED_FILE)
    if text is None:
        return None
    d = json.loads(text)
    return FusedBatch(int(d["batch_id"]), int(d["first"]), int(d["stop"]), bool(d["done"]))


def refuse_unfused(files: Callable[[str], TableFiles | None], layout: StoreLayout, pipeline: Pipeline,
                   names: Iterable[str]) -> None:
    """ConfigError, before anything starts, if one of ``names`` is not fused in ``pipeline`` but ran fused
    before: its own query's offsets are behind what it read, and it would read that input again."""
    fused = pipeline.fused_into()
    for name in names:
        checkpoint = query_of(layout, pipeline.name, name)[0]
        chk = None if name in fused else files(checkpoint)
        last = None if chk is None else _read(chk)
        if last is not None:
            raise ConfigError(f"pipeline {pipeline.name}: {name} ran fused to its upstream (its input read up to "
                              f"version {last.stop - 1}, in {checkpoint}/{FUSED_FILE}); its own query would read "
                              f"that input again: run the pipeline with the same fused=, or replay {name} into a "
                              "new store")


def fused_in_process(pipeline: Pipeline, *, wanted: Iterable[str], instance: str | None) -> dict[str, str]:
    """``pipeline.fused_into()`` for a run of the computations ``wanted`` in one process; ConfigError if
    instances share the intervals or ``wanted`` splits a fused pair (fused stages run in one process)."""
    fused, wanted = pipeline.fused_into(), set(wanted)
    split = sorted(f"{u} -> {d}" for d, u in fused.items() if (d in wanted) != (u in wanted))
    if fused and instance is not None:
        raise ConfigError(f"pipeline {pipeline.name}: fused stages run in one process; instances sharing the "
                          f"intervals (instance={instance!r}) run the pipeline unfused")
    if split:
        raise ConfigError(f"pipeline {pipeline.name}: fused stages run in one process: {', '.join(split)} is "
                          "split by computations=")
    return fused


class FusedFeed:
    """A fused computation's input: what its upstream delivered since its last batch, and its position."""

    def __init__(self, spark: Any, layout: StoreLayout, comp: Computation, *, checkpoint: str,
                 files: Callable[[str], TableFiles | None], direct_read: bool = True) -> None:
        self.spark, self.comp = spark, comp
        self.stream = next(iter(comp.inputs))
        self.table = layout.stream(self.stream)
        chk, tbl = files(checkpoint), files(self.table)
        if chk is None or tbl is None:
            raise ConfigError(f"{comp.name}: a fused stage needs its store on a local folder or s3a:// "
                              f"({checkpoint})")
        self._chk, self._tbl = chk, tbl
        self.by_key = direct_read and list(comp.inputs.values()) == [RECORD_KEY]
        self._written = _read(chk)  # what the file holds, as far as this driver knows
        self.last = self._written or self._from_query()

    def _from_query(self) -> FusedBatch:
        """Where the computation's own query left its input (none: nothing read, from version 0)."""
        offsets = sorted(int(n) for n in self._chk.listdir("offsets") or () if n.isdigit())
        commits = {int(n) for n in self._chk.listdir("commits") or () if n.isdigit()}
        if not offsets:
            return FusedBatch(-1, 0, 0, True)
        last = offsets[-1]
        stop = source_boundary(self._chk, last, self._tbl)
        first = 0 if last == 0 else source_boundary(self._chk, last - 1, self._tbl)
        if stop is None or first is None:
            raise ConfigError(f"{self.comp.name}: its query's micro-batch {last} read inside a version of "
                              f"{self.table} (its first snapshot): run it unfused until a later micro-batch "
                              "committed, then fused")
        return FusedBatch(last, first, stop, last in commits)

    def consumed(self, version: int) -> bool:
        """Whether every version up to ``version`` was read by a finished batch."""
        return self.last.done and self.last.stop > version

    def more(self) -> bool:
        """Whether a batch is unfinished or a version was delivered since the last one."""
        latest = latest_local_version(self._tbl)
        return not self.last.done or (latest is not None and latest >= self.last.stop)

    def plan(self) -> FusedBatch | None:
        """The unfinished batch again, else one over the versions delivered since (None: nothing new);
        written before it runs."""
        if not self.last.done:
            return self.last
        latest = latest_local_version(self._tbl)
        if latest is None or latest < self.last.stop:
            return None
        planned = FusedBatch(self.last.batch_id + 1, self.last.stop, latest + 1, False)
        self._write(planned)
        return planned

    def finished(self, batch: FusedBatch) -> None:
        """``batch`` returned: its commit landed."""
        self._write(replace(batch, done=True))

    def _write(self, batch: FusedBatch) -> None:
        """``batch`` as the position, unless another driver moved it since this one last wrote it."""
        now = _read(self._chk)
        if now != self._written:
            raise StaleSequencerError(f"{self.comp.name}: its fused position is batch {now.batch_id if now else None} "
                                      f"(versions {now.first if now else 0}..), not batch {self.last.batch_id} as "
                                      "this driver wrote it: another driver took the stage over, this one stops "
                                      "without writing it")
        self._chk.write_text(FUSED_FILE, batch.text())
        self.last = self._written = batch

    def frame(self, batch: FusedBatch) -> tuple[Any, tuple[dict[str, Any], ...], list[str]]:
        """(the batch's input frame, or None: no file; its adds; its positions, as commits record them)."""
        from pyspark.sql import functions as F

        adds = version_adds(self._tbl, batch.first, batch.stop, skip_changes=True)
        if adds is None:
            raise InputGoneError(f"{self.comp.name}: versions {batch.first}..{batch.stop - 1} of {self.table} can no "
                                 "longer be read as appends (a log file gone, or a rewrite); its fused batch "
                                 f"{batch.batch_id} cannot run")
        adds = tuple({"path": a["path"]} for a in adds)
        if not adds:
            return None, adds, []
        paths = [f"{self.table.rstrip('/')}/{urllib.parse.unquote(a['path'])}" for a in adds]
        df = self.spark.read.schema(stream_schema_ddl()).parquet(*paths).withColumn("stream", F.lit(self.stream))
        return df, adds, sorted({f"{self.stream}/{add_file_name(a)}" for a in adds})

    def run(self, ex: Any, read_caps: Callable[[], Mapping[str, int | None]]) -> tuple[BatchReport | None,
                                                                                      dict[str, int | None]]:
        """One batch of what was delivered since (its report, None: nothing to read; the caps acted on).
        The upstream watermarks are read before the table's newest version (every row they pass is in
        a version read); a batch run again acts on none it did not record (as a replayed micro-batch)."""
        again = not self.last.done
        caps = dict(read_caps())
        if again:
            caps = dict.fromkeys(caps)
        batch = self.plan()
        if batch is None:
            return None, caps
        df, adds, positions = self.frame(batch)
        if df is None:
            self.finished(batch)
            return None, caps
        direct = table_source(self.stream, self.table, checkpoint=None, adds=adds) if self.by_key else None
        ex.next_batch_inputs(BatchInputs(upstream_caps=caps, hold="from_commit", direct_source=direct))
        report = ex.run_batch(df, batch.batch_id, input_files=positions, background=True)
        self.finished(batch)
        return report, caps


def feed_downstream(stages: Mapping[str, Stage], fused_into: Mapping[str, str], upstream: str, *,
                    authority: Any, pipeline: Pipeline, failed: Callable[[Stage, BaseException], None]) -> None:
    """After a batch of ``upstream``: its delivery lands, then each computation fused to it runs a batch
    on what landed (and those fused to that one, in turn). The upstream's delivery failing is raised to
    the caller (the upstream's batch or tick fails); a downstream's batch, or its own delivery to the
    next one, failing is ``failed``'s for that downstream."""
    for down, up in fused_into.items():
        stage = stages.get(down)
        if up != upstream or stage is None or stage.fused is None or stage.failed or stage.restarting:
            continue
        feeding = stages[up].ex
        if feeding is not None:
            feeding.settle()  # its productions are in the stream table, its low watermark published
        try:
            with stage.lock:
                fused_batch(stage, authority, pipeline)
            feed_downstream(stages, fused_into, down, authority=authority, pipeline=pipeline, failed=failed)
        except Exception as exc:
            failed(stage, exc)


def fused_batch(stage: Stage, authority: Any, pipeline: Pipeline) -> BatchReport | None:
    """One batch of a fused ``stage`` (the caller holds its lock) over what its upstream delivered since."""
    ex, feed = stage.ex, stage.fused
    if ex is None or not isinstance(feed, FusedFeed):
        return None
    ex.wait_started()
    ups = pipeline.upstream(stage.comp)
    report, caps = feed.run(ex, lambda: upstream_caps(authority, ups))
    if report is not None:
        stage.acted_caps = caps
        stage.batches += 1
        stage.restarts = 0
        stage.records_in += report.records_in
        stage.done_batch = report.batch_id
    stage.next_caps = upstream_caps(authority, ups)
    ex.next_batch_inputs(stage.inputs(stage.next_caps))
    return report
