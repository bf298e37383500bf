"""Spark's Kafka connector jars (pyspark ships none), fetched once from Maven Central into a cache."""

from __future__ import annotations

import os
from pathlib import Path

from ..jars import fetch_maven_jar

__all__ = ["KAFKA_CLIENTS_VERSION", "default_kafka_jars_dir", "kafka_connector_jars", "ensure_kafka_jars",
           "kafka_jars_present"]

#: The kafka-clients version Spark 4.2's connector declares (the local test broker runs it too).
KAFKA_CLIENTS_VERSION = "3.9.2"


def default_kafka_jars_dir() -> Path:
    """Where Kafka jars are cached (``$DELTAWHEEL_KAFKA_JARS_DIR``, or in ``~/.cache``)."""
    env = os.environ.get("DELTAWHEEL_KAFKA_JARS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "deltawheel" / "kafka-jars"


def _spark_version() -> str:
    import pyspark

    return str(pyspark.__version__).split("+")[0]


def kafka_connector_jars() -> tuple[tuple[str, str, str], ...]:
    """(group, artifact, version) of the connector for the installed pyspark and what it needs."""
    spark = _spark_version()
    return (
        ("org.apache.spark", "spark-sql-kafka-0-10_2.13", spark),
        ("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", spark),
        ("org.apache.kafka", "kafka-clients", KAFKA_CLIENTS_VERSION),
        ("org.apache.commons", "commons-pool2", "2.13.1"),
    )


def _folder(jars_dir: Path | None) -> Path:
    return jars_dir or default_kafka_jars_dir() / f"spark-{_spark_version()}"


def ensure_kafka_jars(jars_dir: Path | None = None, *, quiet: bool = False) -> list[Path]:
    """The connector's jars, fetched once.
    Raises JarFetchError: a jar could not be fetched (the message says where to put it by hand)."""
    folder = _folder(jars_dir)
    return [fetch_maven_jar(g, a, v, folder, quiet=quiet, hint=" or set DELTAWHEEL_KAFKA_JARS_DIR")
            for g, a, v in kafka_connector_jars()]


def kafka_jars_present(jars_dir: Path | None = None) -> list[Path]:
    """The connector's jars if all of them are cached, else ``[]`` (nothing is fetched)."""
    folder = _folder(jars_dir)
    paths = [folder / f"{a}-{v}.jar" for _g, a, v in kafka_connector_jars()]
    return paths if all(p.exists() for p in paths) else []
