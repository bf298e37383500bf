"""A stop between Spark's file-source log and the query's offset log made every later
batch of a Parquet-fed computation record the input file of the batch before it, so a replay (and a
promotion of it) missed the live pipeline's last batch; real Spark, ZooKeeper and Delta.

Spark's file source writes the entry of the next micro-batch's files (``sources/0/<K>``, numbered by
the source itself) before the query writes that batch's offsets (``offsets/<N>``). A SIGTERM or
SIGKILL between the two leaves an entry no batch planned: the next start reads it together with the
new files in one micro-batch, and the file source's numbering stays one ahead of the query's from
then on. The positions a commit records are the files of the entries its offsets span.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]

PER_FILE = 40


def stopped_between_logs(checkpoint: Path, folder: Path, name: str) -> None:
    """What a stop of the query between its file source's log and its offset log leaves: the file
    source's log entry listing ``name`` (the next micro-batch's file), which no offset names."""
    logdir = checkpoint / "sources" / "0"
    last = max(int(n) for n in os.listdir(logdir) if n.isdigit())
    entry = json.loads((logdir / str(last)).read_text().splitlines()[1])  # Spark's own entry, for its format
    entry.update(path=(folder / name).resolve().as_uri(), timestamp=int((folder / name).stat().st_mtime * 1000),
                 batchId=last + 1)
    (logdir / str(last + 1)).write_text("v1\n" + json.dumps(entry) + "\n")


@pytest.mark.slow  # a replay and a promotion over a hand-made stop; the range rule itself: sourceoffsets' doctest
def test_a_stop_between_the_file_source_log_and_the_offset_log_loses_no_batch_in_replay_or_promote(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, capsys, monkeypatch) -> None:
    from balance_pipeline import INPUT_ENV, Balance, payment_rows, write_payments
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout

    folder, store = tmp_path / "input", tmp_path / "store"
    layout = StoreLayout(str(store))
    first_mtime = int(time.time()) - 3600

    def add(i: int) -> str:
        write_payments(folder, i, payment_rows(i * PER_FILE, PER_FILE, seed=3))
        name = f"payments-{i:05d}.parquet"
        os.utime(folder / name, (first_mtime + i, first_mtime + i))  # read in this order
        return name

    def run() -> None:
        inj = ParquetInjector("payments", str(folder), key_column="account", event_time_column="ts",
                              record_id_column="id", value_columns=["amount"], watermark_delay_ms=3_000,
                              max_files_per_trigger=1)
        PipelineRunner(spark, layout, Pipeline("payments", (inj,), (Balance(),)), zk=zk_config, end_of_input=False,
                       progress=lambda line: None, warm_workers=False).run()

    add(0)
    add(1)
    run()
    stopped_between_logs(store / "_checkpoints" / "payments" / "balance", folder, add(2))
    add(3)
    run()  # its first micro-batch reads payments-00002 and -00003

    read = [set(c.files or ()) for c in computation_commits(spark, layout, "balance") if c.reruns and c.files]
    assert read[-1] == {"payments-00002.parquet", "payments-00003.parquet"}, read
    assert set().union(*read) == {f"payments-{i:05d}.parquet" for i in range(4)}

    # a replay of the unchanged code from the start holds what the live store holds
    monkeypatch.setenv(INPUT_ENV, str(folder))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # --source adds its module's folder
    into, diff_out = tmp_path / "shadow", tmp_path / "diff.json"
    zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    assert main(["replay", "--store", str(store), "--pipeline", "payments", "--computation", "balance",
                 "--from-start", "--source", "balance_pipeline:pipeline", "--into", str(into), "--diff-out",
                 str(diff_out), *zk]) == 0
    got: Any = json.loads(diff_out.read_text())
    assert got["empty"], capsys.readouterr().out[-3000:]
    capsys.readouterr()
    # and its promotion changes no key
    assert main(["promote", "--from", str(into), "--store", str(store), "--pipeline", "payments",
                 "--computation", "balance", "--verbose", *zk]) == 0
    out = capsys.readouterr().out
    assert "promoted" in out and ": 0 keys written, 0 deleted (no commit" in out, out[-3000:]
    # --verbose: where the time went, and the window the live stage (stopped here) would have waited
    assert "proof: the replay ran every live commit up to the version replaced" in out
    assert "(paused)" in out and "the live stage was paused" in out, out[-3000:]
