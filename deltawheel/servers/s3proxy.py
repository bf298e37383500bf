"""A local S3-compatible object store for trials and tests: S3Proxy (``org.gaul:s3proxy``) on a
filesystem backend (a bucket a folder under ``blobs/``, an object a file), a detached ``java -jar``."""

from __future__ import annotations

import http.client
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deltawheel.statestore.exceptions import ObjectStoreServerError
from deltawheel.statestore.objectstore.client import S3Client, S3Endpoint
from deltawheel.statestore.objectstore.s3a import S3PROXY_JAR, default_s3_jars_dir, ensure_jar
from deltawheel.statestore.process import find_java

from .service import Server, read_properties

__all__ = ["S3ProxyServer", "ObjectStoreStatus", "DEFAULT_IDENTITY", "DEFAULT_OBJECTSTORE_PORT"]

DEFAULT_OBJECTSTORE_PORT = 9310
DEFAULT_IDENTITY = "deltawheel"
_JAR_NAME = "s3proxy-"


@dataclass(frozen=True)
class ObjectStoreStatus:
    """What :meth:`S3ProxyServer.status` found (``running``: a live process answers HTTP on ``port``)."""

    running: bool
    pid: int | None
    port: int
    data_dir: str
    endpoint: S3Endpoint


class S3ProxyServer(Server):
    """An S3Proxy server with a filesystem backend in its own detached process; ``identity`` is the
    access key, the secret key is generated at the first start and kept."""

    start_timeout_s = 60.0

    def __init__(self, data_dir: Path | str, *, port: int = DEFAULT_OBJECTSTORE_PORT, host: str = "127.0.0.1",
                 identity: str = DEFAULT_IDENTITY, jars_dir: Path | None = None,
                 prefix: Sequence[str] = ()) -> None:
        super().__init__(data_dir, name="S3Proxy", stem="s3proxy", marker=_JAR_NAME, error=ObjectStoreServerError,
                         port=port, host=host, prefix=prefix)
        self.identity = identity
        self._jars_dir = jars_dir
        self.config_file = self.data_dir / "s3proxy.conf"
        self.blobs_dir = self.data_dir / "blobs"  # the filesystem backend: a sub-folder per bucket

    @classmethod
    def of_data(cls, data_dir: Path | str, *, port: int | None = None, host: str = "127.0.0.1") -> S3ProxyServer:
        """The server of ``data_dir`` on ``port``, else its last start's, else the default port."""
        if port is None:
            endpoint = read_properties(Path(data_dir) / "s3proxy.conf").get("s3proxy.endpoint")
            port = int(endpoint.rsplit(":", 1)[1]) if endpoint else DEFAULT_OBJECTSTORE_PORT
        return cls(data_dir, port=port, host=host)

    @property
    def endpoint(self) -> S3Endpoint:
        """URL and credentials of this server (the credential is generated at the first start)."""
        cfg = read_properties(self.config_file)
        return S3Endpoint(url=f"http://{self.host}:{self.port}", access_key=cfg.get("s3proxy.identity", self.identity),
                          secret_key=cfg.get("s3proxy.credential", ""))

    def client(self) -> S3Client:
        """An :class:`S3Client` on this server."""
        return S3Client(self.endpoint)

    def create_bucket(self, bucket: str) -> bool:
        """Create ``bucket`` through the S3 API; False if it existed already."""
        return self.client().create_bucket(bucket)

    def ready(self) -> bool:
        """Whether anything answers HTTP on this server's port (its own process or another)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1.0)
        try:
            conn.request("GET", "/")
            conn.getresponse().read()
            return True
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def foreign(self) -> str | None:
        """What to say when this folder's server does not run but something answers on its port."""
        if not self.ready():
            return None
        return (f"port {self.port} is answered by another process: not the server of {self.data_dir} (another "
                "data folder's, whose credentials are not this folder's?); pass the --data folder it was started "
                "with, or --port to start this one beside it")

    def status(self) -> ObjectStoreStatus:
        """Whether the server of this data folder runs and answers on its port."""
        pid = self.process.pid()
        running = pid is not None and self.ready()
        return ObjectStoreStatus(running=running, pid=pid, port=self.port, data_dir=str(self.data_dir),
                                 endpoint=self.endpoint)

    def _write_config(self) -> None:
        credential = read_properties(self.config_file).get("s3proxy.credential") or secrets.token_hex(16)
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("\n".join([
            f"s3proxy.endpoint=http://{self.host}:{self.port}", "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={self.identity}", f"s3proxy.credential={credential}", "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.blobs_dir}", ""]))
        self.config_file.chmod(0o600)

    def command(self) -> list[str]:
        """The ``java -jar`` command of S3Proxy (its jar fetched once), its configuration written."""
        java = find_java(ObjectStoreServerError)
        jar = ensure_jar(S3PROXY_JAR, self._jars_dir or default_s3_jars_dir())
        self._write_config()
        return [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-jar", str(jar),
                "--properties", str(self.config_file)]
