"""A commit's round trips cut: the log kept between reads (only newer commits read), a writer's own
newest commit taken without listing the log, and the files this process wrote read from memory.
Each must leave what a reader sees and what a zombie can land exactly as before."""

from __future__ import annotations

import json
import random
import shutil
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.delta import log as dlog
from deltawheel.statestore.delta.jvm import delta_classes, jvm
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.delta.txn import TableLog, new_add
from deltawheel.statestore.exceptions import StaleSequencerError
from deltawheel.statestore.rowtable.frames import arrow_schema
from deltawheel.statestore.rowtable.rows import FENCE_KEY, KeyRow, interval_of, rows_file_ddl
from deltawheel.statestore.rowtable.store import RowStore, commit_metadata

pytestmark = pytest.mark.spark

J = get_codec("json")
N = 4


def _whole(files: TableFiles) -> dlog.LogSnapshot | None:
    """The table's snapshot replayed from its log alone (nothing kept)."""
    dlog.forget_snapshot(files)
    try:
        return dlog.read_snapshot(files)
    finally:
        dlog.forget_snapshot(files)


def _seen(snap: dlog.LogSnapshot | None) -> object:
    if snap is None:
        return None
    return (snap.version, sorted((a["path"], json.dumps(a.get("deletionVector"), sort_keys=True)) for a in snap.adds),
            snap.txns, snap.configuration, snap.table_id)


def _hand_commit(table: Path, version: int, adds: list[str], removes: list[str] = ()) -> None:  # type: ignore[assignment]
    """A commit as another process writes it: the next ``N.json`` of the log, by hand."""
    now = int(time.time() * 1000)
    lines = [json.dumps({"commitInfo": {"timestamp": now, "operation": "WRITE",
                                        "operationParameters": {"mode": "Append"}}})]
    lines += [json.dumps({"remove": {"path": p, "deletionTimestamp": now, "dataChange": True}}) for p in removes]
    lines += adds
    (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_kept_log_reads_as_the_whole_log_after_any_sequence_of_changes(spark, tmp_path: Path, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Random commits of this JVM, commits written by another process, Delta checkpoints and the
    table dropped and made again at the same path: after each, the snapshot read with the kept log
    equals the one replayed from the log alone."""
    rnd = random.Random(seed)
    table = tmp_path / "t"
    spark.createDataFrame([(0,)], "x int").write.format("delta").save(str(table))
    files = TableFiles(str(table))

    def data_file(tag: str) -> str:
        rel = f"part-{tag}-{uuid.uuid4().hex[:6]}.parquet"
        pq.write_table(pa.table({"x": pa.array([1], pa.int32())}), table / rel)
        return new_add(rel, {}, (table / rel).stat().st_size, 1)

    for step in range(24):
        log = TableLog(spark, str(table))
        kind = rnd.choice(["jvm", "jvm", "hand", "checkpoint", "app"] + (["recreate"] if step in (9, 17) else []))
        if kind == "jvm":
            snap = dlog.read_snapshot(files)
            assert snap is not None
            gone = [a for a in snap.adds if rnd.random() < 0.4]
            from deltawheel.statestore.delta.txn import FileEntry

            log.commit(remove=[FileEntry(path=a["path"], partition_values=(), size=int(a["size"]),
                                         has_deletion_vector=False, action_json=json.dumps({"add": a})) for a in gone],
                       add=[data_file("j") for _ in range(rnd.randint(0, 2))])
        elif kind == "app":
            log.commit(app_versions={f"app{rnd.randint(0, 2)}": step})
        elif kind == "hand":
            snap = dlog.read_snapshot(files)
            assert snap is not None
            gone = [a["path"] for a in snap.adds if rnd.random() < 0.3]
            _hand_commit(table, snap.version + 1, [data_file("h") for _ in range(rnd.randint(1, 2))], gone)
        elif kind == "checkpoint":
            d = delta_classes(jvm(spark))
            version = log.version_now()  # this JVM's snapshot brought up to the hand-written commits
            log._log.checkpoint(log._log.getSnapshotAt(version, d.none, d.none, False), d.none)
            assert any(".checkpoint." in n for n in (table / "_delta_log").iterdir() for n in [n.name])
        else:  # dropped and made again, as many versions as before or more
            before = dlog.read_snapshot(files)
            assert before is not None
            shutil.rmtree(table)
            spark.createDataFrame([(9,)], "x int").write.format("delta").save(str(table))
            for v in range(1, before.version + 2):
                _hand_commit(table, v, [data_file("r")])
        kept, whole = dlog.read_snapshot(files), _whole(files)
        assert _seen(kept) == _seen(whole), f"step {step} ({kind})"
        dlog.read_snapshot(files)  # keep it again for the next step


def _rows_file(table: Path, computation: str, iv: int, seq: int) -> str:
    """A claim's fence row for ``iv`` under ``seq``, written as another process writes it."""
    row = KeyRow(computation=computation, key=FENCE_KEY, interval=iv, sequencer=seq, commit_id="other:1",
                 updated_ms=int(time.time() * 1000)).to_row()
    schema = arrow_schema(rows_file_ddl())
    rel = f"computation={computation}/interval={iv}/part-{uuid.uuid4().hex}-claim.snappy.parquet"
    (table / rel).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{c: row.get(c) for c in schema.names}], schema=schema), table / rel)
    return new_add(rel, {"computation": computation, "interval": str(iv)}, (table / rel).stat().st_size, 1)


