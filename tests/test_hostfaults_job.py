"""Faults between hosts under a running deltawheel job (docs/deploy.md, "Faults between hosts").

The clicks job of docs/deploy.md is submitted in cluster deploy mode with ``--supervise`` on the
hosts test bed, its store on S3Proxy and its leases in the three-server ensemble. One fault after
another is injected while it runs, a new input file is added during each, and the fault healed:
a worker cut off from S3Proxy, a ZooKeeper follower's host cut off, the leader's, the driver's
host cut off from the ensemble past the session timeout, a worker host killed whole, the driver's
host killed whole. After each heal the job must close the new file's windows; the time from the
heal to the first committed batch is printed. At the end every window of the job's output is
compared with the windows computed from the input files themselves: every record once, no
window twice, every window equal.

Slow (15-30 min): test_hostfaults.py covers the cuts and the kill quickly, without Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hostfaults_util import BASE, MINUTE, Store, input_windows, output_windows, windows_closed
from hosts_util import HOSTS_DATA

REPO = Path(__file__).resolve().parents[1]
STORE = "s3a://deltawheel/faults"
INPUT = "s3a://deltawheel/faults-input"
SESSION_TIMEOUT_S = 20.0  # deltawheel.connect's default, the clicks job's
HOLD_S = 30.0  # how long each fault lasts
ZK_CUT_S = 45.0  # the driver's cut from the ensemble: past its session timeout


@dataclass(kw_only=True)
class Episode:
    """One fault: what it was, what the job did, when it healed, how soon a batch committed after."""

    fault: str
    file: int
    started_ms: int = 0
    healed_ms: int = 0
    batches_during: int = 0
    first_batch_ms: int | None = None
    file_ms: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def heal_to_batch_s(self) -> float | None:
        return None if self.first_batch_ms is None else (self.first_batch_ms - self.healed_ms) / 1000

    @property
    def heal_to_file_s(self) -> float | None:
        """From the heal to the commit of the file added during the fault (negative: before the heal)."""
        return None if self.file_ms is None else (self.file_ms - self.healed_ms) / 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def batch_commits(store: Store) -> list[Any]:
    """The rows table's commits of a computation's batch (of input or of timers; not claims or fences)."""
    return [c for c in store.commits() if c.meta.get("computation") and c.meta.get("kind") == "commit"]


def file_committed_ms(commits: list[Any], file: int) -> int | None:
    """When the batch that read input file ``file`` committed."""
    name = f"part-{file:04d}.parquet"
    return min((c.timestamp_ms for c in commits if name in ((c.meta.get("positions") or {}).get("files") or [])),
               default=None)


class Run:
    """The bed, the job's driver and the store, for one test."""

    def __init__(self, bed: Any) -> None:
        from deltawheel.servers.hostfaults import HostFaults

        self.bed = bed
        self.faults = HostFaults(bed)
        self.episodes: list[Episode] = []

    @property
    def store(self) -> Store:
        """The job's store (S3Proxy's credential is made at its first start: read after :meth:`up`)."""
        return Store(self.bed.s3_endpoint, STORE)

    def s3_env(self) -> dict[str, str]:
        from deltawheel.statestore.objectstore import s3a

        ep = self.bed.s3_endpoint
        return {s3a.ENV_ENDPOINT: ep.url, s3a.ENV_ACCESS_KEY: ep.access_key, s3a.ENV_SECRET_KEY: ep.secret_key}

    def add_input(self, first: int, files: int = 1) -> None:
        done = self.bed.on_client([sys.executable, "examples/clicks_job.py", "make-input", "--input", INPUT,
                                   "--first", str(first), "--files", str(files)], cwd=REPO, capture_output=True,
                                  env={**os.environ, **self.s3_env()}, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr

    def drivers(self) -> list[tuple[str, dict[str, Any]]]:
        """(worker host name, the master's entry) of each active driver."""
        with urllib.request.urlopen(f"{self.bed.master_ui}/json/", timeout=10) as resp:
            state = json.loads(resp.read())
        by_address = {h.address: n for n, h in self.bed.hosts.items()}
        return [(by_address.get(str(d["worker"]).split("-")[2], "?"), d) for d in state.get("activedrivers", [])]

    def driver_host(self) -> str:
        running = [w for w, d in self.drivers() if d.get("state") == "RUNNING"]
        assert len(running) == 1, self.drivers()
        return running[0]

    def driver_ids(self) -> list[str]:
        return sorted(str(d["id"]) for _w, d in self.drivers())

    def driver_output(self) -> str:
        """Every driver's stdout and stderr so far (newest last)."""
        files = sorted((p for w in ("worker1", "worker2") for p in (self.bed.dir(w) / "work").glob("driver-*/std*")),
                       key=lambda p: p.parent.name)
        return "\n".join(f"== {p.parent.name}/{p.name}\n{p.read_text(errors='replace')}" for p in files)

    def wait_closed(self, window: int, *, timeout_s: float = 900) -> None:
        """Until ``user_counts`` has a count of ``window`` (input file ``window`` was processed)."""
        deadline = time.time() + timeout_s
        while window not in windows_closed(self.store):
            assert time.time() < deadline, (f"window {window} not closed in {timeout_s}s; drivers "
                                             f"{self.drivers()}\n{self.driver_output()[-6000:]}")
            time.sleep(2.0)

    def episode(self, fault: str, file: int, inject: Callable[[], None], heal: Callable[[], None],
                hold_s: float = HOLD_S) -> Episode:
        """Inject, add input file ``file``, hold, heal; wait for its windows and the first batch after the heal."""
        ep = Episode(fault=fault, file=file)
        before = set(self.driver_ids())
        starts = self.driver_output().count("connected: store")
        ep.started_ms = now_ms()
        inject()
        self.add_input(file)
        time.sleep(max(0.0, ep.started_ms / 1000 + hold_s - time.time()))  # the fault's length, not a wait for an event
        ep.healed_ms = now_ms()
        heal()
        self.wait_closed(file)
        commits = batch_commits(self.store)
        ep.batches_during = sum(1 for c in commits if ep.started_ms <= c.timestamp_ms < ep.healed_ms)
        after = [c.timestamp_ms for c in commits if c.timestamp_ms >= ep.healed_ms]
        ep.first_batch_ms = min(after) if after else None
        ep.file_ms = file_committed_ms(commits, file)
        new = set(self.driver_ids()) - before
        if new:
            ep.notes.append(f"driver relaunched ({', '.join(sorted(new))})")
        elif self.driver_output().count("connected: store") > starts:  # --supervise restarts it on its worker
            ep.notes.append("driver restarted in place")
        self.episodes.append(ep)
        print(f"{fault}: {ep.batches_during} batches during the fault, first batch {ep.heal_to_batch_s} s after "
              f"the heal, file {file} committed {ep.heal_to_file_s} s after it; {'; '.join(ep.notes)}", flush=True)
        return ep

    def submit(self, archive: Path, bundle: Path) -> None:
        from deltawheel.executor.drivers.deploy import submit_args

        client = self.bed.hosts["client"].address
        sa = submit_args(object_store=True, deploy_mode="cluster", archive=str(archive), endpoint=self.bed.s3_endpoint,
                         zk=self.bed.zk_hosts, job=REPO / "examples" / "clicks_job.py", bundle=bundle,
                         base_url=f"http://{client}:8000", driver_python=str(self.bed.spark_python))
        subprocess.Popen([*self.bed.client_prefix(), sys.executable, "-m", "http.server", "8000", "--bind", client,
                          "--directory", str(bundle)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        spark_submit = str(Path(sys.executable).parent / "spark-submit")
        done = self.bed.on_client(
            [spark_submit, "--master", self.bed.master_url, "--deploy-mode", "cluster", "--supervise",
             "--conf", "spark.executor.memory=1g", *sa.argv(),
             "run", "--store", STORE, "--zk-chroot", "/faults", "--instance", "faults1", "--input", INPUT,
             "--zk", self.bed.zk_hosts, "--seconds", "7200"], capture_output=True, timeout=600, cwd=REPO)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]

    def zk_with_mode(self, mode: str) -> str:
        modes = self.bed.status().zk_modes
        return next(n for n, m in modes.items() if m == mode)


def _driver_cut_from_zk(run: Run) -> Episode:
    """The driver's host cut off from the three ZooKeeper servers past the session timeout: its
    commits stop before the session can expire, and none lands with a sequencer of the lost session."""
    host = run.driver_host()
    zks = ["zk1", "zk2", "zk3"]
    ep = run.episode(f"driver's host ({host}) cut off from ZooKeeper for {ZK_CUT_S:.0f} s (session timeout "
                     f"{SESSION_TIMEOUT_S:.0f} s)", 5, lambda: run.faults.cut(host, zks),
                     lambda: run.faults.heal(host, zks), hold_s=ZK_CUT_S)
    commits = [c for c in run.store.commits() if c.meta.get("sequencers")]
    expired_ms = ep.started_ms + int(SESSION_TIMEOUT_S * 1000)
    written = [c for c in commits if expired_ms <= c.timestamp_ms < ep.healed_ms]
    assert not written, f"commits while the driver's session was lost: {written}"
    last: dict[tuple[str, str], int] = {}
    for c in commits:
        for iv, seq in (c.meta.get("sequencers") or {}).items():
            k = (str(c.meta["computation"]), str(iv))
            if c.timestamp_ms < ep.started_ms:
                last[k] = max(last.get(k, -1), int(seq))
            elif c.timestamp_ms >= expired_ms:
                assert int(seq) > last.get(k, -1), f"{c} carries a sequencer of the lost session (interval {k})"
    out = run.driver_output()
    for name in ("LeaseLostError", "BatchFailedError", "SessionExpiredError", "StaleSequencerError"):
        if name in out:
            ep.notes.append(f"{name} in the driver's output")
    return ep


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_faults_between_hosts_under_a_running_job(hosts_available: None, tmp_path: Path) -> None:
    from test_deploy import ARCHIVE, pack

    from deltawheel.servers.hosts import HostsCluster
    from deltawheel.servers.netns import leftovers

    archive = pack(ARCHIVE)
    bed = HostsCluster(HOSTS_DATA, services=("s3", "zk", "spark"))
    run = Run(bed)
    try:
        bed.up(fresh=True)
        run.add_input(0, files=2)
        t0 = time.time()
        run.submit(archive, tmp_path / "bundle")
        run.wait_closed(1)
        print(f"submit to window 1 closed: {time.time() - t0:.0f} s; driver on {run.driver_host()}", flush=True)

        driver = run.driver_host()
        other = "worker2" if driver == "worker1" else "worker1"
        run.episode(f"worker ({other}) cut off from S3Proxy", 2, lambda: run.faults.cut(other, ["s3"]),
                    lambda: run.faults.heal(other, ["s3"]))
        follower = run.zk_with_mode("follower")
        run.episode(f"ZooKeeper follower's host ({follower}) cut off", 3, lambda: run.faults.cut(follower),
                    lambda: run.faults.heal(follower))
        leader = run.zk_with_mode("leader")
        run.episode(f"ZooKeeper leader's host ({leader}) cut off", 4, lambda: run.faults.cut(leader),
                    lambda: run.faults.heal(leader))
        _driver_cut_from_zk(run)
        other = "worker2" if run.driver_host() == "worker1" else "worker1"
        run.episode(f"worker host ({other}, executors only) killed, restarted after {HOLD_S:.0f} s", 6,
                    lambda: run.faults.kill(other), run.faults.restart)
        driver = run.driver_host()
        run.episode(f"driver's host ({driver}) killed, restarted after {HOLD_S:.0f} s", 7,
                    lambda: run.faults.kill(driver), run.faults.restart)

        run.add_input(8)
        run.wait_closed(8)
        want_users, want_totals = input_windows(run.store, INPUT)
        deadline = time.time() + 600
        while True:  # the totals close one stage later than the user counts
            got_users, twice_users, got_totals, twice_totals = output_windows(run.store)
            if all(BASE + m * MINUTE in got_totals for m in range(8)) or time.time() > deadline:
                break
            time.sleep(3.0)
        assert twice_users == [] and twice_totals == [], (twice_users, twice_totals)
        closed = {k: v for k, v in want_users.items() if k[1] <= BASE + 8 * MINUTE}
        assert {k: v for k, v in got_users.items() if k[1] <= BASE + 8 * MINUTE} == closed
        assert all(got_users[k] == v for k, v in want_users.items() if k in got_users)
        assert set(got_totals) >= {BASE + m * MINUTE for m in range(8)}, sorted(got_totals)
        assert all(got_totals[s] == want_totals[s] for s in got_totals), (got_totals, want_totals)
        print(f"rows correct: {sum(closed.values())} clicks in {len(closed)} user windows, "
              f"{len(got_totals)} minute totals", flush=True)
    finally:
        print("\n| fault | batches during | heal to first batch | heal to the file's batch | notes |")
        for e in run.episodes:
            print(f"| {e.fault} | {e.batches_during} | {e.heal_to_batch_s} s | {e.heal_to_file_s} s | "
                  f"{'; '.join(e.notes)} |")
        Path(HOSTS_DATA / "faults-driver-output.txt").write_text(run.driver_output() if bed.data_dir.exists() else "")
        _, left = bed.down()
    assert left == [] and leftovers() == []
