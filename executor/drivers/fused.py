"""Fused stages: a computation run in its upstream's micro-batch, on the stream-table versions that
batch's delivery committed, with no query of its own (``Pipeline.fused``; docs/continuous.md, "Fused
stages").

Its position is kept in its query checkpoint folder, written ahead of each batch as Spark's offset
log is: a file per write in ``fused/``, holding the batch id, the versions ``[first, stop)`` of its
input table it reads, and ``done`` once the batch returned (its commit landed). A batch that did not
finish runs again with the same id on the same versions, as Spark replays a planned micro-batch: its
record ids drop what landed, its lateness is judged as at its first attempt. Its commits record the
files read, as an unfused stage's do, so replay, promote and repair read a fused stage's commits alike.

A driver stopped past its ZooKeeper session (a zombie) may write on when continued, even between any
check and its write; so no write overwrites another. Each file is named by the writer's epoch (its
highest lease sequencer: every later owner's is higher), then batch id, then done, and the position
is the file that sorts last. A zombie's writes sort below the new owner's whenever they land; its
commits are fenced by their sequencers."""

from __future__ import annotations

import json
import re
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

__all__ = ["FUSED_DIR", "FusedBatch", "FusedFeed", "fused_position", "refuse_unfused", "feed_downstream",
           "fused_batch", "fused_in_process"]

FUSED_DIR = "fused"  # the position's files, in the query checkpoint folder
LEGACY_FILE = "fused.json"  # the position as an earlier release kept it


@dataclass(frozen=True)
class FusedBatch:
    """A fused stage's batch: its id and the input table's versions ``first`` .. ``stop - 1``."""

    batch_id: int
    first: int
    stop: int
    done: bool

    def text(self, epoch: int) -> str:
        """As its file holds it, written in ``epoch``."""
        return json.dumps({"format_version": 2, "batch_id": self.batch_id, "first": self.first, "stop": self.stop,
                           "done": self.done, "epoch": epoch})


def _name(batch: FusedBatch, epoch: int) -> str:
    return f"{FUSED_DIR}/{epoch:012d}-{batch.batch_id:012d}-{int(batch.done)}.json"


def _written(chk: TableFiles) -> list[str]:
    """The position files, oldest first (a write's temporary file, another's name: not listed)."""
    names = chk.listdir(FUSED_DIR) or ()
    return sorted(f"{FUSED_DIR}/{n}" for n in names if re.fullmatch(r"\d{12}-\d{12}-[01]\.json", n))


def fused_position(chk: TableFiles) -> tuple[FusedBatch, int] | None:
    """A fused stage's position in its checkpoint folder ``chk`` and the epoch it was written in
    (None: it never ran fused); ``fused.json`` of an earlier release: epoch -1."""
    while True:
        names = _written(chk)
        text = chk.read_text(names[-1] if names else LEGACY_FILE)
        if text is not None or not names:
            break  # else its writer replaced it since the listing: list again
    if text is None:
        return None
    d = json.loads(text)
    return (FusedBatch(int(d["batch_id"]), int(d["first"]), int(d["stop"]), bool(d["done"])),
            int(d.get("epoch", -1)))


def refuse_unfused(files: Callable[[str], TableFiles | None], layout: StoreLayout, pipeline: Pipeline,
                   names: Iterable[str]) -> None:
    """ConfigError, before anything starts, if one of ``names`` is not fused in ``pipeline`` but ran fused
    before: its own query's offsets are behind what it read, and it would read that input again."""
    fused = pipeline.fused_into()
    for name in names:
        checkpoint = query_of(layout, pipeline.name, name)[0]
        chk = None if name in fused else files(checkpoint)
        found = None if chk is None else fused_position(chk)
        if found is not None:
            raise ConfigError(f"pipeline {pipeline.name}: {name} ran fused to its upstream (its input read up to "
                              f"version {found[0].stop - 1}, in {checkpoint}/{FUSED_DIR}); its own query would read "
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
        found = fused_position(chk)
        self.last = found[0] if found is not None else self._from_query()
        self._seen_epoch = -1 if found is None else found[1]
        self._epoch: int | None = None  # this driver's, from its leases (at its first batch)
        self._mine: str | None = None  # the file this driver wrote last

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
        """``batch`` as the position: a file of its own (none is overwritten), then this driver's previous
        one removed (at its first write, every earlier one)."""
        if self._epoch is None:
            raise ConfigError(f"{self.comp.name}: a fused position is written by a run holding its leases")
        name = _name(batch, self._epoch)
        self._chk.write_text(name, batch.text(self._epoch))
        older = [self._mine] if self._mine is not None else [*_written(self._chk), LEGACY_FILE]
        for old in older:
            if old < name or old == LEGACY_FILE:
                self._chk.delete(old)
        self.last, self._mine = batch, name

    def own(self, ex: Any) -> None:
        """Write from now on in the epoch of ``ex``'s leases: its highest sequencer (StaleSequencerError:
        the position was written in a later one, by a driver that took the stage over)."""
        held = ex.owner.sequencers
        epoch = max(held.values()) if held else -1
        if epoch < self._seen_epoch or not held:
            raise StaleSequencerError(f"{self.comp.name}: its fused position was written under lease sequencer "
                                      f"{self._seen_epoch}, this driver holds {epoch}: another driver took the "
                                      "stage over")
        self._epoch = epoch

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
        self.own(ex)
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
