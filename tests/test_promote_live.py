"""``deltawheel promote`` while the pipeline runs, of a stage fed by input files:
everything a tool can check is checked before the live stage hands its intervals over, the replay
is caught up while the stage runs, the stage pauses only for the hand-over, the few batches it made
meanwhile and the fenced commit, and goes on from the promoted state exactly once; real Spark,
ZooKeeper and Delta (the pipeline runs in this process, ``engine.start_pipeline``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

import pytest
import test_kafka

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]

kafka_broker = test_kafka.kafka_broker  # the Kafka tests' broker fixture

PER_FILE = 40
FILES = 14


def wait_for(what: str, check: Callable[[], bool], run: Any, *, timeout_s: float = 900.0) -> None:
    """Wait until ``check()``; a failed batch of ``run`` is raised at once."""
    deadline = time.monotonic() + timeout_s
    while not check():
        run.check()
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.5)


def balance_commits(spark: Any, layout: Any) -> list[Any]:
    from deltawheel.statestore.inspection.positions import computation_commits

    return [c for c in computation_commits(spark, layout, "balance") if c.reruns and c.files]


@pytest.mark.timeout(2400)
def test_promote_of_a_stage_fed_by_input_files_while_the_pipeline_runs(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, capsys, monkeypatch, migrated_at) -> None:
    from balance_pipeline import INPUT_ENV, make, payment_rows, write_payments
    from deltawheel.executor.drivers.promote import promote
    from deltawheel.executor.drivers.replay import load_code, shadow_chroot
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.exceptions import ConfigError, InputGoneError, ReplayBehindError
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.zk.client import connect

    import deltawheel

    folder, store, into = tmp_path / "input", tmp_path / "store", tmp_path / "shadow"
    layout, shadow = migrated_at(store), StoreLayout(str(into))  # a migrated copy: connect migrating a new store runs in test_connect.py
    first_mtime = int(time.time()) - 3600
    payments: dict[str, list[dict[str, Any]]] = {}

    def add(i: int) -> None:
        rows = payment_rows(i * PER_FILE, PER_FILE, seed=7)
        name = f"payments-{i:05d}.parquet"
        payments[name] = rows
        write_payments(folder, i, rows)
        os.utime(folder / name, (first_mtime + i, first_mtime + i))  # read in this order

    for i in range(3):
        add(i)
    monkeypatch.setenv(INPUT_ENV, str(folder))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # --source adds its module's folder
    zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="payments") as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds")
        wait_for("balance committed two batches", lambda: len(balance_commits(spark, layout)) >= 2, run)
        start = balance_commits(spark, layout)[0].version  # the replay re-runs at least one batch
        stop_writing = threading.Event()

        def writer() -> None:  # input keeps arriving while the tools run
            for i in range(3, FILES):
                if stop_writing.wait(1.5):
                    return
                add(i)

        feeding = threading.Thread(target=writer, name="input-writer")
        feeding.start()
        try:
            assert main(["replay", "--store", str(store), "--pipeline", "payments", "--computation", "balance",
                         "--from-version", str(start), "--code", "balance_pipeline:DoubledBalance", "--source",
                         "balance_pipeline:pipeline", "--into", str(into), *zk]) == 0
            reached = json.loads((into / "_replay.json").read_text())["reached"]
            wait_for("the live stage ran two batches the replay has not",
                     lambda: len([c for c in balance_commits(spark, layout) if c.version > reached]) >= 2, run)
            capsys.readouterr()

            # refusals that come before the hand-over: the live stage is never paused by them
            client = connect(zk_config)
            code = load_code("balance_pipeline:DoubledBalance", "balance")
            shadow_zk = ZkConfig(hosts=zk_config.hosts, chroot=shadow_chroot(zk_config.chroot, shadow))
            args = dict(store=layout, into=shadow, client=client, pipeline="payments", code=code,
                        shadow_zk=shadow_zk, wait_s=600)
            try:
                with pytest.raises(ConfigError, match=r"balance reads \['payments'\], which are not stream tables .* "
                                                      r"give the live pipeline with --source"):
                    promote(spark, **args)  # type: ignore[arg-type]
                injectors = make(str(folder)).injectors
                gone = sorted(balance_commits(spark, layout), key=lambda c: c.version)[-1].files[0]
                kept = (folder / gone).read_bytes(), (folder / gone).stat().st_mtime
                (folder / gone).unlink()
                with pytest.raises(InputGoneError, match=rf"the input of live batch .* is gone: .*{gone}"):
                    promote(spark, injectors=injectors, **args)  # type: ignore[arg-type]
                (folder / gone).write_bytes(kept[0])
                os.utime(folder / gone, (kept[1], kept[1]))
                marker = (into / "_replay.json").read_text()
                (into / "_replay.json").write_text(json.dumps({k: v for k, v in json.loads(marker).items()
                                                               if k != "ran"}))  # an older deltawheel's marker
                with pytest.raises(ReplayBehindError, match=r"has not run \d+ live commits of balance up to rows "
                                                            r"version \d+.*made by an older deltawheel"):
                    promote(spark, injectors=injectors, **args)  # type: ignore[arg-type]
                # a replay that reached past a live commit it did not re-run (a replay that read the wrong files did)
                skipped = json.loads(marker)
                missed = skipped["ran"].pop()
                (into / "_replay.json").write_text(json.dumps(skipped))
                with pytest.raises(ReplayBehindError, match=rf"has not run 1 live commits of balance .*: {missed} "
                                                            r"\(batch \d+(, without input)?: not re-run by the replay\)"
                                                            r".*continue the "
                                                            r"replay into"):
                    promote(spark, injectors=injectors, **args)  # type: ignore[arg-type]
                (into / "_replay.json").write_text(marker)
            finally:
                client.stop()
                client.close()
            assert not [line for line in lines if "handing intervals over" in line]

            # the promotion: --source comes from the replay's marker, the catch-up runs before the hand-over
            assert main(["promote", "--from", str(into), "--store", str(store), "--pipeline", "payments",
                         "--computation", "balance", "--wait", "600", "--json", *zk]) == 0
            result = json.loads(capsys.readouterr().out)
        finally:
            stop_writing.set()
            feeding.join()
        assert [line for line in lines if "balance: handing intervals over to promote" in line]
        # the live stage takes them again once the request is gone: after promote returned
        wait_for("the live stage took its intervals again", lambda: any(
            "balance: intervals taken again after promote" in line for line in lines), run, timeout_s=300)
        phases = [p["phase"] for p in result["phases"]]
        assert any(p.startswith("catch-up before the hand-over") for p in phases), phases
        paused = [p["phase"] for p in result["phases"] if p["paused"]]
        assert any(p.startswith("fenced commit") for p in paused) and result["paused_s"] is not None, result
        assert not any(p.startswith("catch-up before") or p.startswith("checks") for p in paused), paused
        promoted_at = int(result["version"])
        everything = set(payments)
        wait_for("the live stage read every file", lambda: {f for c in balance_commits(spark, layout)
                                                            for f in c.files} == everything, run)
        run.stop()

    # what the live store holds: the replayed batches' payments doubled, the others once
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("json")
    # the replay's: the batches after its start version up to the promotion (its seed holds the ones before)
    replayed = {f for c in balance_commits(spark, layout) if start < c.version < promoted_at for f in c.files}
    want: dict[str, tuple[int, int]] = {}
    for name, rows in payments.items():
        for p in rows:
            n, total = want.get(p["account"], (0, 0))
            want[p["account"]] = (n + 1, total + p["amount"] * (2 if name in replayed else 1))
    rows = spark.read.format("delta").load(layout.rows_of("balance")).where("computation = 'balance'").collect()
    state = {r["key"]: codec.decode(r["state"]) for r in rows if not r["key"].startswith("\x00") and r["state"]}
    assert {k: (s["n"], s["sum"]) for k, s in state.items()} == want
    # the balances stream: every payment's sequence number once per account, none repeated or missing
    seqs: dict[str, list[int]] = {}
    for r in spark.read.format("delta").load(layout.stream("balances")).collect():
        v = codec.decode(r["value"])
        seqs.setdefault(v["account"], []).append(v["seq"])
    assert {k: sorted(v) for k, v in seqs.items()} == {k: list(range(1, n + 1)) for k, (n, _) in want.items()}


@pytest.mark.kafka
@pytest.mark.slow  # a Kafka broker, a live pipeline, a replay and a promotion: minutes on a loaded machine
@pytest.mark.timeout(2400)
def test_promote_of_a_stage_fed_by_kafka_while_the_pipeline_runs(  # type: ignore[no-untyped-def]
        spark, kafka_broker, zk_config, tmp_path, capsys, monkeypatch) -> None:
    """The same for a computation reading a Kafka topic: the replay re-reads each live batch's
    offset ranges, the promotion catches it up before and under the hand-over, and the pipeline goes
    on from the promoted state: every message counted once per card, each count produced once."""
    from deltawheel.statestore.layout import StoreLayout
    from kafka_pipeline import NAME, card_messages, make
    from test_kafka import kafka_ready, produce

    import deltawheel
    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers, topic = kafka_broker.bootstrap_servers, "promote-cards"
    create_topic(spark, servers, topic, partitions=2)
    monkeypatch.setenv("KAFKA_SERVERS", servers)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # --source adds its module's folder
    produce(spark, servers, topic, card_messages(0, 20, lag_ms=0))
    store, into = tmp_path / "store", tmp_path / "shadow"
    layout = StoreLayout(str(store))
    zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    lines: list[str] = []
    sent = 20

    def commits() -> list[Any]:
        from deltawheel.statestore.inspection.positions import computation_commits

        return [c for c in computation_commits(spark, layout, "card_count") if c.reruns and c.kafka]

    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline=NAME) as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(servers, topic)[1], trigger="300 milliseconds")
        wait_for("card_count committed a batch", lambda: len(commits()) >= 1, run)
        start = commits()[0].version
        produce(spark, servers, topic, card_messages(sent, 20, lag_ms=0))
        sent += 20
        assert main(["replay", "--store", str(store), "--pipeline", NAME, "--computation", "card_count",
                     "--from-version", str(start), "--source", "kafka_pipeline:pipeline", "--into", str(into),
                     *zk]) == 0
        reached = json.loads((into / "_replay.json").read_text())["reached"]
        produce(spark, servers, topic, card_messages(sent, 20, lag_ms=0))
        sent += 20
        wait_for("a live batch the replay has not run", lambda: any(c.version > reached for c in commits()), run)
        capsys.readouterr()
        assert main(["promote", "--from", str(into), "--store", str(store), "--pipeline", NAME, "--computation",
                     "card_count", "--wait", "600", "--json", *zk]) == 0
        result = json.loads(capsys.readouterr().out)
        assert any(p["phase"].startswith("catch-up before the hand-over") for p in result["phases"]), result
        assert [line for line in lines if "card_count: intervals taken again after promote" in line]
        produce(spark, servers, topic, card_messages(sent, 20, lag_ms=0))
        sent += 20
        wait_for("every message counted", lambda: spark.read.format("delta").load(
            layout.stream("card_counts")).count() >= sent, run)
        run.stop()
    counts: dict[str, list[int]] = {}
    for r in spark.read.format("delta").load(layout.stream("card_counts")).collect():
        v = json.loads(bytes(r.value))
        counts.setdefault(v["card"], []).append(v["n"])
    per_card = {f"c{k}": len(range(k, sent, 5)) for k in range(5)}
    assert {c: sorted(ns) for c, ns in counts.items()} == {c: list(range(1, n + 1)) for c, n in per_card.items()}


@pytest.mark.slow  # two bounded runs, a replay and a promotion (about a minute)
@pytest.mark.timeout(1200)
def test_a_batch_that_lands_during_the_catch_up_is_run_under_the_leases_and_promoted(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, capsys, monkeypatch, migrated_at) -> None:
    """One live batch lands while promote catches the replay up before the hand-over, and none after:
    the catch-up stops one behind (``close_gap``'s ``near``) and leaves it to the catch-up under the
    leases. That one looked only at the commits after the hand-over's check, found none, and the proof
    refused with ``ReplayBehindError`` (1 live commit not re-run): the flake of the live promote tests."""
    from balance_pipeline import INPUT_ENV, make, payment_rows, write_payments
    from deltawheel.executor.drivers import replay_run
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.surgery.audit import read_audit

    folder, store, into = tmp_path / "input", tmp_path / "store", tmp_path / "shadow"
    layout = migrated_at(store)
    first_mtime = int(time.time()) - 3600

    def add(i: int) -> None:
        write_payments(folder, i, payment_rows(i * PER_FILE, PER_FILE, seed=7))
        os.utime(folder / f"payments-{i:05d}.parquet", (first_mtime + i, first_mtime + i))

    def live_run() -> None:
        PipelineRunner(spark, layout, make(str(folder)), zk=zk_config, end_of_input=False,
                       progress=lambda line: None).run()

    for i in range(3):
        add(i)
    monkeypatch.setenv(INPUT_ENV, str(folder))
    live_run()
    commits = sorted(balance_commits(spark, layout), key=lambda c: c.version)
    zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    assert main(["replay", "--store", str(store), "--pipeline", "payments", "--computation", "balance",
                 "--from-version", str(commits[0].version), "--source", "balance_pipeline:pipeline",
                 "--into", str(into), *zk]) == 0
    landed: list[int] = []
    original = replay_run.ReplayRun.run

    def run_then_a_live_batch(self, batches, known):  # type: ignore[no-untyped-def]
        out = original(self, batches, known)
        if not landed:  # the first catch-up's end: one live batch lands, before the hand-over
            add(3)
            live_run()
            landed.append(max(c.version for c in balance_commits(spark, layout)))
        return out

    monkeypatch.setattr(replay_run.ReplayRun, "run", run_then_a_live_batch)
    capsys.readouterr()
    assert main(["promote", "--from", str(into), "--store", str(store), "--pipeline", "payments",
                 "--computation", "balance", "--no-wait", "--json", *zk]) == 0, capsys.readouterr().err
    assert landed and landed[0] > commits[-1].version
    audit = [a for a in read_audit(spark, layout) if a["tool"] == "promote"]
    detail = audit[0]["detail"] if len(audit) == 1 else None
    detail = json.loads(detail) if isinstance(detail, str) else detail
    assert detail is not None and detail["caught_up_batches"][-1] == 1, audit
