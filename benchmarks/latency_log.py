"""Reading an output Delta table's log as it grows, and a streaming query's file-source log."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["VersionInfo", "DeltaLogTail", "LogWatcher", "file_batches"]

Normalize = Callable[[pa.Table], pa.Table]


@dataclass(frozen=True, kw_only=True)
class VersionInfo:
    """One version of an output table: its times (seconds since the epoch)."""

    version: int
    commit_info_s: float | None  # commitInfo.timestamp
    mtime_s: float  # the <v>.json file's modification time


def _data_path(table: Path, path: str) -> Path:
    if "://" in path:
        return Path(unquote(urlparse(path).path))
    if path.startswith("/"):
        return Path(unquote(path))
    return table / unquote(path)


class DeltaLogTail:
    """Follows one Delta table's log (module docstring). ``rows()`` holds every row read so far."""

    def __init__(self, table: Path, normalize: Normalize) -> None:
        self.table = Path(table)
        self.log_dir = self.table / "_delta_log"
        self.normalize = normalize
        self.versions: dict[int, VersionInfo] = {}
        self._parts: list[pa.Table] = []
        self._next = 0

    def poll(self) -> pa.Table | None:
        """Read every version committed since the last poll; returns their rows (None if none)."""
        new: list[pa.Table] = []
        while True:
            f = self.log_dir / f"{self._next:020d}.json"
            try:
                mtime = f.stat().st_mtime
                text = f.read_text()
            except FileNotFoundError:
                break
            self.versions[self._next], paths = self._parse(self._next, text, mtime)
            tables = [self.normalize(pq.read_table(_data_path(self.table, p))) for p in paths]
            new += [t.append_column("version", pa.array([self._next] * t.num_rows, pa.int64()))
                    for t in tables if t.num_rows]
            self._next += 1
        if not new:
            return None
        out = pa.concat_tables(new, promote_options="default")
        self._parts.append(out)
        return out

    @staticmethod
    def _parse(version: int, text: str, mtime: float) -> tuple[VersionInfo, list[str]]:
        commit_s: float | None = None
        paths: list[str] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                ci = action["commitInfo"]
                ts = ci.get("inCommitTimestamp", ci.get("timestamp"))
                commit_s = None if ts is None else ts / 1000
            elif "add" in action and action["add"].get("dataChange", True):
                paths.append(action["add"]["path"])
        return VersionInfo(version=version, commit_info_s=commit_s, mtime_s=mtime), paths

    def rows(self) -> pa.Table | None:
        """Every row read so far, with its ``version`` (None before the first data)."""
        if not self._parts:
            return None
        if len(self._parts) > 1:
            self._parts = [pa.concat_tables(self._parts, promote_options="default")]
        return self._parts[0]

    @property
    def row_count(self) -> int:
        """Rows read so far."""
        return sum(t.num_rows for t in self._parts)


class LogWatcher:
    """Notes when each ``<v>.json`` of a table's log first appears (polling ``interval_s``)."""

    def __init__(self, table: Path, *, interval_s: float = 0.005) -> None:
        self.log_dir = Path(table) / "_delta_log"
        self.interval_s = interval_s
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="delta-log-watcher", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                names = os.listdir(self.log_dir)
            except FileNotFoundError:
                names = []
            now = time.time()
            for n in names:
                if n.endswith(".json") and len(n) == 25 and n[:20].isdigit():
                    self.seen.setdefault(int(n[:20]), now)
            self._stop.wait(self.interval_s)

    def start(self) -> LogWatcher:
        """Start watching in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> dict[int, float]:
        """Stop; returns version -> first seen (seconds since the epoch)."""
        self._stop.set()
        self._thread.join()
        return dict(self.seen)


def file_batches(checkpoint: Path) -> dict[str, int]:
    """Input file name -> the micro-batch that read it (a file listed twice keeps its first batch)."""
    from deltawheel.executor.protocol.querylog import source_log_files

    logged = sorted(source_log_files(str(checkpoint), committed_only=False).items(), reverse=True)
    return {name: batch for batch, names in logged for name in names}  # the first batch written last
