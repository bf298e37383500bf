"""One engine run of the throughput benchmark in its own process.

The child is a fresh interpreter (never a fork of a process holding a JVM). On two pipes it says
``measure`` when ready and ``ended`` after the measured run, each answered ``go`` once the parent
has started or stopped sampling, so session start, warm-up and output check fall outside peak memory."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping

from .engines_spark import EngineResult, ProgressFn
from .memory import MemoryPeak, MemorySampler, measured_run_ended, on_measured_run_end
from .workload import WorkloadData, WorkloadError

__all__ = ["IsolatedRun", "RunSpec", "build_bench_session", "child_main", "run_isolated"]

_TAIL_LINES = 30


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one child runs (pickled into a file the child reads)."""

    engine: str
    data: WorkloadData
    out_dir: Path  # the measured run's folder (the engine makes its own below it)
    conf: Mapping[str, str]  # SPARK_BENCH_CONF
    store: str | None = None  # the measured run's store URI (--store-uri)
    warmup: WorkloadData | None = None  # run the engine on this first, unmeasured
    warmup_out_dir: Path | None = None
    warmup_store: str | None = None


@dataclass(frozen=True, kw_only=True)
class IsolatedRun:
    """One finished child: the engine's result, its process id and the parent's samples of its tree."""

    result: EngineResult
    pid: int
    session_start_s: float
    warmup_s: float | None
    spark_version: str
    checkpoint_file_manager: str | None
    peak: MemoryPeak
    conf_applied: Mapping[str, str | None] | None = None  # the spec's conf as the child's session holds it


def build_bench_session(conf: Mapping[str, str], *, spark: Any = None, app_name: str = "deltawheel-bench",
                        kafka: bool | None = None) -> tuple[Any, float]:
    """The benchmark's session (built with ``conf``, or a child of ``spark``) and its start seconds."""
    t0 = time.perf_counter()
    if spark is None:
        from deltawheel.executor.session import build_spark
        from deltawheel.statestore.session.sparkenv import SparkSettings

        session = build_spark(SparkSettings(app_name=app_name, log_level="ERROR", extra=dict(conf), kafka=kafka))
    else:
        session = spark.newSession()
        session.sparkContext.setLogLevel("ERROR")
    for k, v in conf.items():
        if k.startswith("spark.sql."):
            session.conf.set(k, v)
    return session, round(time.perf_counter() - t0, 3)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """End the child's process group (its JVM, workers and ZooKeeper too): TERM, then KILL after 10 s."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader is gone; its group may not be yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        return


def run_isolated(spec: RunSpec, *, work_dir: Path, progress: ProgressFn | None = print,
                 interval_s: float = 1.0) -> IsolatedRun:
    """Run ``spec`` in a child process and sample its process tree during its measured run.

    Raises:
        WorkloadError: the child failed (its exit code and last output lines in the message).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path = work_dir / f"{spec.engine}.spec.pickle", work_dir / f"{spec.engine}.result.json"
    err_path = work_dir / f"{spec.engine}.stderr"
    result_path.unlink(missing_ok=True)
    spec_path.write_bytes(pickle.dumps((spec, str(result_path))))
    say = progress or (lambda _msg: None)
    to_parent_r, to_parent_w = os.pipe()
    from_parent_r, from_parent_w = os.pipe()
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltawheel.benchmarks.isolated", str(spec_path), str(to_parent_w),
             str(from_parent_r)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True,
            pass_fds=(to_parent_w, from_parent_r), start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(to_parent_w)
    os.close(from_parent_r)
    out_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)

    def forward(stream: IO[str]) -> None:  # the child's stdout: the engine's progress lines
        for line in stream:
            out_tail.append(line.rstrip("\n"))
            say(line.rstrip("\n"))

    assert proc.stdout is not None
    reader = threading.Thread(target=forward, args=(proc.stdout,), name=f"bench-{spec.engine}-stdout", daemon=True)
    reader.start()
    sampler: MemorySampler | None = None
    try:
        with os.fdopen(to_parent_r, "r") as told, os.fdopen(from_parent_w, "w") as answer:
            for line in told:
                word = line.strip()
                if word == "measure":
                    sampler = MemorySampler(interval_s=interval_s, root_pid=proc.pid).start()
                elif word == "ended" and sampler is not None:
                    sampler.end()
                answer.write("go\n")
                answer.flush()
        rc = proc.wait()
    except BaseException:  # Ctrl-C included: the child must not outlive the benchmark
        _kill_group(proc)
        raise
    finally:
        if sampler is not None:
            sampler.stop()
    _kill_group(proc)  # what the child left running (its JVM ends on its own, a stuck one not)
    reader.join(timeout=5.0)
    if rc != 0 or not result_path.is_file() or sampler is None:
        err_tail = err_path.read_text(errors="replace").splitlines()[-_TAIL_LINES:]
        lines = "\n".join(["stderr:", *err_tail, "stdout:", *out_tail])
        raise WorkloadError(f"engine {spec.engine}: its process {proc.pid} failed (exit {rc}); full stderr in "
                            f"{err_path}; its last lines:\n{lines}")
    got = json.loads(result_path.read_text())
    # the result's tuples came back as JSON lists
    res: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in got["result"].items()}
    return IsolatedRun(result=EngineResult(**res), pid=int(got["pid"]),
                       session_start_s=float(got["session_start_s"]), warmup_s=got["warmup_s"],
                       spark_version=str(got["spark_version"]), checkpoint_file_manager=got["checkpoint_file_manager"],
                       peak=sampler.peak, conf_applied=got.get("conf_applied"))


