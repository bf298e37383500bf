"""A checkpoint left by a stop during a query's first write (``executor/drivers/querystart.py``):
Spark refuses to start it, the runners clear it first, and the same command resumes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]


def _cut_first_write(chk: Path) -> Path:
    """The checkpoint as a SIGKILL in the middle of writing ``offsets/0`` leaves it."""
    (chk / "offsets").mkdir(parents=True)
    tmp = chk / "offsets" / f".0.{uuid.uuid4()}.tmp"
    tmp.write_bytes(b"")
    return tmp


def test_only_an_unstarted_checkpoint_is_cleared(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.querystart import clear_unstarted

    chk = tmp_path / "chk"
    tmp = _cut_first_write(chk)
    (chk / "commits").mkdir()
    assert clear_unstarted(str(chk)) == [str(tmp)]
    assert list((chk / "offsets").iterdir()) == []
    # once an entry exists, Spark reads the entries and skips the rest: nothing is touched
    tmp = _cut_first_write(tmp_path / "later")
    (tmp_path / "later" / "offsets" / "0").write_text("v1\n{}\n")
    assert clear_unstarted(str(tmp_path / "later")) == []
    assert tmp.exists()
    assert clear_unstarted(str(tmp_path / "none")) == []  # no checkpoint yet


@pytest.mark.timeout(600)
def test_a_query_resumes_from_a_first_write_cut_short(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spark itself refuses the cut checkpoint (the failure the runners now prevent), and starts
    once it is cleared."""
    from deltawheel.executor.drivers.querystart import clear_unstarted

    src = tmp_path / "in"
    src.mkdir()
    spark.range(5).write.parquet(str(src / "part"))
    chk = tmp_path / "chk"
    _cut_first_write(chk)
    seen: list[int] = []

    def start() -> None:
        q = (spark.readStream.schema("id LONG").parquet(str(src / "part")).writeStream
             .foreachBatch(lambda df, _bid: seen.append(df.count())).option("checkpointLocation", str(chk))
             .trigger(availableNow=True).start())
        q.awaitTermination(300)

    refused = None
    try:
        start()
    except Exception as exc:  # StreamingQueryException
        refused = str(exc)
    if refused is not None:
        assert "CHECKPOINT_LOCATION_NOT_EMPTY" in refused or "not empty" in refused.lower(), refused
    else:  # this Spark accepted the leftover: the clearing is then only tidiness
        pytest.skip("this Spark starts a checkpoint holding a cut first write")
    assert clear_unstarted(str(chk)) != []
    start()
    assert sum(seen) == 5
