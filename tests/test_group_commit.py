"""Group commit at a shared rows table (``statestore/delta/group.py``) on real ZooKeeper and real Delta:
writers sharing a computation's intervals queue for its turn, and the holder commits the batches
waiting behind it with its own in one version. Each batch still lands once, all or nothing, and a
batch read before a takeover is refused, folded or not."""

from __future__ import annotations

import contextlib
import random
import threading
from typing import Any, Iterator

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.delta.log import batch_metas, commit_infos, user_metadata
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.exceptions import StaleSequencerError
from deltawheel.statestore.inspection.history import key_history
from deltawheel.statestore.inspection.positions import computation_commits
from deltawheel.statestore.rowtable.rows import KeyRow, interval_of
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.turns import CommitTurns, turns_path

pytestmark = pytest.mark.zk

CODEC = get_codec("json")


def _keys(intervals: tuple[int, ...], n: int, prefix: str) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n * len(intervals):
        k = f"{prefix}{i}"
        if interval_of(k, 8) in intervals:
            out.append(k)
        i += 1
    return out


def _held_until(turns: CommitTurns, queued: int, holding: threading.Event | None = None) -> Any:
    """``turns.turn`` whose holder, on its first turn, sets ``holding`` and waits until ``queued``
    writers queue behind it."""
    state = {"first": True}

    @contextlib.contextmanager
    def turn(computation: str, request: bytes | None = None) -> Iterator[Any]:
        with turns.turn(computation, request) as t:
            if t and state["first"]:
                state["first"] = False
                if holding is not None:
                    holding.set()
                path = turns_path(turns.pipeline, computation)
                for _ in range(400):
                    if len(turns.client.get_children(path)) > queued:
                        break
                    threading.Event().wait(0.05)
            yield t
    return turn


def _batches(spark: Any, layout: Any, computation: str) -> list[tuple[int, dict[str, Any]]]:
    """(version, batch meta) of every batch in the rows table's log, oldest first."""
    files = table_files(spark, layout.rows_of(computation))
    assert files is not None
    return [(v, b) for v, info in commit_infos(files, after=-1) or []
            for b in batch_metas(user_metadata(info.get("userMetadata"))) if b.get("commit_id")]


