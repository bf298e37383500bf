"""A stream table made from Python (a local store's first commit, ``streams._create_local``) is the
table Delta's ``CREATE TABLE`` makes: the same schema with its comments, properties and protocol;
Delta reads and appends to it, the SQL views select from it; a table that exists is left as it is;
a session whose Delta table defaults would change the table has it made through Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from delta_util import DETAIL_KEYS, assert_made_as_spark_makes, detail, first_commit

pytestmark = [pytest.mark.spark]


def _first_commit(layout: Any, stream: str) -> dict[str, Any]:
    return first_commit(layout.stream(stream))


def _detail(spark: Any, path: str) -> dict[str, Any]:
    return detail(spark, path, (*DETAIL_KEYS, "numFiles"))


@pytest.mark.timeout(600)
def test_a_stream_table_made_from_python_is_the_table_spark_makes(  # type: ignore[no-untyped-def]
        spark, tmp_path, monkeypatch, migrated_at) -> None:
    from deltawheel.statestore.inspection.sqlviews import register_views
    from deltawheel.statestore.writepath import streams
    from executor_util import events

    py, sp = migrated_at(tmp_path / "py"), migrated_at(tmp_path / "sp")  # migrated copies (the migrations: test_migrations.py)
    made: list[str] = []
    create = streams._create_local
    monkeypatch.setattr(streams, "_create_local", lambda s, folder, name: made.append(folder) or create(s, folder, name))
    assert streams.ensure_stream_table(spark, py, "clicks") == py.stream("clicks")
    assert made == [py.stream("clicks")]
    monkeypatch.setattr(streams, "_create_local", lambda s, folder, name: False)  # Spark's CREATE TABLE
    streams.ensure_stream_table(spark, sp, "clicks")

    mine, theirs = _first_commit(py, "clicks"), _first_commit(sp, "clicks")
    assert_made_as_spark_makes(mine, theirs)
    for key in ("operation", "isBlindAppend"):
        assert mine["commitInfo"][key] == theirs["commitInfo"][key], key
    params = [{**c["commitInfo"]["operationParameters"],
               "properties": json.loads(c["commitInfo"]["operationParameters"]["properties"])} for c in (mine, theirs)]
    assert params[0] == params[1]
    # the checksum file beside it is Delta's (what lets the first writer of a session skip rebuilding
    # the table's state with a Spark job): the same content but the table's id, times and txnId
    crcs = [json.loads(Path(lay.stream("clicks"), "_delta_log", f"{0:020d}.crc").read_text()) for lay in (py, sp)]
    assert crcs[0]["txnId"] == mine["commitInfo"]["txnId"]
    for crc, commit in zip(crcs, (mine, theirs), strict=True):
        assert crc["metadata"] == commit["metaData"] and crc["protocol"] == commit["protocol"]
        del crc["txnId"], crc["metadata"], crc["protocol"]
    assert crcs[0] == crcs[1]
    assert _detail(spark, py.stream("clicks")) == _detail(spark, sp.stream("clicks"))
    schema = spark.read.format("delta").load(py.stream("clicks")).schema
    assert schema == spark.read.format("delta").load(sp.stream("clicks")).schema  # with the comments
    assert [f.name for f in schema.fields if not f.nullable] == ["record_id", "key"]

    # Delta appends to it (the NOT NULL columns enforced) and the SQL views select from it
    events(spark, [("r1", "a", 1_000), ("r2", "b", 2_000)]).write.format("delta").mode("append").save(py.stream("clicks"))
    with pytest.raises(Exception, match="(?i)null"):
        spark.createDataFrame([(None, "k")], "record_id STRING, key STRING").write.format("delta") \
            .mode("append").save(py.stream("clicks"))
    assert "clicks" in register_views(spark, py)
    assert sorted(r["record_id"] for r in spark.sql("SELECT record_id FROM clicks").collect()) == ["r1", "r2"]
    assert sorted(json.loads(r["value_json"])["q"] for r in spark.sql("SELECT value_json FROM clicks_decoded").collect()) \
        == ["a", "b"]

    # a table that exists is left as it is (no second commit, the same table id)
    monkeypatch.setattr(streams, "_create_local", create)
    streams.ensure_stream_table(spark, py, "clicks")
    assert _first_commit(py, "clicks") == mine
    assert create(spark, sp.stream("clicks"), "clicks")  # put-if-absent: Spark's commit stays
    assert _first_commit(sp, "clicks") == theirs
    assert sorted(p.name for p in Path(sp.stream("clicks"), "_delta_log").iterdir() if p.suffix == ".json") == [
        f"{0:020d}.json"]


@pytest.mark.timeout(600)
def test_a_session_with_delta_table_defaults_has_the_table_made_by_spark(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A default of the session (here ``delta.appendOnly``) that Delta's CREATE TABLE would give the
    table is not left out: the table is made through Spark, and has it."""
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.writepath import streams

    layout = StoreLayout(str(tmp_path / "store"))
    key = "spark.databricks.delta.properties.defaults.appendOnly"
    spark.conf.set(key, "true")
    try:
        assert not streams._create_local(spark, layout.stream("clicks"), "clicks")
        streams.ensure_stream_table(spark, layout, "clicks")
    finally:
        spark.conf.unset(key)
    assert _first_commit(layout, "clicks")["metaData"]["configuration"]["delta.appendOnly"] == "true"
    assert _first_commit(layout, "clicks")["commitInfo"]["engineInfo"].startswith("Apache-Spark")


@pytest.mark.timeout(600)
def test_a_stream_table_that_cannot_be_made_raises_config_error(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.writepath.streams import ensure_stream_table

    layout = StoreLayout(str(tmp_path / "store"))
    Path(layout.streams_root).mkdir(parents=True)
    Path(layout.stream("clicks")).write_text("in the way")
    with pytest.raises(ConfigError, match=r"the table of stream 'clicks' cannot be made at .*clicks: .*clear that path"):
        ensure_stream_table(spark, layout, "clicks")
    assert Path(layout.stream("clicks")).read_text() == "in the way"
