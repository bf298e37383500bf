"""The store of an ``--object-store`` chaos run: ``s3a://chaos/store`` on a local S3Proxy under the
run's ``s3/`` (the checker reads ``s3/blobs/chaos/store`` as local tables), and ``s3proxy-kill``."""

from __future__ import annotations

import time
from pathlib import Path

from deltawheel.statestore.exceptions import ObjectStoreServerError
from deltawheel.statestore.objectstore import s3a
from deltawheel.statestore.process import free_ports

from ..servers.s3proxy import S3ProxyServer

__all__ = ["ChaosObjectStore", "BUCKET"]

BUCKET = "chaos"
_KEY = "store"  # the store's prefix in the bucket


class ChaosObjectStore:
    """S3Proxy on ``folder`` (a free port drawn at :meth:`start`, kept across restarts)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.blobs = folder / "blobs"  # what the disk-full fault's tmpfs covers
        self.local = self.blobs / BUCKET / _KEY  # the store as files: what the checker reads
        self.url = f"s3a://{BUCKET}/{_KEY}"
        self.server: S3ProxyServer | None = None
        self.env: dict[str, str] = {}

    def start(self) -> None:
        """Start the server and create the bucket; :attr:`env` then holds the drivers' settings.

        Raises:
            ObjectStoreServerError: no java or jar, or it did not answer in time."""
        self.server = S3ProxyServer(self.folder, port=free_ports(1)[0])
        self.server.start()
        self.server.create_bucket(BUCKET)
        ep = self.server.endpoint
        self.env = {s3a.ENV_ENDPOINT: ep.url, s3a.ENV_ACCESS_KEY: ep.access_key, s3a.ENV_SECRET_KEY: ep.secret_key}

    def kill(self) -> int | None:
        """SIGKILL the server (its pid, or None if it was not running)."""
        return self.server.kill() if self.server is not None else None

    def restart(self, attempts: int = 5) -> None:
        """Start it again on the same data and port (a failed start is tried again 2 s later).

        Raises:
            ObjectStoreServerError: the last attempt's error."""
        for attempt in range(attempts):
            try:
                assert self.server is not None
                self.server.start()
                return
            except ObjectStoreServerError:
                if attempt == attempts - 1:
                    raise
                time.sleep(2.0)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        if self.server is not None:
            self.server.stop()
