"""A tiny spark-submit job: each executor task reports which Python runs it and where deltawheel
comes from (tests/test_deploy.py submits it with and without the packed environment)."""

from __future__ import annotations

import json


def probe(_: int) -> str:
    """Run on an executor: its Python, deltawheel's file, the host's address."""
    import os
    import sys

    import deltawheel  # fails on an executor whose Python has no deltawheel

    return json.dumps({"executable": sys.executable, "deltawheel": deltawheel.__file__,
                       "host": os.environ.get("SPARK_LOCAL_IP")})


def main() -> None:
    """Two tasks, one per worker; prints ``PROBE [...]``."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("deltawheel-deploy-probe").getOrCreate()
    rows = spark.sparkContext.parallelize(range(2), 2).map(probe).collect()
    print("PROBE " + json.dumps([json.loads(r) for r in rows]), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
