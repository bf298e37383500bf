"""A replay's shadow store on ``s3a://`` (``replay --into s3a://...``) and ``promote`` from it into a
live store on ``s3a://``: the same checks as for a local folder (not the live store, not a
non-empty store of another pipeline), the marker on the object store, the promoted state continued
by the live pipeline, the audit row. Real S3Proxy (tests/conftest.py), Spark and ZooKeeper."""

from __future__ import annotations

import json
import uuid

import pytest
from deltawheel.statestore.exceptions import ConfigError, ReplayTargetError

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.objectstore]

PER_FILE = 500


def test_an_s3a_into_is_checked_as_a_local_one(spark, s3_bucket, object_store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.replay import MARKER, _check_into, into_files, read_marker
    from deltawheel.executor.drivers.replay_marker import write_marker
    from deltawheel.statestore.layout import StoreLayout

    live = StoreLayout(f"s3a://{s3_bucket}/{uuid.uuid4().hex}")
    into = StoreLayout(f"s3a://{s3_bucket}/{uuid.uuid4().hex}")
    check = dict(pipeline="zeitgeist", computation="model", spark=spark)
    assert _check_into(live, into, **check) is None  # nothing there yet: a new replay
    with pytest.raises(ReplayTargetError, match="is the live store"):
        _check_into(live, StoreLayout(live.root + "/"), **check)
    files = into_files(spark, into)
    assert not files.is_local
    files.fs.create_dir(files.path("rows"))
    with files.fs.open_output_stream(files.path("rows/part-0.parquet")) as fh:
        fh.write(b"not a replay")
    with pytest.raises(ReplayTargetError, match="is not empty: it holds files that are not a replay of this"):
        _check_into(live, into, **check)
    marker = {"store": live.root, "pipeline": "other", "computation": "model", "reached": 3, "from_version": 1}
    write_marker(files, marker)
    assert read_marker(into, spark=spark) == marker and files.read_text(MARKER) is not None
    with pytest.raises(ReplayTargetError, match="it holds a store of pipeline 'other', computation 'model'"):
        _check_into(live, into, **check)
    write_marker(files, {**marker, "pipeline": "zeitgeist"})  # an earlier replay of this one: continued
    assert _check_into(live, into, **check) == {**marker, "pipeline": "zeitgeist"}
    # a replay of another store (a local one) into it: refused, the marker names the store it holds
    with pytest.raises(ReplayTargetError, match=f"computation 'model' of {live.root}. Give an empty folder"):
        _check_into(StoreLayout(str(tmp_path / "live")), into, **check)
    with pytest.raises(ReplayTargetError, match="a replay's shadow store is a local folder or an s3a:// store"):
        into_files(spark, StoreLayout("abfss://c@acct.dfs.core.windows.net/shadow"))


def test_replay_into_an_object_store_needs_its_zookeeper(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("DELTAWHEEL_ZK", raising=False)
    rc = main(["replay", "--store", "live", "--pipeline", "zeitgeist", "--computation", "model", "--from-start",
               "--into", "s3a://bucket/shadow"])
    assert rc == 3 and "--into s3a://bucket/shadow is on an object store" in capsys.readouterr().err
    from deltawheel.executor.drivers.promote import check_replay
    from deltawheel.statestore.layout import StoreLayout

    with pytest.raises(ConfigError, match="is on an object store: its marker is read with a session's S3"):
        check_replay(StoreLayout("/tmp/x"), StoreLayout("s3a://bucket/shadow"), pipeline="zeitgeist",
                     computation="model")


@pytest.mark.zk
@pytest.mark.slow  # a pipeline on the object store run three times, a replay and a promotion there: minutes
@pytest.mark.timeout(2400)
def test_replay_into_s3a_then_promote_into_an_s3a_store_and_the_pipeline_goes_on(  # type: ignore[no-untyped-def]
        spark, s3_store_layout, zk_server, tmp_path, capsys) -> None:
    from deltawheel.executor.drivers.replay import read_marker
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from test_promote import _pipeline, _predictions, _state, expected_model

    from deltawheel.demo.zeitgeist import ZeitgeistParams, write_event_files

    layout = s3_store_layout
    store = layout.root
    params = ZeitgeistParams(n_events=6 * PER_FILE, seed=11, rate_per_s=20, n_queries=8)
    data = params.generate()
    folder = tmp_path / "input"  # the injector's files are local; every table is on S3
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/s3promote-{uuid.uuid4().hex[:8]}")
    zk_args = ["--zk", zk.hosts, "--zk-chroot", zk.chroot]

    def run(n: int) -> None:
        write_event_files(data.slice(0, n * PER_FILE), str(folder), events_per_batch=PER_FILE,
                          first_mtime_s=params.start_ms // 1000)
        PipelineRunner(spark, layout, _pipeline(folder, params.max_disorder_ms), zk=zk, end_of_input=False,
                       progress=lambda line: None).run()

    run(2)
    start = computation_commits(spark, layout, "model")[-1].version
    into = StoreLayout(f"{store}-shadow")
    argv = ["replay", "--store", store, "--pipeline", "zeitgeist", "--computation", "model", "--from-version",
            str(start), "--code", "promote_model:TaggedModel", *zk_args]
    assert main([*argv, "--into", f"{store}/", "--plan"]) == 3  # the live store itself: refused, nothing written
    assert "ReplayTargetError" in (err := capsys.readouterr().err) and "is the live store" in err, err
    assert main([*argv, "--into", into.root]) == 0, capsys.readouterr().err
    capsys.readouterr()
    marker = read_marker(into, spark=spark)
    assert marker is not None and marker["store"] == store and marker["reached"] >= start
    assert spark.read.format("delta").load(into.rows_of("model")).count() > 0  # the shadow rows are on S3
    run(4)  # the live pipeline went on (stopped now): the replay is behind it
    promote = ["promote", "--from", into.root, "--store", store, "--pipeline", "zeitgeist", "--computation", "model",
               *zk_args]
    assert main([*promote, "--plan"]) == 0
    out = capsys.readouterr().out
    assert "batches to catch up first, under the leases" in out, out
    assert main(promote) == 0
    out = capsys.readouterr().out
    assert "promoted" in out and "catching up" in out, out
    promoted = _state(spark, into.rows_of("model"), "model")
    assert any(st.get("panes") for st in promoted.values())
    run(6)  # the pipeline continues from the promoted state

    assert main(["sql", "--store", store, "--format", "json",
                 "SELECT tool, source, computation, rows_changed, commit_version FROM audit"]) == 0
    (audit,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert audit["tool"] == "promote" and audit["source"] == into.root and audit["computation"] == "model"
    assert audit["rows_changed"] == len(promoted)
    live, expected = _state(spark, layout.rows_of("model"), "model"), expected_model(spark, store)  # type: ignore[arg-type]
    assert set(live) == set(expected[0])
    for key, st in live.items():
        assert st.get("panes") == promoted.get(key, {}).get("panes")  # as promoted (the live code keeps it)
        assert {k: v for k, v in st.items() if k != "panes"} == expected[0][key]  # the rest: what came after
    got = _predictions(spark, store)
    assert len({(k, ts) for k, ts, _ in got}) == len(got) and got == expected[1]  # none twice, none lost