def test_a_writer_that_skipped_the_listing_is_fenced_by_a_claim_it_never_saw(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A writer whose own commit was the newest it knew commits again without listing the log. Another
    process's takeover claimed its interval meanwhile (a commit this JVM never read): the commit must
    fail as stale and land nothing, and the claim's fence must stay."""
    old = RowStore(spark, migrated_store, writer="old")
    key = "a"
    iv = interval_of(key, N)
    old.fence("counter", {iv: 1})
    old.commit("counter", [KeyRow(computation="counter", key=key, interval=iv, state=J.encode(1))], sequencers={iv: 1})
    old.commit("counter", [KeyRow(computation="counter", key=key, interval=iv, state=J.encode(2))], sequencers={iv: 1})
    table = Path(migrated_store.rows_of("counter"))
    files = TableFiles(str(table))
    assert dlog.own_snapshot(files, "old") is not None  # the next commit skips the listing
    version = commit_metadata(spark, migrated_store, "counter")[-1][0]
    _hand_commit(table, version + 1, [_rows_file(table, "counter", iv, 2)])
    with pytest.raises(StaleSequencerError, match="owned under sequencer 2"):
        old.commit("counter", [KeyRow(computation="counter", key=key, interval=iv, state=J.encode(3))],
                   sequencers={iv: 1})
    assert commit_metadata(spark, migrated_store, "counter")[-1][0] == version + 1  # nothing landed
    fences = RowStore(spark, migrated_store, writer="reader").fences("counter")
    assert fences[iv] == 2
    got = RowStore(spark, migrated_store, writer="reader").read_keys("counter", [key], num_intervals=N)
    assert J.decode(got[key].state) == 2


@pytest.mark.parametrize("seed", [5, 6])
def test_writers_interleaved_with_foreign_commits_lose_no_update(spark, migrated_store, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Two writers of one table (intervals of their own) commit in a random order, with commits of
    another process landing between them in intervals neither holds: every key ends at its last
    written value, whichever commits skipped the listing, were rebased by Delta or read the files
    this process wrote from memory."""
    rnd = random.Random(seed)
    writers = {"w0": (0, 1), "w1": (2,)}
    stores = {w: RowStore(spark, migrated_store, writer=w) for w in writers}
    for w, ivs in writers.items():
        stores[w].fence("counter", {iv: 1 for iv in ivs})
    keys = [f"k{i}" for i in range(40) if interval_of(f"k{i}", N) != 3]
    model: dict[str, int] = {}
    table = Path(migrated_store.rows_of("counter"))
    for step in range(18):
        if rnd.random() < 0.25:  # another process, in interval 3
            version = commit_metadata(spark, migrated_store, "counter")[-1][0]
            _hand_commit(table, version + 1, [_rows_file(table, "counter", 3, 1)])
            continue
        w = rnd.choice(sorted(writers))
        mine = [k for k in keys if interval_of(k, N) in writers[w]]
        picked = rnd.sample(mine, rnd.randint(1, 4))
        for k in picked:
            model[k] = step
        stores[w].commit("counter", [KeyRow(computation="counter", key=k, interval=interval_of(k, N),
                                            state=J.encode(step)) for k in picked],
                         sequencers={iv: 1 for iv in writers[w]})
    got = RowStore(spark, migrated_store, writer="reader").read_keys("counter", list(model), num_intervals=N)
    assert {k: J.decode(r.state) for k, r in got.items()} == model


def test_a_writers_commits_run_no_spark_job(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A batch's commit is file work and one Delta transaction: no Spark job runs for it on the
    committing thread (Delta reconstructed the read snapshot's state with a job at every commit while
    its checksums carried deletion-vector counts). The keys end as written."""
    store = RowStore(spark, migrated_store, writer="w")
    keys = [f"k{i}" for i in range(24)]
    ivs = sorted({interval_of(k, N) for k in keys})
    store.fence("counter", {iv: 1 for iv in ivs})
    group = f"commits-{uuid.uuid4().hex[:8]}"
    sc = spark.sparkContext
    sc.setJobGroup(group, "the commits under test")
    model: dict[str, int] = {}
    try:
        for step in range(12):
            picked = keys[step * 2 % len(keys):step * 2 % len(keys) + 5]
            model.update(dict.fromkeys(picked, step))
            store.commit("counter", [KeyRow(computation="counter", key=k, interval=interval_of(k, N),
                                            state=J.encode(step)) for k in picked],
                         sequencers={iv: 1 for iv in ivs})
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert list(sc.statusTracker().getJobIdsForGroup(group)) == []
    got = RowStore(spark, migrated_store, writer="reader").read_keys("counter", keys, num_intervals=N)
    assert {k: J.decode(r.state) for k, r in got.items()} == model


@pytest.mark.parametrize("seed", [7])
def test_a_commit_ends_in_one_py4j_call_and_lands_what_the_py4j_path_lands(spark, migrated_store, seed: int) -> None:  # type: ignore[no-untyped-def]
    """The session built by deltawheel ends each commit in the JVM (``TxnCommit.java``: reads
    recorded, removes, adds and the commit in one call). The same random commits, ended call by
    call through py4j in another table, leave the same keys and the same log, in far fewer calls."""
    import threading

    import py4j.clientserver as cs

    d = delta_classes(jvm(spark))
    assert d.txn_commit is not None  # its jar is in the session deltawheel builds
    calls: dict[str, int] = {}
    send = cs.ClientServerConnection.send_command

    def counted(conn, command):  # type: ignore[no-untyped-def]
        name = threading.current_thread().name
        calls[name] = calls.get(name, 0) + 1
        return send(conn, command)

    rnd = random.Random(seed)
    keys = [f"k{i}" for i in range(30)]
    steps = [rnd.sample(keys, rnd.randint(1, 6)) for _ in range(10)]
    ends: dict[str, tuple[dict[str, int], list[tuple[int, int]], int]] = {}
    helper = d.txn_commit
    for comp, in_jvm in (("viajvm", True), ("viapy4j", False)):
        store = RowStore(spark, migrated_store, writer=comp)
        store.fence(comp, {iv: 1 for iv in range(N)})
        d.txn_commit = helper if in_jvm else None
        cs.ClientServerConnection.send_command = counted
        calls.clear()
        try:
            for step, picked in enumerate(steps):
                store.commit(comp, [KeyRow(computation=comp, key=k, interval=interval_of(k, N), state=J.encode(step))
                                    for k in picked], sequencers={iv: 1 for iv in range(N)})
        finally:
            cs.ClientServerConnection.send_command = send
            d.txn_commit = helper
        made = calls.get(threading.current_thread().name, 0)
        got = RowStore(spark, migrated_store, writer="reader").read_keys(comp, keys, num_intervals=N)
        folder = Path(migrated_store.rows_of(comp).removeprefix("file:")) / "_delta_log"
        actions = [[json.loads(line) for line in f.read_text().splitlines()] for f in sorted(folder.glob("*.json"))]
        log = [(sum("add" in a for a in acts), sum("remove" in a for a in acts), sum("txn" in a for a in acts))
               for acts in actions]
        ends[comp] = ({k: J.decode(r.state) for k, r in got.items()}, log, made)
    (jvm_rows, jvm_log, jvm_calls), (py_rows, py_log, py_calls) = ends["viajvm"], ends["viapy4j"]
    assert jvm_rows == py_rows and set(jvm_rows) == set().union(*steps)
    assert jvm_log == py_log and sum(removes > 0 for _adds, removes, _txns in jvm_log) >= len(steps) - 1
    assert jvm_calls < py_calls - 5 * len(steps), (jvm_calls, py_calls)


@pytest.mark.parametrize("seed", [11])
def test_a_commit_is_refused_exactly_when_a_commit_since_its_read_touched_its_partitions(spark, migrated_store,
                                                                                          seed: int) -> None:  # type: ignore[no-untyped-def]
    """``untouched_since``: other processes' commits land between a writer's read and its commit, each
    in a random interval; the commit is refused (StaleFilesError) exactly when one of them touched an
    interval of the writer's."""
    from deltawheel.statestore.exceptions import StaleFilesError

    rnd = random.Random(seed)
    RowStore(spark, migrated_store, writer="w").fence("counter", {0: 1, 1: 1})
    table = Path(migrated_store.rows_of("counter"))
    log = TableLog(spark, str(table))
    mine = [{"computation": "counter", "interval": "0"}, {"computation": "counter", "interval": "1"}]
    outcomes = []
    for _ in range(10):
        read = log.version_now()
        touched = False
        for _k in range(rnd.randint(0, 3)):
            version = max(dlog.json_commit_versions(str(table)) or [0])
            iv = rnd.randrange(N)
            touched |= iv in (0, 1)
            _hand_commit(table, version + 1, [_rows_file(table, "counter", iv, 1)])
        try:
            got = log.commit(add=[_rows_file(table, "counter", 0, 1)], untouched_since=(read, mine))
        except StaleFilesError:
            outcomes.append(touched)
            assert touched, "refused though no commit since the read touched its intervals"
            continue
        outcomes.append(touched)
        assert not touched, f"commit {got} landed over a commit that touched its intervals"
    assert True in outcomes and False in outcomes  # both ways were taken
