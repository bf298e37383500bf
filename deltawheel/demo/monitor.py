"""The per-stage figures of ``demo --follow``, from the files a local run leaves: :class:`StageMonitor`
measures each record's latency from arrival at a stage (the query's checkpoint says what a batch
read) to its batch's commit to the stage's rows table (the Delta logs)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from deltawheel.executor.protocol.reports import UNKNOWN, watermark_known
from deltawheel.statestore.delta.log import batch_metas, user_metadata
from deltawheel.statestore.layout import StoreLayout

__all__ = ["StageFigures", "StageMonitor", "percentiles", "files_read"]


@dataclass
class StageFigures:
    """One stage's samples: (latency s, records) per batch part, since the last line and in all."""

    name: str
    interval: list[tuple[float, int]] = field(default_factory=list)
    total: list[tuple[float, int]] = field(default_factory=list)
    done: set[int] = field(default_factory=set)  # batches counted

    def add(self, latency_s: float, records: int) -> None:
        """One sample: ``records`` records of ``latency_s`` (none kept for 0 records)."""
        if records > 0:
            self.interval.append((latency_s, records))
            self.total.append((latency_s, records))


def percentiles(samples: list[tuple[float, int]]) -> tuple[int, float | None, float | None]:
    """(records, p50, p99) of weighted samples (None: no sample)."""
    n = sum(w for _, w in samples)
    if n == 0:
        return 0, None, None
    values = np.repeat(np.array([v for v, _ in samples]), np.array([w for _, w in samples]))
    p50, p99 = np.percentile(values, [50, 99])
    return n, float(p50), float(p99)


def _json_lines(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip() and line.strip() != "v1"]
    except (OSError, ValueError):
        return []


class _DeltaLog:
    """A local Delta table's log, followed: version -> (commit time, rows added, commitInfo)."""

    def __init__(self, table: str, *, from_latest: bool) -> None:
        self.table, self.log = table, os.path.join(table, "_delta_log")
        self.versions: dict[int, tuple[float, int, dict[str, Any]]] = {}
        self.next = 0
        if from_latest:
            names = [n for n in _listdir(self.log) if n.endswith(".json") and n[:20].isdigit()]
            self.next = max((int(n[:20]) + 1 for n in names), default=0)

    def poll(self) -> None:
        while True:
            path = os.path.join(self.log, f"{self.next:020d}.json")
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                return
            rows, info = 0, {}
            for action in _json_lines(path):
                if "commitInfo" in action:
                    info = action["commitInfo"]
                add = action.get("add")
                if add and add.get("dataChange", True):
                    rows += self._rows(add)
            self.versions[self.next] = (mtime, rows, info)
            self.next += 1

    def _rows(self, add: dict[str, Any]) -> int:
        try:
            return int(json.loads(add["stats"])["numRecords"])
        except (KeyError, TypeError, ValueError):
            return int(pq.ParquetFile(os.path.join(self.table, add["path"])).metadata.num_rows)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


