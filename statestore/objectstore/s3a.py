"""Spark on an S3-compatible store through Hadoop's ``s3a://`` file system; its jars: :data:`S3A_JARS`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..exceptions import ConfigError
from ..jars import fetch_maven_jar
from .client import S3Endpoint

if TYPE_CHECKING:
    from ..delta.storefs import TableFiles

__all__ = ["S3A_JARS", "S3PROXY_JAR", "MavenJar", "default_s3_jars_dir", "ensure_jar", "ensure_s3a_jars",
           "s3a_jars_present", "s3a_settings", "spark_conf", "configure_bucket", "set_hadoop", "bucket_of",
           "endpoint_from_env", "files_from_env", "ENV_ENDPOINT", "ENV_ACCESS_KEY", "ENV_SECRET_KEY"]

# one S3-compatible store for every s3a:// bucket of a process
ENV_ENDPOINT = "DELTAWHEEL_S3_ENDPOINT"
ENV_ACCESS_KEY = "DELTAWHEEL_S3_ACCESS_KEY"
ENV_SECRET_KEY = "DELTAWHEEL_S3_SECRET_KEY"

# (group, artifact, version, classifier, sha1)
MavenJar = tuple[str, str, str, str | None, str]

_SDK = "2.35.4"  # the AWS SDK v2 version hadoop-project 3.5.0 declares
_AWS = "software.amazon.awssdk"
# hadoop-aws's dependencies minus the SDK bundle, plus the SDK modules S3A uses (docs/objectstore.md)
S3A_JARS: tuple[MavenJar, ...] = (
    ("org.apache.hadoop", "hadoop-aws", "3.5.0", None, "9e594525d264c0db653c7f68da98b245f7d61ea5"),
    ("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1", None,
     "6c9bd0f6c440c9a78e82d272f5f0252d942419f6"),
    (_AWS, "s3", _SDK, None, "cc6cd77617d73cf9084d021e2693863bede49a4d"),
    (_AWS, "s3-transfer-manager", _SDK, None, "6e4f2e5072fbc8551940eeed15220ddd11c684b2"),
    (_AWS, "aws-xml-protocol", _SDK, None, "3a8c83d91ba7b41c29a2d84826e293ec4fa51386"),
    (_AWS, "aws-query-protocol", _SDK, None, "a4908689bc1285e192da926bd1d646d09d1d7def"),
    (_AWS, "protocol-core", _SDK, None, "54d8a6bdbe86852311b80d2a5b782995d6d7d0b7"),
    (_AWS, "arns", _SDK, None, "d915a3104773b44533bd6f618a8c7b28c2e9d8a0"),
    (_AWS, "profiles", _SDK, None, "f9342cdd5f95a0d2f85bbedc3d25c3fc230beb51"),
    (_AWS, "crt-core", _SDK, None, "eba7c2ddaef9938a072b4a6e58fd95ce8a7e0805"),
    (_AWS, "http-auth", _SDK, None, "ffa68c5e63d0f8ee9a5788029267cc450b5617c4"),
    (_AWS, "identity-spi", _SDK, None, "75e3168376548e375560e4595ba6a768458c87c1"),
    (_AWS, "http-auth-spi", _SDK, None, "8b280ce879d02d3da134e61e303d8e6c5eacc988"),
    (_AWS, "http-auth-aws", _SDK, None, "d149f075bc7b5631754cbb1adfcd2c77aa932a1b"),
    (_AWS, "http-auth-aws-eventstream", _SDK, None, "2590b41716ea3fd938fe614321da9c5367f6868c"),
    (_AWS, "checksums", _SDK, None, "75d7256f1fa208224a3b23e2100941c0416f38a5"),
    (_AWS, "checksums-spi", _SDK, None, "36eba96eccfc87a5de204f72ad215ac362d28755"),
    (_AWS, "retries-spi", _SDK, None, "22196f00e2560aa9c74b6a74f62b8bd51a4b94b6"),
    (_AWS, "retries", _SDK, None, "02117c396b14d7db6c4b88d5c32b8380640a7bd0"),
    (_AWS, "sdk-core", _SDK, None, "7de70ccba4959d32e7a2ec549d312378413d36c9"),
    (_AWS, "auth", _SDK, None, "3a5f28f575d616813cad10a8db817984ed57d777"),
    (_AWS, "http-client-spi", _SDK, None, "3995875e3b834d39d708b661142949078babc34a"),
    (_AWS, "regions", _SDK, None, "83ab2f31cd9932dc274aa418cd4cbd761cbca3c8"),
    (_AWS, "annotations", _SDK, None, "0ee2f050aafed2b3b9393472a4fb35eb91c74555"),
    (_AWS, "utils", _SDK, None, "8bf086b3b751b058fa62e7f0398d94db7295ebbe"),
    (_AWS, "utils-lite", _SDK, None, "148d6b8801d9696c4cffff306dfdd3b96781af24"),
    (_AWS, "aws-core", _SDK, None, "2f288fa2bac08dde3e9c74950bc9a7fe04913371"),
    (_AWS, "metrics-spi", _SDK, None, "a2065eca2ade2adb2a937d4e671b52704cffbdc5"),
    (_AWS, "json-utils", _SDK, None, "ca561bcb836814901bb8eda4089e451dcbf18024"),
    (_AWS, "third-party-jackson-core", _SDK, None, "980758655bc742236478439d753c634858846d1c"),
    (_AWS, "endpoints-spi", _SDK, None, "5fd0e9e47a6fdf05ea5906ac38e0bce1268ab9f0"),
    (_AWS, "apache-client", _SDK, None, "406c25140a3a32ccd49ba3d752096a9fe2787ba3"),
    (_AWS, "netty-nio-client", _SDK, None, "90acbbb695727eac973267f70d72bd95244d1d60"),
    ("software.amazon.eventstream", "eventstream", "1.0.1", None, "6ff8649dffc5190366ada897ba8525a836297784"),
    ("org.reactivestreams", "reactive-streams", "1.0.4", None, "3864a1320d97d7b045f729a326e1e077661f31b7"),
)

# 4.1.0 or later: older ones do not list S3A's empty directory markers
S3PROXY_JAR: MavenJar = ("org.gaul", "s3proxy", "4.1.0", "jar-with-dependencies",
                         "0a0b89e982bc1b1b5757d45b61109e05a840dd87")


def default_s3_jars_dir() -> Path:
    """Where the S3A and S3Proxy jars are cached (``$DELTAWHEEL_S3_JARS_DIR``, or in ``~/.cache``)."""
    env = os.environ.get("DELTAWHEEL_S3_JARS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "deltawheel" / "s3-jars"


def _name(jar: MavenJar) -> str:
    _, artifact, version, classifier, _ = jar
    return f"{artifact}-{version}{'-' + classifier if classifier else ''}.jar"


def ensure_jar(jar: MavenJar, jars_dir: Path, *, quiet: bool = False) -> Path:
    """The path of ``jar`` in ``jars_dir``, fetched from Maven Central (SHA-1 checked) if missing.
    Raises JarFetchError: it could not be fetched, or its checksum is not the pinned one."""
    group, artifact, version, classifier, sha1 = jar
    return fetch_maven_jar(group, artifact, version, jars_dir, classifier=classifier, sha1=sha1, quiet=quiet)


def ensure_s3a_jars(jars_dir: Path | None = None, *, quiet: bool = False) -> list[Path]:
    """The paths of :data:`S3A_JARS`, fetching the missing ones."""
    return [ensure_jar(j, jars_dir or default_s3_jars_dir(), quiet=quiet) for j in S3A_JARS]


def s3a_jars_present(jars_dir: Path | None = None) -> list[Path] | None:
    """The paths of :data:`S3A_JARS` if all are in the cache, else ``None`` (nothing is fetched)."""
    paths = [(jars_dir or default_s3_jars_dir()) / _name(j) for j in S3A_JARS]
    return paths if all(p.exists() for p in paths) else None


def s3a_settings(endpoint: S3Endpoint, bucket: str | None = None) -> dict[str, str]:
    """Hadoop settings for reaching ``endpoint`` with S3A (``bucket`` only, or every bucket)."""
    prefix = f"fs.s3a.bucket.{bucket}." if bucket else "fs.s3a."
    values = {
        "endpoint": endpoint.url, "endpoint.region": endpoint.region, "path.style.access": "true",
        "connection.ssl.enabled": str(endpoint.ssl).lower(),
        "access.key": endpoint.access_key, "secret.key": endpoint.secret_key,
        "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "attempts.maximum": "2", "retry.limit": "2", "retry.interval": "200ms",
        "connection.establish.timeout": "5s",
    }
    return {prefix + k: v for k, v in values.items()}


def spark_conf(endpoint: S3Endpoint, bucket: str | None = None) -> dict[str, str]:
    """:func:`s3a_settings` as Spark settings (``spark.hadoop.`` prefix)."""
    return {f"spark.hadoop.{k}": v for k, v in s3a_settings(endpoint, bucket).items()}


def configure_bucket(spark: Any, endpoint: S3Endpoint, bucket: str) -> None:
    """Make a running session reach ``bucket`` on ``endpoint`` (not for a bucket already used)."""
    set_hadoop(spark, s3a_settings(endpoint, bucket))


def set_hadoop(spark: Any, values: Mapping[str, str | None]) -> None:
    """Set each key on a running session and its Hadoop configuration (None: unset it)."""
    from ..delta.jvm import jcontext
    from ..delta.storefs import forget_s3_settings

    conf = jcontext(spark).hadoopConfiguration()
    for k, v in values.items():
        if v is None:
            spark.conf.unset(k)
            conf.unset(k)
        else:
            spark.conf.set(k, v)
            conf.set(k, v)
    forget_s3_settings(spark)


def endpoint_from_env(env: Mapping[str, str] | None = None) -> S3Endpoint | None:
    """The endpoint named by ``$DELTAWHEEL_S3_ENDPOINT`` and its keys, or ``None`` when it is not set.
    Raises ConfigError: the endpoint is set but a key is missing or the URL is not http(s)."""
    env = os.environ if env is None else env
    url = env.get(ENV_ENDPOINT)
    if not url:
        return None
    access, secret = env.get(ENV_ACCESS_KEY), env.get(ENV_SECRET_KEY)
    if not access or not secret:
        raise ConfigError(f"{ENV_ENDPOINT} is set but {ENV_ACCESS_KEY} or {ENV_SECRET_KEY} is not: set both "
                          "('deltawheel objectstore status' prints the local server's)")
    return S3Endpoint(url=url, access_key=access, secret_key=secret)


def bucket_of(uri: str) -> str | None:
    """The bucket of an ``s3a://bucket/...`` (or ``s3://``) URI, else ``None``."""
    for scheme in ("s3a://", "s3://"):
        if uri.startswith(scheme):
            return uri[len(scheme):].split("/", 1)[0] or None
    return None


def files_from_env(uri: str, env: Mapping[str, str] | None = None) -> TableFiles | None:
    """:func:`~..delta.storefs.files_for` of ``uri`` without Spark, S3 from :func:`endpoint_from_env`.
    Raises ConfigError: the endpoint is set but a key is missing or the URL is not http(s).

    >>> env = {ENV_ENDPOINT: "http://127.0.0.1:9000", ENV_ACCESS_KEY: "k", ENV_SECRET_KEY: "s"}
    >>> f = files_from_env("s3a://b/store/rows", env)
    >>> (f.root, f.s3.endpoint, f.s3.scheme, f.s3.access_key, f.s3.path_style)
    ('b/store/rows', '127.0.0.1:9000', 'http', 'k', True)
    >>> files_from_env("/tmp/store/rows", env).is_local
    True
    """
    from ..delta.storefs import S3Settings, files_for

    endpoint = endpoint_from_env(env) if uri.startswith("s3a://") else None
    if endpoint is None:
        return files_for(uri)
    bucket = bucket_of(uri) or ""
    return files_for(uri, S3Settings.from_hadoop(s3a_settings(endpoint, bucket).get, bucket))
