"""The latency benchmark's Kafka input: the schedule's records appended to a topic.

Each "file" of the schedule is a burst of JSON messages appended when due to a topic with
``LogAppendTime``: the broker's append time is the record's arrival. The producer is a small Java program."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .latency_input import Schedule, ScheduleThread, key_name

__all__ = ["KAFKA_VALUE_DDL", "KafkaInput", "KafkaGenerator", "PRODUCER_JAVA", "read_arrivals", "record_batches"]

KAFKA_VALUE_DDL = "record_id STRING, key STRING, event_time BIGINT"
PARTITIONS = 2
TOPIC_CONFIGS = {"message.timestamp.type": "LogAppendTime"}

PRODUCER_JAVA = """\
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/** Appends "key<TAB>value" lines of stdin to a topic; an empty line flushes. */
public class LatencyProducer {
  public static void main(String[] args) throws Exception {
    Properties p = new Properties();
    p.put("bootstrap.servers", args[0]);
    p.put("linger.ms", "0");
    p.put("acks", "1");
    p.put("key.serializer", StringSerializer.class.getName());
    p.put("value.serializer", StringSerializer.class.getName());
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(p);
         BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      producer.partitionsFor(args[1]);
      System.out.println("ready");
      System.out.flush();
      String line;
      while ((line = in.readLine()) != null) {
        if (line.isEmpty()) { producer.flush(); continue; }
        int tab = line.indexOf('\\t');
        producer.send(new ProducerRecord<>(args[1], line.substring(0, tab), line.substring(tab + 1)));
      }
      producer.flush();
    }
  }
}
"""


@dataclass(frozen=True)
class KafkaInput:
    """The topic an engine reads (its own copy of the schedule)."""

    bootstrap_servers: str
    topic: str
    schema_ddl: str = KAFKA_VALUE_DDL

    def stream(self, spark: Any) -> Any:
        """The topic as a stream of the files' columns (Spark's Kafka source from the earliest offset)."""
        from pyspark.sql import functions as F

        raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", self.bootstrap_servers)
               .option("subscribe", self.topic).option("startingOffsets", "earliest").load())
        j = F.from_json(F.col("value").cast("string"), self.schema_ddl).alias("j")
        return raw.select(j).select(F.col("j.record_id").alias("record_id"), F.col("j.key").alias("key"),
                                    F.timestamp_millis(F.col("j.event_time")).alias("event_time"))


def create(spark: Any, bootstrap_servers: str, topic: str) -> KafkaInput:
    """Create ``topic`` (:data:`PARTITIONS` partitions, the broker's append time as timestamps)."""
    from deltawheel.servers.kafka import create_topic

    create_topic(spark, bootstrap_servers, topic, partitions=PARTITIONS, configs=TOPIC_CONFIGS)
    return KafkaInput(bootstrap_servers, topic)


def _producer_command(work: Path, bootstrap_servers: str, topic: str) -> list[str]:
    from deltawheel.statestore.process import find_java
    from deltawheel.statestore.session.connectors import ensure_kafka_jars

    from deltawheel.servers.zookeeper import pyspark_jars_dir

    src = work / "LatencyProducer.java"
    src.write_text(PRODUCER_JAVA)
    cp = os.pathsep.join([*(str(j) for j in ensure_kafka_jars(quiet=True)), f"{pyspark_jars_dir()}/*"])
    return [find_java(), "-Xmx128m", "-XX:+UseSerialGC", "-cp", cp, str(src), bootstrap_servers, topic]


def _lines(schedule: Schedule, index: int, event_time_ms: int) -> str:
    lo = int(schedule.first_ids[index])
    hi = lo + int(schedule.counts[index])
    keys = [key_name(int(k)) for k in schedule.key_ids[lo:hi].tolist()]
    return "".join(f'{key}\t{{"record_id": "{rid}", "key": "{key}", "event_time": {event_time_ms}}}\n'
                   for rid, key in zip(range(lo, hi), keys, strict=True)) + "\n"  # the empty line: flush


class KafkaGenerator(ScheduleThread):
    """The schedule appended to a topic, with the interface of :class:`~.latency_input.Generator`;
    ``renamed`` in its log: when each burst was handed to the producer."""

    def __init__(self, schedule: Schedule, *, source: KafkaInput, work: Path, log: Path) -> None:
        super().__init__(schedule, log)
        self.source, self.work = source, work
        work.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[str] | None = None
        self._err: Any = None

    def prime(self) -> float:
        """Start the producer, wait until it has the topic's metadata, send file 0 now; its send time."""
        cmd = _producer_command(self.work, self.source.bootstrap_servers, self.source.topic)
        self._err = (self.work / "producer.log").open("w")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the Kafka producer did not start (exit {self._proc.poll()}; "
                               f"{self.work / 'producer.log'})")
        return self._send(0, time.time())

    def _send(self, index: int, due: float) -> float:
        assert self._proc is not None and self._proc.stdin is not None
        text = _lines(self.schedule, index, int(round(due * 1000)))
        t = time.time()
        self._proc.stdin.write(text)
        self._proc.stdin.flush()
        with self.log.open("a") as f:
            f.write(json.dumps({"file": index, "due": due, "renamed": t}) + "\n")
        return t

    def _run(self, t0: float) -> None:
        for k in range(1, self.schedule.n_files):
            due = t0 + float(self.schedule.offsets_s[k])
            left = due - time.time()
            if left > 0 and self._stop.wait(left):
                return
            self._send(k, due)

    def start(self, *, lead_s: float = 0.3) -> float:
        """Start the schedule at ``now + lead_s``; returns ``t0``."""
        return self._start_thread(self._run, lead_s)

    def stop(self) -> None:
        """End the schedule now; the producer flushes what it was given and exits."""
        super().stop()
        if self._proc is not None:
            if self._proc.stdin is not None and not self._proc.stdin.closed:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
        if self._err is not None:
            self._err.close()


def read_arrivals(spark: Any, source: KafkaInput, schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per record id: its message's append time (s), partition and offset (NaN, -1: not in the topic)."""
    from pyspark.sql import functions as F

    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", source.bootstrap_servers)
          .option("subscribe", source.topic).option("startingOffsets", "earliest").load()
          .select(F.get_json_object(F.col("value").cast("string"), "$.record_id").cast("long").alias("rid"),
                  (F.unix_micros(F.col("timestamp")) / 1e6).alias("t"), "partition", "offset"))
    t = df.toArrow()
    arrival = np.full(schedule.total, np.nan)
    part = np.full(schedule.total, -1, np.int64)
    off = np.full(schedule.total, -1, np.int64)
    rid = np.asarray(t.column("rid").to_numpy(zero_copy_only=False)).astype(np.int64)
    ok = (rid >= 0) & (rid < schedule.total)
    arrival[rid[ok]] = np.asarray(t.column("t").to_numpy(zero_copy_only=False))[ok]
    part[rid[ok]] = np.asarray(t.column("partition").to_numpy(zero_copy_only=False))[ok]
    off[rid[ok]] = np.asarray(t.column("offset").to_numpy(zero_copy_only=False))[ok]
    return arrival, part, off


def record_batches(checkpoint: Path, topic: str, partition: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Per record, the micro-batch of a Kafka query that read it (-1: none), from the query's offset log."""
    d = Path(checkpoint) / "offsets"
    ends: list[tuple[int, dict[int, int]]] = []
    if d.is_dir():
        for n in sorted(int(x) for x in os.listdir(d) if x.isdigit()):
            lines = (d / str(n)).read_text().splitlines()
            src = json.loads(lines[2]) if len(lines) > 2 and lines[2].strip().startswith("{") else {}
            ends.append((n, {int(p): int(o) for p, o in src.get(topic, {}).items()}))
    batch = np.full(partition.size, -1, np.int64)
    for p in np.unique(partition[partition >= 0]).tolist():
        ids = np.array([n for n, e in ends if p in e], np.int64)
        e = np.array([ends_p[p] for _n, ends_p in ends if p in ends_p], np.int64)
        sel = partition == p
        i = np.searchsorted(e, offset[sel], side="right")  # the first batch whose end is past the offset
        b = np.full(i.size, -1, np.int64)
        b[i < e.size] = ids[i[i < e.size]]
        batch[sel] = b
    return batch
