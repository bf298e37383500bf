"""Toxiproxy: a TCP proxy adding real network latency between a client and a local server (``deltawheel
bench commits``, the chaos run's ``net-cut``), built once with ``go install``, set through its HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deltawheel.statestore.exceptions import ObjectStoreServerError

from .service import Server

__all__ = ["TOXIPROXY_MODULE", "TOXIPROXY_VERSION", "ToxiproxyServer", "ensure_toxiproxy"]

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
TOXIPROXY_VERSION = "v2.5.0"
_BINARY = f"toxiproxy-server-{TOXIPROXY_VERSION}"


def _go() -> str:
    goroot = os.environ.get("GOROOT")
    for candidate in (shutil.which("go"), goroot and os.path.join(goroot, "bin", "go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ObjectStoreServerError("Toxiproxy is built from its Go module and no `go` was found on PATH; "
                                 "install Go (1.21 or newer) and run `deltawheel setup --toxiproxy` again")


def ensure_toxiproxy(bin_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """The Toxiproxy server binary, built with ``go install`` into ``bin_dir`` the first time.

    Raises:
        ObjectStoreServerError: Go is missing or the build failed (with its output).
    """
    bin_dir = bin_dir or Path.home() / ".cache" / "deltawheel" / "bin"
    target = bin_dir / _BINARY
    if target.exists():
        return target
    bin_dir.mkdir(parents=True, exist_ok=True)
    build = bin_dir / f".build-{os.getpid()}"
    if not quiet:
        print(f"deltawheel: building Toxiproxy {TOXIPROXY_VERSION} from its Go module into {bin_dir} (once per user)",
              file=sys.stderr)
    env = {**os.environ, "GOBIN": str(build), "CGO_ENABLED": "0"}
    done = subprocess.run([_go(), "install", f"{TOXIPROXY_MODULE}@{TOXIPROXY_VERSION}"], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not (build / "server").exists():
        raise ObjectStoreServerError(f"building Toxiproxy failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    (build / "server").replace(target)
    shutil.rmtree(build, ignore_errors=True)
    return target


class ToxiproxyServer(Server):
    """A Toxiproxy server run from ``data_dir`` (its pid and log files), its API on ``port``."""

    stop_timeout_s = 10.0
    port_hint = "pass another port"

    def __init__(self, data_dir: Path | str, *, port: int, host: str = "127.0.0.1",
                 bin_dir: Path | None = None) -> None:
        super().__init__(data_dir, name="Toxiproxy", stem="toxiproxy", marker=_BINARY, error=ObjectStoreServerError,
                         port=port, host=host)
        self._bin_dir = bin_dir

    @property
    def api(self) -> str:
        """The HTTP API's base URL."""
        return f"http://{self.host}:{self.port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.api}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ObjectStoreServerError(f"Toxiproxy {method} {path} answered {exc.code}: "
                                         f"{exc.read().decode(errors='replace')}") from exc
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:  # /version answers plain text
            return text

    def ready(self) -> bool:
        """Whether its API answers."""
        try:
            self._call("GET", "/version")
            return True
        except (OSError, ObjectStoreServerError):
            return False

    def command(self) -> list[str]:
        """The server's command (its binary built first if needed)."""
        return [str(ensure_toxiproxy(self._bin_dir)), "-host", self.host, "-port", str(self.port)]

    def proxy(self, name: str, *, listen_port: int, upstream: str) -> str:
        """Create proxy ``name`` from ``listen_port`` to ``upstream`` (``host:port``); returns its URL."""
        self._call("POST", "/proxies", {"name": name, "listen": f"{self.host}:{listen_port}",
                                        "upstream": upstream, "enabled": True})
        return f"http://{self.host}:{listen_port}"

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Open (True) or close proxy ``name``: closed, it drops its connections and refuses new ones."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def set_latency(self, name: str, latency_ms: int) -> None:
        """Delay every response of proxy ``name`` by ``latency_ms`` (0: no toxic)."""
        toxics = {t["name"] for t in self._call("GET", f"/proxies/{name}/toxics") or []}
        if "latency" in toxics:
            self._call("DELETE", f"/proxies/{name}/toxics/latency")
        if latency_ms > 0:
            self._call("POST", f"/proxies/{name}/toxics", {
                "name": "latency", "type": "latency", "stream": "downstream", "toxicity": 1.0,
                "attributes": {"latency": int(latency_ms), "jitter": 0}})
