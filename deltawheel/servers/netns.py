"""Separate hosts on one machine: a bridge ``dwh-br``, a network namespace ``dwh-<name>`` per host and
a private file system view (``unshare --mount``) per isolated process; needs root (docs/cluster.md)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deltawheel.statestore.exceptions import ClusterError, HostsUnavailableError

__all__ = ["PREFIX", "Host", "HostNetwork", "check_namespaces", "isolated_prefix", "host_prefix",
           "leftovers", "BASE_PATH", "run_ip"]

PREFIX = "dwh"
BRIDGE = f"{PREFIX}-br"
#: The PATH of a process on an isolated host: the system's folders only.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Folders an isolated host never sees (besides the test bed's folder and :func:`private_folders`).
MASKED = ("/work", "/root", "/tmp")
_STAGE = "/srv"


def private_folders() -> list[Path]:
    """The folders an isolated host must not see: this checkout, this Python environment, home, temp."""
    checkout = Path(__file__).resolve().parents[2]
    return [checkout, Path(sys.prefix).resolve(), Path.home().resolve(), Path(tempfile.gettempdir()).resolve()]


def _masks(extra: Sequence[Path]) -> list[str]:
    """The folders to cover, none beneath another (a system folder such as ``/usr`` is never one).

    >>> _masks([Path(MASKED[0], "a"), Path("/check/x"), Path("/check/x/y"), Path("/usr")])
    ['/check/x', '/root', '/tmp', '/work']
    """
    found = {Path(m) for m in MASKED} | {d for d in extra if d.parts[1:2] not in (("usr",), ())}
    return sorted(str(d) for d in found if not any(d != o and d.is_relative_to(o) for o in found))


@dataclass(frozen=True)
class Host:
    """One host of the test bed: its name and address.

    >>> Host("zk1", "10.61.0.11").netns
    'dwh-zk1'
    """

    name: str
    address: str

    @property
    def netns(self) -> str:
        """Its network namespace (also the name of its veth on the bridge)."""
        return f"{PREFIX}-{self.name}"


def run_ip(*args: str, check: bool = True, hint: str = "") -> subprocess.CompletedProcess[str]:
    """``ip ARGS``; ClusterError (its message ending in ``hint``) when it fails and ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise ClusterError(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}{hint}")
    return done


def check_namespaces() -> None:
    """Raise :class:`HostsUnavailableError` when this machine cannot make the test bed's hosts."""
    if os.geteuid() != 0:
        raise HostsUnavailableError("the hosts test bed needs root: network namespaces, veth pairs and a "
                                    "bridge need CAP_NET_ADMIN, private mounts CAP_SYS_ADMIN; run as root")
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            raise HostsUnavailableError(f"the hosts test bed needs the '{tool}' command (Debian: {package})")
    probe = f"{PREFIX}-probe"
    done = run_ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        raise HostsUnavailableError(f"this machine refuses network namespaces ('ip netns add' said: "
                                    f"{done.stderr.strip()}); the hosts test bed cannot run here")
    try:
        mnt = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--mount", "--propagation", "private",
                              "mount", "-t", "tmpfs", "dwh-probe", _STAGE], capture_output=True, text=True,
                             timeout=30)
        if mnt.returncode != 0:
            raise HostsUnavailableError(f"this machine refuses private mounts in a namespace (unshare --mount: "
                                        f"{mnt.stderr.strip()}); the hosts test bed cannot run here")
    finally:
        run_ip("netns", "del", probe, check=False)


def leftovers() -> list[str]:
    """What of any test bed is still on this machine: namespaces, links and their processes."""
    found = []
    for line in run_ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"{PREFIX}-"):
            pids = run_ip("netns", "pids", name, check=False).stdout.split()
            found.append(f"namespace {name}" + (f" (pids {' '.join(pids)})" if pids else ""))
    for line in run_ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1 and parts[1].strip().split("@")[0].startswith(f"{PREFIX}-"):
            found.append(f"link {parts[1].strip().split('@')[0]}")
    return found


