"""The training session of the driver JVM's class-data archive (``cds.py``), run as
``python -m deltawheel.statestore.session.cds_train <archive>`` by :func:`.cds.ensure_archive`."""

from __future__ import annotations

import os
import sys
import tempfile

from .cds import RECORD
from .sparkenv import SparkSettings, build_spark

__all__ = ["train"]


def train(out: str) -> None:
    """The training session: a Delta table written, read and committed to, and a streaming query's
    batch through foreachBatch, so that the archive holds what a deltawheel job's start loads."""
    spark = build_spark(SparkSettings(master="local[2]", extra={"spark.driver.extraJavaOptions": f"{RECORD}{out}"}))
    with tempfile.TemporaryDirectory(prefix="deltawheel-cds-") as d:
        table, src = os.path.join(d, "t"), os.path.join(d, "in")
        os.makedirs(src)
        spark.range(10).selectExpr("id", "cast(id as string) AS s").write.format("delta").save(table)
        spark.range(10, 20).selectExpr("id", "cast(id as string) AS s").write.format("delta").mode("append").save(table)
        spark.read.format("delta").load(table).filter("id > 3").count()
        with open(os.path.join(src, "a.json"), "w") as f:
            f.write('{"id": 1, "s": "a"}\n')

        def batch(df, _batch_id):  # type: ignore[no-untyped-def]
            df.write.format("delta").mode("append").save(table)

        q = (spark.readStream.schema("id long, s string").json(src).writeStream.foreachBatch(batch)
             .option("checkpointLocation", os.path.join(d, "chk")).trigger(availableNow=True).start())
        q.awaitTermination(120)
    proc = spark.sparkContext._gateway.proc  # noqa: SLF001  (pyspark keeps the JVM process only there)
    spark.stop()
    proc.stdin.close()  # pyspark's gateway exits when its stdin closes
    proc.wait(240)


if __name__ == "__main__":
    train(sys.argv[1])
