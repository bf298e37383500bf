"""Configuration, parsed once at the edge into frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from .exceptions import ConfigError

__all__ = ["ZkConfig", "StoreLimits", "DEFAULT_ZK_PORT"]

DEFAULT_ZK_PORT = 2181


@dataclass(frozen=True)
class ZkConfig:
    """How to reach ZooKeeper: every znode deltawheel creates lives below ``chroot``; with ``digest``
    (``user:password``) lease znodes carry a digest ACL. A disconnection shorter than
    ``session_timeout_s`` only pauses commits, a longer one expires the session (LeaseLostError); it
    is how long a killed instance's leases stay held (the server caps it, the embedded one at 60 s)."""

    hosts: str = f"127.0.0.1:{DEFAULT_ZK_PORT}"
    chroot: str = "/deltawheel"
    digest: str | None = None
    session_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not self.chroot.startswith("/") or (len(self.chroot) > 1 and self.chroot.endswith("/")):
            raise ConfigError(f"ZooKeeper chroot must start with '/' and not end with '/': {self.chroot!r}; "
                              "pass e.g. --zk-chroot /deltawheel")
        if self.digest is not None and ":" not in self.digest:
            raise ConfigError("ZooKeeper digest must be 'user:password' (--zk-digest or DELTAWHEEL_ZK_DIGEST); "
                              "pass both parts, separated by ':'")


@dataclass(frozen=True)
class StoreLimits:
    """Guards applied to every row before it is committed."""

    max_state_bytes: int = 4 * 1024 * 1024
    max_record_ids_per_key: int = 10_000
