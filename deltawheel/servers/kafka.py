"""A local single-node Kafka broker in KRaft mode for development and tests; the jars pyspark does not
ship (:data:`KAFKA_BROKER_JARS`) are fetched once from Maven Central (docs/sources.md)."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any, Mapping

from deltawheel.servers.zookeeper import pyspark_jars_dir
from deltawheel.statestore.exceptions import KafkaServerError
from deltawheel.statestore.jars import fetch_maven_jar
from deltawheel.statestore.process import find_java, free_ports
from deltawheel.statestore.session.connectors import KAFKA_CLIENTS_VERSION, default_kafka_jars_dir

from .service import Server

__all__ = ["KAFKA_VERSION", "KAFKA_BROKER_JARS", "KafkaBroker", "cluster_id_of", "create_topic"]

#: The broker's version: the kafka-clients version Spark 4.2's Kafka connector declares.
KAFKA_VERSION = KAFKA_CLIENTS_VERSION
_K = "org.apache.kafka"
# kafka_2.13's runtime dependencies minus what pyspark's jars folder ships; the two Jackson
# modules at pyspark's Jackson version, so that one Jackson is on the classpath.
KAFKA_BROKER_JARS: tuple[tuple[str, str, str], ...] = (
    *((_K, f"kafka{a}", KAFKA_VERSION) for a in (
        "_2.13", "-clients", "-server-common", "-server", "-group-coordinator-api", "-group-coordinator",
        "-transaction-coordinator", "-metadata", "-storage-api", "-storage", "-tools-api", "-raft")),
    ("org.pcollections", "pcollections", "4.0.1"),
    ("com.github.ben-manes.caffeine", "caffeine", "2.9.3"),
    ("net.sourceforge.argparse4j", "argparse4j", "0.7.0"),
    ("net.sf.jopt-simple", "jopt-simple", "5.0.4"),
    ("org.bitbucket.b_c", "jose4j", "0.9.6"),
    ("com.yammer.metrics", "metrics-core", "2.2.0"),
    ("org.scala-lang.modules", "scala-collection-compat_2.13", "2.10.0"),
    ("org.scala-lang.modules", "scala-java8-compat_2.13", "1.0.2"),
    ("com.typesafe.scala-logging", "scala-logging_2.13", "3.9.5"),
    ("commons-validator", "commons-validator", "1.10.1"),
    ("com.fasterxml.jackson.dataformat", "jackson-dataformat-csv", "2.21.2"),
    ("com.fasterxml.jackson.datatype", "jackson-datatype-jdk8", "2.21.2"),
)
_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
_LOG4J = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.logger.kafka.server.BrokerServer=INFO
"""


