"""Errors a pipeline run cannot get past by retrying come out typed, with the exit code of their kind.

* A Parquet file whose column has another type than the injector reads (a producer changed its
  schema) stops the run with ``InputSchemaError`` (a ``ConfigError``: exit 3) naming the file, the
  column and both types; the batch is not committed, and once the file is written again with the
  right type the same run goes on. Why an error and not dead letters: docs/sources.md, "Parquet files
  and Delta tables".
* User code that raises inside ``run_pipeline``, bounded or continuous, stops it with
  ``UserCodeError`` (exit 7) naming the key, the record and the cause, not ``BatchFailedError``
  (exit 9, "retry": the same code fails again on the same record).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.exceptions import InputSchemaError
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import exit_code
from deltawheel.statestore.layout import StoreLayout
from pyspark import cloudpickle

import deltawheel
from deltawheel import RECORD_KEY, Computation, ConfigError, ParquetInjector, Pipeline, UserCodeError

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Clicks(Computation):
    """Counts records per user; refuses user ``bad`` (for the user-code test)."""

    name = "clicks_per_user"
    inputs = {"clicks": RECORD_KEY}

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if ctx.key == "bad":
            raise ValueError(f"no clicks from {ctx.key} ({record.value['page']})")
        ctx.state = (ctx.state or 0) + 1


def _write(folder: Path, name: str, rows: list[dict[str, Any]], *, ts_type: Any = None, mtime: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("user", pa.string()), ("page", pa.string()), ("ts", ts_type or pa.int64())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / f".{name}")
    os.replace(folder / f".{name}", folder / name)
    os.utime(folder / name, (mtime, mtime))  # read in this order


def _pipeline(folder: Path) -> Pipeline:
    clicks = ParquetInjector("clicks", str(folder), key_column="user", event_time_column="ts",
                             watermark_delay_ms=10_000, max_files_per_trigger=1)
    return Pipeline("inputs", (clicks,), (Clicks(),))


def _counts(spark: Any, store: str) -> dict[str, int]:
    from pyspark.sql import functions as F

    codec = get_codec("json")
    rows = spark.read.format("delta").load(StoreLayout(store).rows_of("clicks_per_user")).where(
        (F.col("computation") == "clicks_per_user") & ~F.col("key").startswith("\x00")).collect()
    return {r["key"]: codec.decode(r["state"]) for r in rows}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_a_parquet_file_with_a_column_of_another_type_is_a_typed_error_naming_file_and_column(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path, write_path) -> None:
    import pyarrow as pa

    folder, store = tmp_path / "clicks", migrated_store.root
    _write(folder, "part-0.parquet", [{"user": "ann", "page": "a", "ts": 1_000}], mtime=1_000_000)
    # the producer changed ts to a string
    _write(folder, "part-1.parquet", [{"user": "bob", "page": "b", "ts": "2000"}], ts_type=pa.string(),
           mtime=1_000_001)
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="inputs") as engine:
        with pytest.raises(InputSchemaError, match=r"^clicks_per_user batch 1: input file \S*/part-1\.parquet has "
                                                   r"column ts as Parquet BINARY, where the injector reads BIGINT .*"
                                                   r"Write the file again with ts as BIGINT under the same name, "
                                                   r"then run the same command again") as err:
            engine.run_pipeline(_pipeline(folder), progress=False, write_path=write_path)
    assert isinstance(err.value, ConfigError) and exit_code(err.value) == 3  # a configuration problem, not "retry"
    assert _counts(spark, store) == {"ann": 1}  # file 0 committed, nothing of file 1
    # the file written again with the injector's type: the same run goes on from that batch
    _write(folder, "part-1.parquet", [{"user": "bob", "page": "b", "ts": 2_000}], mtime=1_000_001)
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="inputs") as engine:
        engine.run_pipeline(_pipeline(folder), progress=False, write_path=write_path)
    assert _counts(spark, store) == {"ann": 1, "bob": 1}


USER_CODE = (r"^clicks_per_user: user code failed for key 'bad' on record 'clicks/part-0\.parquet#1' \(event time "
             r"2000\): ValueError: no clicks from bad \(b\)\. The batch was not committed; fix the code")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("write_path", "continuous"), [("image", False), ("merge", False), ("image", True)])
def test_user_code_that_raises_in_run_pipeline_is_a_user_code_error_with_its_exit_code(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path, write_path, continuous) -> None:
    folder = tmp_path / "clicks"
    _write(folder, "part-0.parquet", [{"user": "ann", "page": "a", "ts": 1_000}, {"user": "bad", "page": "b", "ts": 2_000}],
           mtime=1_000_000)
    with deltawheel.connect(spark, store=migrated_store.root, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="inputs") as engine:
        with pytest.raises(UserCodeError, match=USER_CODE) as err:  # continuous: until the failure, then stopped
            engine.run_pipeline(_pipeline(folder), progress=False, write_path=write_path, continuous=continuous)
    assert exit_code(err.value) == 7
    assert (err.value.computation, err.value.key) == ("clicks_per_user", "bad")
    assert _counts(spark, migrated_store.root) == {}  # nothing committed
