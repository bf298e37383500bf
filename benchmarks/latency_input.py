"""The latency benchmark's input: small Parquet files renamed into a folder on a fixed schedule.

A :class:`Schedule` fixes everything but the wall clock. Record ids are ``0..total-1`` in arrival
order; a file's rename time is its records' arrival. File 0, the *primer*, precedes the engine."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Schedule", "InputLog", "ScheduleThread", "Generator", "run_schedule", "write_file", "file_name",
           "key_name"]

PRIMER_GAP_S = 0.15  # the primer holds as many records as a typical file


def file_name(index: int) -> str:
    """The input file name of file ``index`` (sorts in arrival order)."""
    return f"part-{index:06d}.parquet"


def key_name(k: int) -> str:
    """The key string of key number ``k``."""
    return f"k{k:05d}"


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """When each input file arrives and which records it holds (gaps drawn from ``min_gap_s..max_gap_s``)."""

    rate: float
    seconds: float
    seed: int = 7
    keys: int = 50_000
    min_gap_s: float = 0.1
    max_gap_s: float = 0.2

    @cached_property
    def offsets_s(self) -> np.ndarray:
        """Due time of each file after ``t0`` (the primer at 0)."""
        rng = np.random.default_rng(self.seed)
        n = int(self.seconds / self.min_gap_s) + 2
        gaps = rng.uniform(self.min_gap_s, self.max_gap_s, size=n)
        ends = np.cumsum(gaps)
        ends = ends[ends <= self.seconds + 1e-9]
        return np.concatenate([[0.0], ends])

    @cached_property
    def counts(self) -> np.ndarray:
        """Records per file: the primer ``rate * 0.15 s``, file k the records due in its gap."""
        primer = max(1, round(self.rate * PRIMER_GAP_S))
        cum = np.floor(self.rate * self.offsets_s[1:] + 1e-9).astype(np.int64)
        per = np.diff(np.concatenate([[0], cum]))
        return np.concatenate([[primer], per]).astype(np.int64)

    @cached_property
    def first_ids(self) -> np.ndarray:
        """The first record id of each file."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @property
    def n_files(self) -> int:
        """Files, the primer included."""
        return len(self.offsets_s)

    @property
    def total(self) -> int:
        """Records, the primer's included."""
        return int(self.counts.sum())

    @cached_property
    def key_ids(self) -> np.ndarray:
        """The key number of every record, by record id."""
        rng = np.random.default_rng([self.seed, 1])
        return rng.integers(0, self.keys, size=self.total, dtype=np.int64)

    @cached_property
    def file_of(self) -> np.ndarray:
        """The file index of every record, by record id."""
        return np.repeat(np.arange(self.n_files, dtype=np.int64), self.counts)

    def to_dict(self) -> dict[str, Any]:
        """The schedule's parameters and sizes, JSON-ready."""
        return {**asdict(self), "files": self.n_files, "records": self.total}