class KafkaBroker(Server):
    """A Kafka broker + controller (KRaft) in its own detached process; ``port`` and ``controller_port``
    default to free ones, ``num_partitions`` is for topics created on first use.

    >>> KafkaBroker("kafka-data", port=9092, controller_port=9093).bootstrap_servers
    '127.0.0.1:9092'
    """

    stop_timeout_s = 20.0
    start_timeout_s = 90.0
    port_hint = "stop it or give KafkaBroker other ports"

    def __init__(self, data_dir: Path | str, *, port: int | None = None, controller_port: int | None = None,
                 host: str = "127.0.0.1", num_partitions: int = 1, jars_dir: Path | None = None) -> None:
        free = free_ports(2, host) if port is None or controller_port is None else [0, 0]
        super().__init__(data_dir, name="Kafka broker", stem="kafka", marker=_MAIN_CLASS, error=KafkaServerError,
                         port=port if port is not None else free[0], host=host)
        self.controller_port = controller_port if controller_port is not None else free[1]
        self.num_partitions = num_partitions
        self._jars_dir = jars_dir
        self.config_file = self.data_dir / "server.properties"

    @property
    def bootstrap_servers(self) -> str:
        """The clients' ``bootstrap.servers`` (``kafka.bootstrap.servers`` for Spark)."""
        return f"{self.host}:{self.port}"

    def _classpath(self) -> str:
        folder = self._jars_dir or default_kafka_jars_dir() / f"broker-{KAFKA_VERSION}"  # fetched once
        jars = [fetch_maven_jar(g, a, v, folder) for g, a, v in KAFKA_BROKER_JARS]
        return os.pathsep.join([*(str(j) for j in jars), f"{pyspark_jars_dir()}/*"])

    def _write_config(self) -> None:
        lines = [
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@{self.host}:{self.controller_port}",
            f"listeners=PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.data_dir / 'logs'}", f"num.partitions={self.num_partitions}",
            "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0", "auto.create.topics.enable=true",
        ]
        self.config_file.write_text("\n".join([*lines, ""]))
        (self.data_dir / "log4j.properties").write_text(_LOG4J)

    def _java(self, main: str, *args: str) -> list[str]:
        return [find_java(KafkaServerError), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
                "-cp", self._classpath(), main, *args]

    def _format(self) -> None:  # ``kafka-storage format`` of the log folder, once
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        cluster_id = cluster_id_of(uuid.uuid4())
        done = subprocess.run(self._java(_STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(self.config_file)),
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise KafkaServerError(f"kafka-storage format of {self.data_dir / 'logs'} failed "
                                   f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")

    def ready(self) -> bool:
        """Whether the broker listens and its log says it started."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0):
                pass
        except OSError:
            return False
        return "Kafka Server started" in self.process.log_tail(400)

    def ports(self) -> tuple[int, ...]:
        """The broker's and the controller's port."""
        return self.port, self.controller_port

    def command(self) -> list[str]:
        """The broker's java command: its jars fetched, its configuration written, its storage formatted.

        Raises:
            KafkaServerError: the format failed.
            JarFetchError: a jar could not be fetched."""
        self._write_config()
        self._format()
        return self._java(_MAIN_CLASS, str(self.config_file))


def create_topic(spark: Any, bootstrap_servers: str, topic: str, *, partitions: int,
                 timeout_s: float = 60.0, configs: Mapping[str, str] | None = None) -> None:
    """Create ``topic`` (replication 1, settings ``configs``) from the Spark driver, unless it exists.

    Raises:
        KafkaServerError: the broker refused or did not answer in time."""
    from deltawheel.statestore.delta.jvm import jvm

    j = jvm(spark)
    props = j.java.util.Properties()
    props.setProperty("bootstrap.servers", bootstrap_servers)
    wait_ms = int(timeout_s * 1000)
    # the client's own deadlines: else a call to a missing broker waits Kafka's default minute
    props.setProperty("default.api.timeout.ms", str(wait_ms))
    props.setProperty("request.timeout.ms", str(wait_ms))
    admin = j.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        new = j.org.apache.kafka.clients.admin.NewTopic(topic, j.java.util.Optional.of(partitions),
                                                        j.java.util.Optional.empty())
        if configs:
            settings = j.java.util.HashMap()
            for k, v in configs.items():
                settings.put(k, v)
            new = new.configs(settings)
        future = admin.createTopics(j.java.util.Collections.singletonList(new)).all()
        try:
            future.get(wait_ms, j.java.util.concurrent.TimeUnit.MILLISECONDS)
        except Exception as exc:
            if "TopicExistsException" not in str(exc):
                raise KafkaServerError(f"could not create topic {topic} on {bootstrap_servers}: "
                                       f"{str(exc).splitlines()[0]}; is the broker running?") from exc
    finally:
        admin.close(j.java.time.Duration.ofMillis(wait_ms))


def cluster_id_of(u: uuid.UUID) -> str:
    """A KRaft cluster id from ``u``: its bytes in URL-safe base64 as Kafka prints them, a leading ``-``
    made ``_`` (kafka-storage would read it as an option).

    >>> cluster_id_of(uuid.UUID(bytes=b"\\xfb" + bytes(15)))
    '_wAAAAAAAAAAAAAAAAAAAA'
    """
    text = base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()
    return "_" + text[1:] if text.startswith("-") else text
