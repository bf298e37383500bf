"""``deltawheel upgrade-state`` (``executor/drivers/upgrade.py``): every key's state of an older
``state_version`` upgraded at once by the code's ``upgrade_state``, in one fenced commit under the
leases, audited; the plan; the refusals (nothing changed). Real Spark, ZooKeeper and Delta; the
computations are ``ttl_util``'s ``TotalsV1`` (a bare count) and ``TotalsV2`` (``{"n", "last"}``)."""

from __future__ import annotations

from typing import Any

import pytest
from deltawheel.executor.exceptions import StateUpgradeError
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import ConfigError, NotAStoreError, ReplayCodeError
from deltawheel.statestore.rowtable.rows import FENCE_KEY
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from ttl_util import TotalsV1, TotalsV2, TotalsV2Broken

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]

J = get_codec("json")


def clicks(spark: Any, items: list[tuple[str, str, int]]) -> Any:
    """A stream-schema DataFrame of (record_id, user, event ms)."""
    rows = [{"record_id": rid, "key": "", "value": J.encode({"user": u}), "codec": "json", "timestamp_ms": ts,
             "event_time": None, "producer": "test", "commit_id": f"pos-{rid}", "format_version": 1}
            for rid, u, ts in items]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))


def rows_of(spark: Any, layout: Any) -> dict[str, tuple[Any, str]]:
    """key -> (decoded state, codec column) of the totals rows holding a state."""
    df = spark.read.format("delta").load(layout.rows_of("totals"))
    got = df.where(f"computation = 'totals' AND key != '{FENCE_KEY}' AND state IS NOT NULL").collect()
    return {r["key"]: (J.decode(bytes(r["state"])), r["codec"]) for r in got}


def _audit(spark: Any, layout: Any) -> list[tuple[str, str, int]]:
    from deltawheel.statestore.surgery.audit import read_audit

    return [(a["tool"], a["computation"], a["rows_upserted"]) for a in read_audit(spark, layout)]