def child_main(spec_path: str, to_parent_fd: int, from_parent_fd: int) -> int:
    """The child's side of the protocol (module docstring): ``python -m deltawheel.benchmarks.isolated`` runs it."""
    from .engine_deltawheel import ENGINES

    spec, result_path = pickle.loads(Path(spec_path).read_bytes())
    assert isinstance(spec, RunSpec)
    told = os.fdopen(to_parent_fd, "w")
    answer = os.fdopen(from_parent_fd, "r")

    def tell(word: str) -> None:
        told.write(word + "\n")
        told.flush()
        if not answer.readline():
            raise WorkloadError("the benchmark's parent process went away")

    engine = ENGINES[spec.engine]  # an unknown name fails here, before a session is built
    session, start_s = build_bench_session(spec.conf)
    print(f"engine {spec.engine}: spark session ready in {start_s:.1f} s (process {os.getpid()})")
    warmup_s = None
    if spec.warmup is not None:
        print(f"engine {spec.engine}: warm-up on {spec.warmup.n:,} events")
        t_w = time.perf_counter()
        more = {} if spec.warmup_store is None else {"store": spec.warmup_store}
        engine().run(spec.warmup, out_dir=spec.warmup_out_dir or spec.out_dir / "warmup",
                                   spark=session, progress=None, **more)
        warmup_s = round(time.perf_counter() - t_w, 3)
        print(f"engine {spec.engine}: warm-up took {warmup_s:.1f} s")
    tell("measure")
    on_measured_run_end(lambda: tell("ended"))
    more = {} if spec.store is None else {"store": spec.store}
    res = engine().run(spec.data, out_dir=spec.out_dir, spark=session, progress=print, **more)
    measured_run_ended()  # an engine that did not say so itself: its run ended by now at the latest
    Path(result_path).write_text(json.dumps({
        "result": res.to_dict(), "pid": os.getpid(), "session_start_s": start_s, "warmup_s": warmup_s,
        "spark_version": session.version,
        "checkpoint_file_manager": session.conf.get("spark.sql.streaming.checkpointFileManagerClass", None),
        "conf_applied": {k: session.sparkContext.getConf().get(k, None) for k in spec.conf},
    }, default=str))
    told.close()
    return 0


if __name__ == "__main__":
    # through the package's module, not __main__: the spec was pickled as deltawheel.benchmarks.isolated.RunSpec
    from deltawheel.benchmarks.isolated import child_main

    sys.exit(child_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
