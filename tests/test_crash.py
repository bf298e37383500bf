"""A writer killed with SIGKILL in the middle of commits leaves whole batches or nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.rowtable.store import RowStore

pytestmark = pytest.mark.spark

KEYS = 300


@pytest.mark.timeout(600)
@pytest.mark.parametrize("delay_s", [0.15, pytest.param(0.6, marks=pytest.mark.slow)])
# s3a in the slow run: a writer dying mid-commit on the object store is completed by the next
# reader in test_s3_logstore.py (default run); the all-or-nothing checked here is the local variant's
@pytest.mark.parametrize("any_migrated_store", ["local", pytest.param("s3a", marks=[pytest.mark.objectstore,
                                                                                     pytest.mark.slow])], indirect=True)
def test_sigkill_mid_commit_is_all_or_nothing(spark, any_migrated_store, delay_s: float,  # type: ignore[no-untyped-def]
                                              request: pytest.FixtureRequest) -> None:
    migrated_store = any_migrated_store
    env = None
    if not migrated_store.is_local:  # the writer's own session reaches the test's object store and ZooKeeper
        from conftest import object_store_env

        env = {**object_store_env(request.getfixturevalue("object_store")),
               "DELTAWHEEL_ZK": request.getfixturevalue("zk_server").hosts,
               "DELTAWHEEL_ZK_CHROOT": "/deltawheel-tests-logstore"}
    writer = Path(__file__).with_name("crash_writer.py")
    proc = subprocess.Popen([sys.executable, str(writer), migrated_store.root, str(KEYS)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, env=env)
    done = 0
    begun = 0
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            word, n = line.split()
            if word == "DONE":
                done = int(n)
            else:
                begun = int(n)
                if done >= 2:
                    time.sleep(delay_s)  # somewhere inside the commit of batch `begun`
                    break
            assert time.monotonic() < deadline, "writer made no progress"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # what the writer printed before the kill but after our last read: it may have gone on
    last_begun = max([begun] + [int(n) for word, n in (ln.split() for ln in proc.stdout or ()) if word == "BEGIN"])
    store = RowStore(spark, migrated_store, writer="checker")
    codec = get_codec("json")
    batches = {codec.decode(r.state)["batch"] for r in store.scan_intervals("crash", range(4))}
    rows = store.scan_intervals("crash", range(4))
    assert len(rows) == KEYS  # one row per key, none lost, none doubled
    assert len(batches) == 1, f"a torn commit: batches {sorted(batches)} side by side"
    (b,) = batches
    assert done <= b <= last_begun, (b, done, last_begun)  # a whole batch, none acknowledged lost