class StageMonitor:
    """Per-stage figures from the files a run leaves (see the module docstring)."""

    def __init__(self, layout: StoreLayout, *, pipeline: str, stages: list[tuple[str, str | None]],
                 generator: Any) -> None:
        self.layout, self.pipeline, self.generator = layout, pipeline, generator
        self.stages = stages  # (computation, the stream table it reads; None: the generator's files)
        self.figures = {name: StageFigures(name) for name, _ in stages}
        # each stage's own rows table (a table made after this starts is followed from its first version)
        self.rows = {name: _DeltaLog(layout.rows_of(name), from_latest=True) for name, _ in stages}
        self.streams = {s: _DeltaLog(layout.stream(s), from_latest=False) for _, s in stages if s is not None}
        self.commits: dict[tuple[str, int], list[float]] = {}
        self.files: dict[str, dict[int, list[str]]] = {name: {} for name, _ in stages}
        self._seen_logs: dict[str, set[str]] = {name: set() for name, _ in stages}

    def checkpoint(self, name: str) -> str:
        """The query checkpoint of computation ``name``."""
        return os.path.join(self.layout.root, "_checkpoints", self.pipeline, name)

    def poll(self) -> None:
        """Read what was committed since the last poll into the stages' figures."""
        for log in self.rows.values():
            log.poll()
            for v in list(log.versions):
                mtime, _, info = log.versions.pop(v)
                for meta in batch_metas(user_metadata(info.get("userMetadata"))):  # a group commit's each
                    comp, _, rest = str(meta.get("commit_id", "")).partition(":")
                    batch_id = rest.partition(":")[0]
                    if comp and batch_id.isdigit():
                        self.commits.setdefault((comp, int(batch_id)), []).append(mtime)
        for log in self.streams.values():
            log.poll()
        for name, reads in self.stages:
            chk = self.checkpoint(name)
            for entry in _listdir(os.path.join(chk, "commits")):
                if not entry.isdigit() or int(entry) in self.figures[name].done:
                    continue
                batch = int(entry)
                ended = _mtime(os.path.join(chk, "commits", entry))
                times = [t for t in self.commits.get((name, batch), []) if ended is None or t <= ended + 0.001]
                if not times:
                    continue  # its rows commit not read yet (or none: nothing to measure)
                self.figures[name].done.add(batch)
                committed = max(times)  # a timers-only flush may have used the same id before it
                if reads is None:
                    self._file_batch(name, batch, committed)
                else:
                    self._stream_batch(name, reads, batch, committed)

    def _file_batch(self, name: str, batch: int, committed: float) -> None:
        src = os.path.join(self.checkpoint(name), "sources", "0")
        files = self.files[name]
        if batch not in files:
            for entry in sorted(_listdir(src), key=lambda s: int(s.split(".")[0]) if s.split(".")[0].isdigit() else -1):
                if entry in self._seen_logs[name] or not entry.split(".")[0].isdigit():
                    continue
                self._seen_logs[name].add(entry)
                for e in _json_lines(os.path.join(src, entry)):
                    files.setdefault(int(e["batchId"]), []).append(os.path.basename(str(e["path"])))
        for f in set(files.pop(batch, [])):
            arrival = self.generator.by_name.get(f)
            if arrival is not None:
                self.figures[name].add(committed - arrival.at_s, arrival.records)

    def _stream_batch(self, name: str, stream: str, batch: int, committed: float) -> None:
        offsets = os.path.join(self.checkpoint(name), "offsets")
        end = _offset(os.path.join(offsets, str(batch)))
        if end is None:
            return
        start = _offset(os.path.join(offsets, str(batch - 1))) if batch > 0 else None
        lo = 0 if start is None else (start[0] if start[1] == -1 else start[0] + 1)
        hi = end[0] - 1 if end[1] == -1 else end[0]
        log = self.streams[stream]
        for v in range(lo, hi + 1):
            if v in log.versions:
                mtime, rows, _ = log.versions[v]
                self.figures[name].add(committed - mtime, rows)

    def caught_up(self, name: str, stream: str) -> bool:
        """Whether ``name``'s last finished micro-batch read ``stream``'s table to its latest version."""
        self.streams[stream].poll()
        latest = self.streams[stream].next - 1
        chk = self.checkpoint(name)
        if latest <= 0:
            return True  # only the table's creation: no row
        done = [int(e) for e in _listdir(os.path.join(chk, "commits")) if e.isdigit()]
        end = _offset(os.path.join(chk, "offsets", str(max(done)))) if done else None
        return end is not None and end[0] > latest

    def lines(self, authority: Any, *, elapsed_s: float) -> list[str]:
        """One line per stage over the last ``elapsed_s`` (the interval is then reset)."""
        self.poll()
        now_ms = time.time() * 1000
        out = []
        for name, _ in self.stages:
            fig = self.figures[name]
            n, p50, p99 = percentiles(fig.interval)
            fig.interval = []
            low = authority.published_low_watermark(name)
            lag = UNKNOWN if not watermark_known(low) else f"{(now_ms - low) / 1000:5.1f}s"  # 0: held
            lat = "-" if p50 is None or p99 is None else f"p50 {p50:5.2f}s p99 {p99:5.2f}s"
            out.append(f"{name:14s} {n / max(elapsed_s, 1e-3):7.0f} records/s  watermark lag {lag}  "
                       f"latency {lat}")
        return out


def _offset(path: str) -> tuple[int, int] | None:
    """(reservoirVersion, index) of the Delta source's end offset in a query's offsets file."""
    lines = _json_lines(path)
    if len(lines) < 2 or "reservoirVersion" not in lines[-1]:
        return None
    return int(lines[-1]["reservoirVersion"]), int(lines[-1].get("index", -1))


def files_read(monitor: StageMonitor) -> set[str]:
    """Files the first stage's finished micro-batches read."""
    chk = monitor.checkpoint("window_counter")
    done = {int(e) for e in _listdir(os.path.join(chk, "commits")) if e.isdigit()}
    out: set[str] = set()
    src = os.path.join(chk, "sources", "0")
    for entry in _listdir(src):
        for e in _json_lines(os.path.join(src, entry)):
            if int(e["batchId"]) in done:
                out.add(os.path.basename(str(e["path"])))
    return out