@pytest.mark.slow  # a batch and nine commands, each its own Spark jobs: minutes on a loaded machine
@pytest.mark.timeout(1500)
def test_upgrade_state_as_a_user_runs_it_plan_refusals_then_every_key(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, capsys) -> None:
    from deltawheel.executor.drivers.upgrade import plan_upgrade, upgrade_all
    from deltawheel.statestore.zk.client import connect
    from executor_util import start_executor, stop_executor

    ex, client = start_executor(spark, migrated_store, zk_config, TotalsV1())
    ex.run_batch(clicks(spark, [("r1", "ann", 1_000), ("r2", "ann", 2_000), ("r3", "bob", 3_000),
                                ("r4", "bob", 3_500), ("r5", "cy", 4_000), ("r6", "bob", 4_500)]), 0,
                 input_watermark_ms=None)
    stop_executor(ex, client)
    v1 = rows_of(spark, migrated_store)
    assert v1 == {"ann": (2, "json"), "bob": (3, "json"), "cy": (1, "json")}
    base = ["upgrade-state", "--store", migrated_store.root, "--pipeline", "test", "--computation", "totals",
            "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]

    # the plan: counts per version and a sample, nothing changed
    assert main([*base, "--code", "ttl_util:TotalsV2", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "per state_version: version 1: 3" in out, out
    assert "would upgrade 3 rows to state_version 2" in out, out
    assert """'bob': version 1 3 -> {"last": null, "n": 3}""" in out, out
    assert rows_of(spark, migrated_store) == v1

    # refusals, each typed, nothing changed and no audit record
    assert main([*base, "--code", "no_such_module:TotalsV2"]) == 3
    assert "does not import" in capsys.readouterr().err
    assert main([*base, "--code", "ttl_util:Visits"]) == 3
    assert "is computation 'visits', not 'totals'" in capsys.readouterr().err
    assert main([*base[:-4], "--code", "ttl_util:TotalsV2", "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot,
                 "--pipeline", "nosuch"]) == 3
    assert "pipeline 'nosuch' has no computation 'totals'" in capsys.readouterr().err
    assert main(["upgrade-state", "--store", migrated_store.root + "-gone", "--pipeline", "test", "--computation",
                 "totals", "--code", "ttl_util:TotalsV2"]) != 0
    assert "does not exist" in capsys.readouterr().err
    # an upgrade_state that raises for one key (TotalsV2Broken raises on a count of 2: ann's): the whole
    # upgrade is refused
    assert main([*base, "--code", "ttl_util:TotalsV2Broken"]) == 3
    err = capsys.readouterr().err
    assert "StateUpgradeError" in err and "failed for 1 keys: 'ann' (ValueError: cannot upgrade a count of 2)" in err
    assert rows_of(spark, migrated_store) == v1 and _audit(spark, migrated_store) == []

    client = connect(zk_config)
    try:
        from deltawheel.executor.drivers.replay import load_code

        with pytest.raises(ReplayCodeError, match=r"does not import"):
            load_code("no_such_module:TotalsV2", "totals")
        with pytest.raises(ConfigError, match=r"pipeline 'nosuch' has no computation 'totals'"):
            plan_upgrade(spark, migrated_store, client, pipeline="nosuch", code=TotalsV2())
        with pytest.raises(StateUpgradeError, match=r"failed for 1 keys: 'ann' .*the whole upgrade is refused"):
            upgrade_all(spark, migrated_store, client, pipeline="test", code=TotalsV2Broken(), wait_s=30)
        assert rows_of(spark, migrated_store) == v1

        # every key upgraded in one commit, audited
        assert main([*base, "--code", "ttl_util:TotalsV2", "--wait", "60"]) == 0
        out = capsys.readouterr().out
        assert "upgraded 3 rows of totals to state_version 2 at rows version" in out, out
        got = rows_of(spark, migrated_store)
        assert got == {k: (TotalsV2().upgrade_state(state, 1), "json@2") for k, (state, _) in v1.items()}
        assert _audit(spark, migrated_store) == [("upgrade-state", "totals", 3)]
        # nothing older left: a second run writes nothing
        assert main([*base, "--code", "ttl_util:TotalsV2"]) == 0
        assert "nothing was written" in capsys.readouterr().out
        # the version 1 code is older than the rows now: refused, nothing changed
        with pytest.raises(StateUpgradeError, match=r"state_version 2 \(json@2\), newer than the code's 1"):
            upgrade_all(spark, migrated_store, client, pipeline="test", code=TotalsV1())
        with pytest.raises(NotAStoreError, match=r"does not exist"):
            main_raising(["upgrade-state", "--store", migrated_store.root + "-gone", "--pipeline", "test",
                          "--computation", "totals", "--code", "ttl_util:TotalsV2"])
    finally:
        client.stop()
        client.close()
    assert rows_of(spark, migrated_store) == got
    # the version 2 code counts on from the upgraded state
    ex, client = start_executor(spark, migrated_store, zk_config, TotalsV2())
    ex.run_batch(clicks(spark, [("r7", "bob", 9_000)]), 1, input_watermark_ms=None)
    stop_executor(ex, client)
    assert rows_of(spark, migrated_store)["bob"] == ({"n": 4, "last": 9_000}, "json@2")
    assert rows_of(spark, migrated_store)["cy"] == ({"n": 1, "last": None}, "json@2")


def test_upgrade_state_refuses_bad_code_and_a_missing_store_before_spark(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    base = ["upgrade-state", "--store", str(tmp_path / "gone"), "--pipeline", "p", "--computation", "totals"]
    with pytest.raises(ReplayCodeError, match=r"--code 'no_such_module:TotalsV2' does not import"):
        main_raising([*base, "--code", "no_such_module:TotalsV2"])
    with pytest.raises(ReplayCodeError, match=r"is computation 'visits', not 'totals'"):
        main_raising([*base, "--code", "ttl_util:Visits"])
    with pytest.raises(ReplayCodeError, match=r"give --code MODULE:CLASS: the computation 'totals' of pipeline 'p'"):
        main_raising(base)
    with pytest.raises(NotAStoreError, match=r"gone does not exist: pass the folder of the pipeline's store"):
        main_raising([*base, "--code", "ttl_util:TotalsV2"])
    assert not (tmp_path / "gone").exists()
    with pytest.raises(SystemExit):
        main(["upgrade-state", "--help"])
    assert "--plan" in capsys.readouterr().out


def test_an_upgrade_that_raises_or_a_newer_row_refuses_the_whole_upgrade() -> None:
    """The rows' upgrade, without Spark (``drivers/upgrade.py``'s ``_upgraded``, what runs under the leases)."""
    from deltawheel.executor.drivers.upgrade import _upgraded
    from deltawheel.statestore.rowtable.rows import KeyRow

    rows = [KeyRow(computation="totals", key=k, interval=0, state=J.encode(n), codec="json") for k, n in (("ann", 2), ("bob", 3))]
    out, changed = _upgraded(TotalsV2(), rows)
    assert [(r.key, J.decode(r.state or b""), r.codec) for r in out] == [
        ("ann", {"n": 2, "last": None}, "json@2"), ("bob", {"n": 3, "last": None}, "json@2")]
    assert [(k, v, old) for k, v, old, _ in changed] == [("ann", 1, 2), ("bob", 1, 3)]
    assert _upgraded(TotalsV2(), out) == (out, [])  # already upgraded: as they are
    with pytest.raises(StateUpgradeError, match=r"failed for 1 keys: 'ann' \(ValueError: cannot upgrade a count of 2\)"):
        _upgraded(TotalsV2Broken(), rows)
    with pytest.raises(StateUpgradeError, match=r"key 'ann' of totals holds state of state_version 2 \(json@2\)"):
        _upgraded(TotalsV1(), out)


def main_raising(argv: list[str]) -> None:
    """The command's function on parsed ``argv``, raising its error (``main`` prints it)."""
    from deltawheel.cli import build_parser

    args = build_parser().parse_args(argv)
    args.func(args)
