"""A Spark Connect session is refused wherever a session enters deltawheel, at once, with a typed
error saying why (no driver JVM: the commits go through Delta's JVM API) and what to use instead.

The session is a real one: Spark's own Connect service (the ``spark-connect`` jar the pyspark wheel
ships) started in the test session's JVM on a free port, and a ``pyspark.sql.connect`` client
session on it that runs a query before the refusals are checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.protocol.executor import ComputationExecutor
from deltawheel.executor.testkit import ComputationTester
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.jvm import jcontext, jvm
from deltawheel.statestore.exceptions import SessionConfigError, SparkConnectSessionError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.session.sparkenv import check_session

import deltawheel
from deltawheel import migrations

pytestmark = pytest.mark.spark


class Noop(Computation):
    name = "noop"
    inputs = {"events": RECORD_KEY}

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        pass


@pytest.fixture(scope="module")
def connect_session(spark: Any) -> Iterator[Any]:
    """A Spark Connect client session on a Connect server running in the test JVM."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    j = jvm(spark)
    j.org.apache.spark.SparkEnv.get().conf().set("spark.connect.grpc.binding.port", "0")  # a free port
    service = getattr(getattr(j.org.apache.spark.sql.connect.service, "SparkConnectService$"), "MODULE$")
    service.start(jcontext(spark).sc())
    session = ConnectSession.builder.remote(f"sc://localhost:{service.localPort()}").getOrCreate()
    try:
        assert session.range(3).count() == 3  # a live Connect session, served by the Connect server
        yield session
    finally:
        session.stop()
        none = j.scala.Option.empty()
        service.stop(none, none)


ENTRIES: dict[str, Callable[[Any, Path], Any]] = {
    "deltawheel.connect": lambda s, tmp: deltawheel.connect(s, store=str(tmp / "store")),
    "check_session": lambda s, tmp: check_session(s, str(tmp / "store")),
    # refused before the owner is looked at
    "ComputationExecutor": lambda s, tmp: ComputationExecutor(s, StoreLayout(str(tmp / "store")), Noop(),
                                                              owner=None),  # type: ignore[arg-type]
    "PipelineRunner": lambda s, tmp: PipelineRunner(s, StoreLayout(str(tmp / "store")), Pipeline("p", (), (Noop(),)),
                                                    zk=ZkConfig(hosts="127.0.0.1:1")),
    "RowStore": lambda s, tmp: RowStore(s, StoreLayout(str(tmp / "store")), writer="w"),
    "ComputationTester": lambda s, tmp: ComputationTester(Noop(), spark=s, store=str(tmp / "store")),
    "migrations.plan": lambda s, tmp: migrations.plan(s, StoreLayout(str(tmp / "store"))),
    "migrations.apply": lambda s, tmp: migrations.apply(s, StoreLayout(str(tmp / "store")), dry_run=False),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_spark_connect_session_is_refused_at_once(connect_session: Any, tmp_path: Path, entry: str) -> None:
    with pytest.raises(SparkConnectSessionError,
                       match=r"a Spark Connect session .*no driver JVM.*Delta Lake's JVM API.*"
                             r"deltawheel\.spark_session\(\).*spark-submit") as err:
        ENTRIES[entry](connect_session, tmp_path)
    assert isinstance(err.value, SessionConfigError) and err.value.exit_code == 3
    assert not (tmp_path / "store").exists()  # refused before anything was made


def test_spark_session_with_spark_remote_set_is_refused_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """``deltawheel.spark_session()`` in a shell where ``SPARK_REMOTE`` is set (Databricks Connect, a
    notebook's Connect kernel) would silently build a Connect session: it is refused up front."""
    monkeypatch.setenv("SPARK_REMOTE", "sc://localhost:15002")
    with pytest.raises(SparkConnectSessionError, match=r"SPARK_REMOTE is set \(sc://localhost:15002\).*Unset"):
        deltawheel.spark_session()