@pytest.mark.parametrize("seed", [3, 17])
def test_writers_sharing_a_table_land_every_batch_once_and_the_state_adds_up(
        spark, zk_config, migrated_store, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Four writers, two intervals each, batches of random keys as fast as they can: however the turns
    fold them, every commit id is in the log exactly once and every key's count is what its writer
    counted. The first holder waits for the three others to queue, so one version holds four batches."""
    rnd = random.Random(seed)
    clients = [connect(zk_config) for _ in range(4)]
    turns = [CommitTurns(c, pipeline="p", writer=f"w{i}") for i, c in enumerate(clients)]
    stores = []
    holding = threading.Event()
    for i, t in enumerate(turns):
        store = RowStore(spark, migrated_store, writer=f"w{i}")
        store.turns = _held_until(t, 3, holding) if i == 0 else t.turn
        stores.append(store)
    ivs = [(2 * i, 2 * i + 1) for i in range(4)]
    seqs = [{iv: 10 + i for iv in ivs[i]} for i in range(4)]
    for store, s in zip(stores, seqs, strict=True):
        store.fence("shared", s, claim_only=True)
    plans = [[rnd.sample(_keys(ivs[i], 4, f"w{i}-"), rnd.randint(1, 6)) for _ in range(rnd.randint(3, 6))]
             for i in range(4)]
    counts: list[dict[str, int]] = [{} for _ in range(4)]
    ids: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            if i > 0:  # the others start once w0 holds its first turn
                assert holding.wait(60)
            for batch in plans[i]:
                rows = []
                for k in batch:
                    counts[i][k] = counts[i].get(k, 0) + 1
                    rows.append(KeyRow(computation="shared", key=k, interval=interval_of(k, 8),
                                       state=CODEC.encode({"n": counts[i][k]})))
                ids[i].append(stores[i].commit("shared", rows, sequencers=seqs[i], num_intervals=8).commit_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=180)
        assert errors == []
        logged = [b["commit_id"] for _v, b in _batches(spark, migrated_store, "shared")
                  if b.get("kind") == "commit"]
        mine = [c for per in ids for c in per]
        assert sorted(logged) == sorted(mine)  # each batch once, none lost
        per_version: dict[int, int] = {}
        for v, b in _batches(spark, migrated_store, "shared"):
            per_version[v] = per_version.get(v, 0) + (b.get("kind") == "commit")
        assert max(per_version.values()) == 4  # the first holder folded the three waiting batches
        assert sum(t.served for t in turns) == sum(t.folded for t in turns) >= 3
        # replay's reading of the log: a commit per batch, a group's sharing its version
        commits = [c for c in computation_commits(spark, migrated_store, "shared") if c.kind == "commit"]
        assert sorted(str(c.meta["commit_id"]) for c in commits) == sorted(mine)
        assert len({c.version for c in commits}) == sum(1 for n in per_version.values() if n)
        for i in range(4):
            got = {r.key: CODEC.decode(r.state)["n"] for r in stores[i].scan_intervals("shared", ivs[i])}
            assert got == counts[i]
        # a key's history names the writer whose batch changed it, in a group version too
        files = table_files(spark, migrated_store.rows_of("shared"))
        for i in range(4):
            key = plans[i][0][0]
            h = key_history(files, computation="shared", key=key)
            assert {c.commit.writer for c in h.changes} == {f"w{i}"}
            assert len(h.changes) == counts[i][key]
    finally:
        for c in clients:
            c.stop()
            c.close()


def test_a_batch_read_before_a_takeover_is_not_folded_and_its_writer_is_fenced(
        spark, zk_config, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A zombie's batch waits behind the holder while a new owner takes its interval over: the holder
    commits its own batch alone, and the zombie's own commit then fails typed; nothing of it lands."""
    holder_c, zombie_c = connect(zk_config), connect(zk_config)
    holder_t = CommitTurns(holder_c, pipeline="p", writer="holder")
    zombie_t = CommitTurns(zombie_c, pipeline="p", writer="zombie")
    holder = RowStore(spark, migrated_store, writer="holder")
    zombie = RowStore(spark, migrated_store, writer="zombie")
    successor = RowStore(spark, migrated_store, writer="successor")  # no turns: a claim is never held up
    holding, go = threading.Event(), threading.Event()

    @contextlib.contextmanager
    def holder_turn(computation: str, request: bytes | None = None) -> Iterator[Any]:
        with holder_t.turn(computation, request) as t:
            holding.set()
            assert go.wait(60)
            yield t
    holder.turns, zombie.turns = holder_turn, zombie_t.turn
    holder.fence("c", {1: 5}, claim_only=True)
    zombie.fence("c", {0: 5}, claim_only=True)
    hk, zk_ = _keys((1,), 2, "h-"), _keys((0,), 2, "z-")
    results: dict[str, Any] = {}

    def run(name: str, store: RowStore, keys: list[str], iv: int) -> None:
        try:
            rows = [KeyRow(computation="c", key=k, interval=iv, state=CODEC.encode({"n": 1})) for k in keys]
            results[name] = store.commit("c", rows, sequencers={iv: 5}, num_intervals=8).commit_id
        except BaseException as exc:
            results[name] = exc

    th = threading.Thread(target=run, args=("holder", holder, hk, 1))
    tz = threading.Thread(target=run, args=("zombie", zombie, zk_, 0))
    try:
        th.start()
        assert holding.wait(60)
        tz.start()
        path = turns_path("p", "c")
        for _ in range(400):  # the zombie's request queued behind the holder
            kids = holder_c.get_children(path)
            if len(kids) == 2 and any(holder_c.get(f"{path}/{k}")[0].startswith(b"R") for k in kids):
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the zombie's batch never queued")
        successor.fence("c", {0: 6})  # the takeover lands while the holder holds the turn
        go.set()
        th.join(120)
        tz.join(120)
        assert isinstance(results["holder"], str)
        assert isinstance(results["zombie"], StaleSequencerError), results["zombie"]
        landed = [b.get("commit_id") for _v, b in _batches(spark, migrated_store, "c") if b.get("kind") == "commit"]
        assert landed == [results["holder"]]  # the zombie's batch nowhere
        assert {r.key for r in holder.scan_intervals("c", [0, 1])} == set(hk)
        assert holder_t.folded == 0 and zombie_t.served == 0
    finally:
        go.set()
        for c in (holder_c, zombie_c):
            c.stop()
            c.close()


def test_a_batch_committed_for_its_writer_but_never_marked_is_not_committed_twice(
        spark, zk_config, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """The holder commits a waiting batch and dies before it marks it done (here: the mark is never
    written): the waiter commits in its own turn, finds its batch already in the log, and returns it."""
    a_c, b_c = connect(zk_config), connect(zk_config)
    a_t, b_t = CommitTurns(a_c, pipeline="p", writer="a"), CommitTurns(b_c, pipeline="p", writer="b")

    @contextlib.contextmanager
    def unmarked(computation: str, request: bytes | None = None) -> Iterator[Any]:
        with _held_until(a_t, 1)(computation, request) as t:
            if t:
                t.folded = lambda nodes, version: list(nodes)  # the marks are lost
            yield t
    a, b = RowStore(spark, migrated_store, writer="a"), RowStore(spark, migrated_store, writer="b")
    a.turns, b.turns = unmarked, b_t.turn
    a.fence("c", {0: 3}, claim_only=True)
    b.fence("c", {1: 3}, claim_only=True)
    out: dict[str, Any] = {}

    def run(name: str, store: RowStore, iv: int) -> None:
        try:
            keys = _keys((iv,), 3, f"{name}-")
            rows = [KeyRow(computation="c", key=k, interval=iv, state=CODEC.encode({"n": 1})) for k in keys]
            out[name] = store.commit("c", rows, sequencers={iv: 3}, num_intervals=8).commit_id
        except BaseException as exc:
            out[name] = exc

    ta = threading.Thread(target=run, args=("a", a, 0))
    ta.start()
    for _ in range(200):  # a holds the turn before b queues
        if a_t.taken:
            break
        threading.Event().wait(0.05)
    tb = threading.Thread(target=run, args=("b", b, 1))
    tb.start()
    try:
        ta.join(120)
        tb.join(120)
        assert isinstance(out["a"], str) and isinstance(out["b"], str), out
        logged = [bm.get("commit_id") for _v, bm in _batches(spark, migrated_store, "c")
                  if bm.get("kind") == "commit"]
        assert sorted(logged) == sorted([out["a"], out["b"]])  # b's batch once, in a's version
        versions = {v for v, bm in _batches(spark, migrated_store, "c") if bm.get("commit_id") in (out["a"], out["b"])}
        assert len(versions) == 1
        assert b_t.served == 0 and b_t.taken == 1  # b held its own turn and found its batch landed
        assert sorted(r.key for r in b.scan_intervals("c", [1])) == sorted(_keys((1,), 3, "b-"))
    finally:
        for c in (a_c, b_c):
            c.stop()
            c.close()


def test_a_batch_queued_while_the_holder_updates_its_snapshot_joins_its_version(
        spark, zk_config, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """The holder looks at the queue once more after its snapshot's update: a writer that queued
    meanwhile (here: right after the holder's first look) lands in the holder's version, once, and
    commits nothing itself."""
    clients = [connect(zk_config) for _ in range(3)]
    a_t, b_t, late_t = (CommitTurns(c, pipeline="p", writer=w) for c, w in zip(clients, ("a", "b", "late"), strict=True))
    stores = {w: RowStore(spark, migrated_store, writer=w) for w in ("a", "b", "late")}
    out: dict[str, Any] = {}

    def run(name: str, iv: int) -> None:
        try:
            rows = [KeyRow(computation="c", key=k, interval=iv, state=CODEC.encode({"n": 1}))
                    for k in _keys((iv,), 3, f"{name}-")]
            out[name] = stores[name].commit("c", rows, sequencers={iv: 3}, num_intervals=8).commit_id
        except BaseException as exc:
            out[name] = exc

    threads = {w: threading.Thread(target=run, args=(w, iv)) for w, iv in (("a", 0), ("b", 1), ("late", 2))}

    @contextlib.contextmanager
    def late_joins(computation: str, request: bytes | None = None) -> Iterator[Any]:
        with _held_until(a_t, 1)(computation, request) as t:
            if t:
                first_look = t.waiting

                def waiting(limit: int = 64) -> Any:
                    seen = first_look(limit)
                    if not threads["late"].is_alive() and "late" not in out:
                        threads["late"].start()  # queues after the first look
                        path = turns_path("p", computation)
                        for _ in range(400):
                            if len(clients[0].get_children(path)) > 2:
                                break
                            threading.Event().wait(0.05)
                    return seen
                t.waiting = waiting
            yield t
    stores["a"].turns, stores["b"].turns, stores["late"].turns = late_joins, b_t.turn, late_t.turn
    for w, iv in (("a", 0), ("b", 1), ("late", 2)):
        stores[w].fence("c", {iv: 3}, claim_only=True)
    threads["a"].start()
    for _ in range(200):  # a holds the turn before b queues
        if a_t.taken:
            break
        threading.Event().wait(0.05)
    threads["b"].start()
    try:
        for th in threads.values():
            th.join(120)
        assert all(isinstance(out[w], str) for w in ("a", "b", "late")), out
        batches = [(v, bm.get("commit_id")) for v, bm in _batches(spark, migrated_store, "c") if bm.get("kind") == "commit"]
        ids = [out[w] for w in ("a", "b", "late")]
        assert sorted(c for _v, c in batches if c in ids) == sorted(ids)  # each once
        assert len({v for v, c in batches if c in ids}) == 1  # in one version, a's
        assert (b_t.served, late_t.served, late_t.taken) == (1, 1, 0)
        assert sorted(r.key for r in stores["late"].scan_intervals("c", [2])) == sorted(_keys((2,), 3, "late-"))
    finally:
        for c in clients:
            c.stop()
            c.close()


def test_a_holder_behind_another_host_s_commit_refuses_the_batch_it_touched(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Another host commits to the table (here: the same folder reached through a symbolic link, so
    this JVM's snapshot of it does not advance): a holder whose snapshot is behind still commits
    after that commit, refusing the waiting batch it touched and taking the others; a holder whose
    snapshot is its own newest commit refuses its own batch once another host touches its partition."""
    import json
    import os

    from deltawheel.statestore.delta.txn import CommitRequest, TableLog, new_add
    from deltawheel.statestore.exceptions import StaleFilesError

    table = tmp_path / "t"
    spark.createDataFrame([(0, "a")], "p int, v string").write.partitionBy("p").format("delta").save(str(table))
    os.symlink(table, tmp_path / "elsewhere")
    here, there = TableLog(spark, str(table)), TableLog(spark, str(tmp_path / "elsewhere"))
    read = here.version_now()

    def request(p: int, name: str, at: int) -> CommitRequest:
        return CommitRequest(removes=(), adds=(new_add(f"p={p}/{name}.parquet", {"p": str(p)}, 10, 1),),
                             read_partitions=(f"p = {p}",), user_metadata=json.dumps({"commit_id": name}),
                             read_version=at, partitions=({"p": str(p)},))

    foreign = there.commit(add=[new_add("p=2/foreign.parquet", {"p": "2"}, 10, 1)])
    assert foreign == read + 1
    assert int(here._log.unsafeVolatileSnapshot().version()) == read  # this JVM's snapshot is behind

    def meta(metas: list[str]) -> str:
        return json.dumps({"kind": "group", "batches": [json.loads(m) for m in metas]})

    version, held = here.commit_requests([request(1, "own", read), request(2, "touched", read),
                                          request(3, "untouched", read)], group_meta=meta)
    assert (version, held) == (foreign + 1, [0, 2])
    names = sorted(os.path.basename(f) for f in spark.read.format("delta").load(str(table)).inputFiles())
    assert [n for n in names if not n.startswith("part-")] == ["foreign.parquet", "own.parquet", "untouched.parquet"]
    there.commit(add=[new_add("p=1/foreign2.parquet", {"p": "1"}, 10, 1)])
    with pytest.raises(StaleFilesError):
        here.commit_requests([request(1, "own2", version), request(3, "other", version)], group_meta=meta)