def write_file(schedule: Schedule, index: int, path: Path, *, event_time_ms: int) -> None:
    """Write file ``index`` of ``schedule`` to ``path``, every record's event time ``event_time_ms``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lo = int(schedule.first_ids[index])
    hi = lo + int(schedule.counts[index])
    keys = schedule.key_ids[lo:hi]
    table = pa.table({
        "record_id": pa.array([str(i) for i in range(lo, hi)], pa.string()),
        "key": pa.array([key_name(int(k)) for k in keys], pa.string()),
        "event_time": pa.array(np.full(hi - lo, event_time_ms, dtype=np.int64), pa.int64())
        .cast(pa.timestamp("ms", tz="UTC")),
    })
    pq.write_table(table, path)


def _rename(schedule: Schedule, index: int, *, staging: Path, folder: Path, event_time_ms: int) -> float:
    staged = staging / file_name(index)
    if not staged.exists():
        write_file(schedule, index, staged, event_time_ms=event_time_ms)
    os.rename(staged, folder / file_name(index))
    return time.time()


def prime(schedule: Schedule, *, folder: Path, staging: Path, log: Path) -> float:
    """Put file 0 in place now; log and return its rename time."""
    now_ms = int(time.time() * 1000)
    t = _rename(schedule, 0, staging=staging, folder=folder, event_time_ms=now_ms)
    with log.open("a") as f:
        f.write(json.dumps({"file": 0, "due": now_ms / 1000, "renamed": t}) + "\n")
    return t


def run_schedule(schedule: Schedule, *, folder: Path, staging: Path, t0: float, log: Path,
                 stop: threading.Event | None = None) -> None:
    """Rename files 1.. into ``folder`` when due, logging ``{"file", "due", "renamed"}``; ``stop`` ends it."""
    stop = stop or threading.Event()
    with log.open("a") as f:
        for k in range(1, schedule.n_files):
            due = t0 + float(schedule.offsets_s[k])
            write_file(schedule, k, staging / file_name(k), event_time_ms=int(round(due * 1000)))
            while (left := due - time.time()) > 0:
                if stop.wait(min(left, 0.05)):
                    return
            t = _rename(schedule, k, staging=staging, folder=folder, event_time_ms=int(round(due * 1000)))
            f.write(json.dumps({"file": k, "due": due, "renamed": t}) + "\n")
            f.flush()


@dataclass(frozen=True)
class InputLog:
    """What the generator did: each file's due and rename times (seconds since the epoch)."""

    due: np.ndarray
    renamed: np.ndarray  # NaN for a file not renamed (the generator was stopped early)
    arrival: np.ndarray | None = None  # per record, when not its file's rename (Kafka: the append time)

    def arrivals(self, schedule: Schedule) -> np.ndarray:
        """Each record's arrival (seconds since the epoch; NaN: it never arrived)."""
        return self.renamed[schedule.file_of] if self.arrival is None else self.arrival

    @classmethod
    def read(cls, path: Path, n_files: int) -> InputLog:
        """Parse the generator's log for a schedule of ``n_files`` files."""
        due = np.full(n_files, np.nan)
        renamed = np.full(n_files, np.nan)
        lines = path.read_text().splitlines() if path.exists() else []
        for d in (json.loads(line) for line in lines if line.strip()):
            due[d["file"]] = d["due"]
            renamed[d["file"]] = d["renamed"]
        return cls(due=due, renamed=renamed)

    def lateness(self) -> dict[str, float | int | None]:
        """How late the renames were (files 1..): p50/p99/max in ms, and the files renamed."""
        late = (self.renamed[1:] - self.due[1:])
        late = late[~np.isnan(late)] * 1000
        if late.size == 0:
            return {"files": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
        return {"files": int(late.size), "p50_ms": round(float(np.percentile(late, 50)), 2),
                "p99_ms": round(float(np.percentile(late, 99)), 2), "max_ms": round(float(late.max()), 2)}


class ScheduleThread:
    """What both generators share: the schedule's log, and a thread that runs it from ``t0``."""

    def __init__(self, schedule: Schedule, log: Path) -> None:
        self.schedule, self.log = schedule, log
        self.t0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start_thread(self, run: Callable[[float], None], lead_s: float) -> float:
        self.t0 = t0 = time.time() + lead_s
        self._thread = threading.Thread(target=run, args=(t0,), name="latency-generator", daemon=True)
        self._thread.start()
        return t0

    def running(self) -> bool:
        """True while files are still to be renamed (bursts to be sent)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """End the schedule now (files not yet renamed stay out)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def read_log(self) -> InputLog:
        """The generator's log so far."""
        return InputLog.read(self.log, self.schedule.n_files)


class Generator(ScheduleThread):
    """Runs :func:`run_schedule` in a thread or a child process."""

    MODES = ("thread", "process")

    def __init__(self, schedule: Schedule, *, folder: Path, staging: Path, log: Path, mode: str = "thread") -> None:
        if mode not in self.MODES:
            raise ValueError(f"generator mode must be one of {self.MODES}, not {mode!r}")
        super().__init__(schedule, log)
        self.folder, self.staging, self.mode = folder, staging, mode
        folder.mkdir(parents=True, exist_ok=True)
        staging.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None

    def prime(self) -> float:
        """Put the primer in place; returns its rename time (a child process starts and waits for ``t0``)."""
        t = prime(self.schedule, folder=self.folder, staging=self.staging, log=self.log)
        if self.mode == "process":
            args = [sys.executable, "-m", "deltawheel.benchmarks.latency_input", "--folder", str(self.folder),
                    "--staging", str(self.staging), "--log", str(self.log),
                    "--schedule", json.dumps(asdict(self.schedule))]
            self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return t

    def _run(self, t0: float) -> None:
        run_schedule(self.schedule, folder=self.folder, staging=self.staging, t0=t0, log=self.log,
                     stop=self._stop)

    def start(self, *, lead_s: float = 0.3) -> float:
        """Start the schedule at ``now + lead_s`` (after :meth:`prime`); returns ``t0``."""
        if self.mode == "thread":
            return self._start_thread(self._run, lead_s)
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != b"ready":  # the child has its schedule ready
            raise RuntimeError(f"the input generator process did not start (exit {self._proc.poll()})")
        self.t0 = time.time() + lead_s
        self._proc.stdin.write(f"{self.t0!r}\n".encode())
        self._proc.stdin.close()
        return self.t0

    def running(self) -> bool:
        """True while files are still to be renamed."""
        return super().running() or (self._proc is not None and self._proc.poll() is None)

    def stop(self) -> None:
        """End the schedule now (files not yet renamed stay out)."""
        super().stop()
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                self._proc.wait(timeout=30)
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None and not stream.closed:
                    stream.close()


def main(argv: Sequence[str] | None = None) -> int:
    """The child-process generator: prints ``ready``, then reads ``t0`` (epoch seconds) from stdin."""
    p = argparse.ArgumentParser(description="rename a latency schedule's files into a folder")
    for name in ("--folder", "--staging", "--log"):
        p.add_argument(name, required=True)
    p.add_argument("--schedule", required=True, help="the Schedule's fields as JSON")
    a = p.parse_args(argv)
    schedule = Schedule(**json.loads(a.schedule))
    _ = schedule.key_ids, schedule.offsets_s, schedule.first_ids
    if schedule.n_files > 1:  # load pyarrow's writer before the clock starts
        write_file(schedule, 1, Path(a.staging) / file_name(1), event_time_ms=0)
        os.remove(Path(a.staging) / file_name(1))
    print("ready", flush=True)
    if not (line := sys.stdin.readline().strip()):
        return 0  # the benchmark ended before starting the schedule
    run_schedule(schedule, folder=Path(a.folder), staging=Path(a.staging), t0=float(line), log=Path(a.log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