class HostNetwork:
    """The bridge (``bridge_address``, the /24's ``.1``) and one namespace per host."""

    def __init__(self, hosts: Sequence[Host], *, bridge_address: str) -> None:
        self.hosts = tuple(hosts)
        self.bridge_address = bridge_address

    def exists(self) -> bool:
        """Whether the bridge is there (the network is up)."""
        return run_ip("link", "show", BRIDGE, check=False).returncode == 0

    def up(self) -> None:
        """Make the bridge and each host's namespace, veth pair and addresses (what exists is kept).

        Raises:
            HostsUnavailableError: namespaces cannot be made here.
            ClusterError: an ``ip`` command failed.
        """
        check_namespaces()
        if not self.exists():
            run_ip("link", "add", BRIDGE, "type", "bridge")
            run_ip("addr", "add", f"{self.bridge_address}/24", "dev", BRIDGE)
            run_ip("link", "set", BRIDGE, "up")
        have = set(run_ip("netns", "list").stdout.split())
        for h in self.hosts:
            if h.netns in have:
                continue
            run_ip("netns", "add", h.netns)
            run_ip("link", "add", h.netns, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
            run_ip("link", "set", h.netns, "master", BRIDGE, "up")
            run_ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            run_ip("-n", h.netns, "link", "set", "eth0", "up")
            run_ip("-n", h.netns, "link", "set", "lo", "up")

    def pids(self, host: Host) -> list[int]:
        """The processes running in ``host``'s namespace."""
        return [int(p) for p in run_ip("netns", "pids", host.netns, check=False).stdout.split()]

    def kill(self, host: Host) -> list[int]:
        """SIGKILL every process in ``host``'s namespace once; returns those it signalled."""
        killed = []
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def down(self) -> int:
        """SIGKILL every host's processes, delete the network; idempotent. Returns how many were killed."""
        killed = 0
        for h in self.hosts:
            for _ in range(50):
                if not self.pids(h):
                    break
                killed += len(self.kill(h))
                time.sleep(0.1)
            run_ip("netns", "del", h.netns, check=False)
            run_ip("link", "del", h.netns, check=False)
        run_ip("link", "del", BRIDGE, check=False)
        return killed


def isolated_prefix(host: Host, *, own_dir: Path, shared_dirs: Sequence[Path] = (), hidden: Sequence[Path] = (),
                    env: Mapping[str, str] | None = None) -> list[str]:
    """The words that run a command on ``host`` with its own view of the file system: :data:`MASKED`,
    :func:`private_folders` and ``hidden`` are empty, ``own_dir`` (writable) and ``shared_dirs``
    (read-only) are seen; the environment holds only ``PATH``, ``HOME``, ``LANG`` and ``env``."""
    keep = [own_dir.resolve(), *(d.resolve() for d in shared_dirs)]
    masks = _masks([*private_folders(), *(d.resolve() for d in hidden)])
    lines = ["set -e", f"mount -t tmpfs -o size=1m,mode=755 dwh-stage {_STAGE}"]
    for i, d in enumerate(keep):
        lines += [f"mkdir {_STAGE}/{i}", f"mount --bind {shlex.quote(str(d))} {_STAGE}/{i}"]
    for m in masks:
        mode = "1777" if m == "/tmp" else "755"
        lines.append(f"mount -t tmpfs -o mode={mode} dwh-mask {shlex.quote(m)}")
    for i, d in enumerate(keep):
        q = shlex.quote(str(d))
        lines += [f"mkdir -p {q}", f"mount --move {_STAGE}/{i} {q}"]
        if i > 0:
            lines.append(f"mount -o remount,bind,ro {q}")
    lines.append(f'exec env -i PATH={BASE_PATH} HOME=/root LANG=C.UTF-8 "$@"')
    words = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--propagation", "private", "--",
             "/bin/sh", "-c", "\n".join(lines), f"host-{host.name}"]
    return words + [f"{k}={v}" for k, v in (env or {}).items()]


def host_prefix(host: Host, env: Mapping[str, str] | None = None) -> list[str]:
    """The words that run a command on ``host`` with the machine's files and environment, plus ``env``."""
    return ["ip", "netns", "exec", host.netns, "env", *(f"{k}={v}" for k, v in (env or {}).items())]
