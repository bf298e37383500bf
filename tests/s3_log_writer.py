"""A second Spark application for the object-store log store tests (its own JVM and session).

Usage: python s3_log_writer.py MODE ARGS...   (S3 endpoint and ZooKeeper from the environment:
DELTAWHEEL_S3_ENDPOINT/_ACCESS_KEY/_SECRET_KEY, DELTAWHEEL_ZK, DELTAWHEEL_ZK_CHROOT)

Every mode prints READY once its session is up and starts when a line comes on stdin (for
raw: the start time, as epoch seconds).

  raw LOG_DIR SLOT_S ROUNDS WRITER
      round r starts at START + r * SLOT_S and writes LOG_DIR/<r>.json through the log
      store (put-if-absent); prints one JSON line {"won": [...], "lost": [...]} at the end.
  steps LOG_DIR WRITER
      a round per line on stdin (the round's number r, after the start line): writes
      LOG_DIR/<r>.json through the log store and, once that write returned, prints one JSON
      line {"round": r, "outcome": "won" or the exception's class}; ends when stdin closes.
  appends TABLE WRITER COUNT
      COUNT blind appends of one row (writer, i) to the Delta table, each tagged with
      userMetadata WRITER-i; prints the tags that returned success as one JSON line.
  crash TABLE WRITER [INLINE_MAX]
      one append that dies (JVM halt) right after its log entry was created in ZooKeeper,
      before N.json was written (INLINE_MAX: the log store's inline limit in bytes; 0 puts
      the commit's bytes in a temporary file).
  serve
      one session for several modes in turn: each line on stdin is a JSON list [MODE, ARGS...],
      answered by READY (once the session is up), then the mode runs as above (its start line,
      then its output); ends when stdin closes (tests share its start-up this way).
"""

from __future__ import annotations

import json
import sys
import time

from deltawheel.executor.session import build_spark
from deltawheel.statestore.delta.jvm import jcontext, jvm
from deltawheel.statestore.objectstore.logstore import ZK_LOG_STORE_CLASS
from deltawheel.statestore.session.sparkenv import SparkSettings


def _write_round(spark, log_dir: str, writer: str):  # type: ignore[no-untyped-def]
    """A function writing round ``r``'s log entry through the ZooKeeper log store: "won", or the
    name of the Java exception that refused it."""
    from py4j.protocol import Py4JJavaError

    j = jvm(spark)
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    cls = j
    for part in ZK_LOG_STORE_CLASS.split("."):
        cls = getattr(cls, part)
    store = cls(conf)

    def write(r: int) -> str:
        path = j.org.apache.hadoop.fs.Path(f"{log_dir}/{r:020d}.json")
        try:
            store.write(path, j.java.util.ArrayList([json.dumps({"writer": writer, "round": r})]).iterator(),
                        False, conf)
            return "won"
        except Py4JJavaError as exc:
            return str(exc.java_exception.getClass().getName())

    return write


def raw(spark, log_dir: str, start: float, slot: float, rounds: int, writer: str) -> None:  # type: ignore[no-untyped-def]
    write = _write_round(spark, log_dir, writer)
    won, lost = [], []
    for r in range(rounds):
        time.sleep(max(0.0, start + r * slot - time.time()))
        outcome = write(r)
        if outcome == "won":
            won.append(r)
        else:
            lost.append([r, outcome])
    print(json.dumps({"won": won, "lost": lost}), flush=True)


def steps(spark, log_dir: str, writer: str) -> None:  # type: ignore[no-untyped-def]
    write = _write_round(spark, log_dir, writer)
    for line in sys.stdin:
        r = int(line)
        print(json.dumps({"round": r, "outcome": write(r)}), flush=True)


def appends(spark, table: str, writer: str, count: int) -> None:  # type: ignore[no-untyped-def]
    done = []
    for i in range(count):
        tag = f"{writer}-{i}"
        df = spark.sql(f"SELECT '{writer}' AS writer, {i} AS i")
        df.write.format("delta").mode("append").option("userMetadata", tag).save(table)
        done.append(tag)
    print(json.dumps(done), flush=True)


def crash(spark, table: str, writer: str, inline_max: str | None = None) -> None:  # type: ignore[no-untyped-def]
    settings = {"deltawheel.logstore.test.crashAfterPrepare": "true"}
    if inline_max is not None:
        settings["deltawheel.logstore.inlineMaxBytes"] = inline_max
    for k, v in settings.items():
        spark.conf.set(k, v)
        jcontext(spark).hadoopConfiguration().set(k, v)
    spark.sql(f"SELECT '{writer}' AS writer, 0 AS i").write.format("delta").mode("append") \
        .option("userMetadata", f"{writer}-crash").save(table)
    print("NOT REACHED", flush=True)


def run(spark, mode: str, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    """READY, then ``mode`` once its start line came."""
    print("READY", flush=True)
    go = sys.stdin.readline().strip()
    if mode == "raw":
        raw(spark, args[0], float(go), float(args[1]), int(args[2]), args[3])
    elif mode == "steps":
        steps(spark, args[0], args[1])
    elif mode == "appends":
        appends(spark, args[0], args[1], int(args[2]))
    elif mode == "crash":
        crash(spark, args[0], args[1], *args[2:3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    spark = build_spark(SparkSettings(app_name=f"s3-log-writer-{mode}", object_store=True))
    if mode == "serve":
        for line in sys.stdin:
            command = json.loads(line)
            run(spark, command[0], [str(a) for a in command[1:]])
    else:
        run(spark, mode, args)
    spark.stop()


if __name__ == "__main__":
    main()
