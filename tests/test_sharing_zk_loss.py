"""A job instance sharing a run's intervals while its ZooKeeper connection drops (a server killed).

A chaos run found a restarted instance stopping with kazoo's bare ``ConnectionLoss`` (exit 1, a
traceback) when a ZooKeeper server was killed while the instance read its share of the intervals.
The connection comes back within the session timeout, so the instance reads its share again; a
command that still meets a lost connection ends with one typed line (exit 4).
"""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conftest import free_port
from deltawheel.executor.computation import Computation
from deltawheel.executor.drivers.sharing import Sharing
from deltawheel.executor.drivers.wiring import Wiring
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import LeaseLostError, LeaseSuspendedError, exit_code
from deltawheel.statestore.zk.client import connect


class Counts(Computation):
    name = "counts"
    num_intervals = 4


class _NoSpark(Sharing):
    """Sharing without a session: standing by (warming Delta's commit path) is only recorded."""

    stood_by: list[str]

    def _stand_by(self, comp: Any) -> None:
        self.stood_by = [*getattr(self, "stood_by", []), comp.name]


def test_a_starting_instance_reads_its_share_again_after_its_zookeeper_connection_drops(
        zk_server: Any, zk_config: Any, tmp_path: Path) -> None:
    from deltawheel.servers.toxiproxy import ToxiproxyServer

    tox = ToxiproxyServer(tmp_path / "toxiproxy", port=free_port())
    tox.start()
    try:
        listen = free_port()
        tox.proxy("zk", listen_port=listen, upstream=f"127.0.0.1:{zk_server.port}")
        client = connect(ZkConfig(hosts=f"127.0.0.1:{listen}", chroot=zk_config.chroot + "/share-loss",
                                  session_timeout_s=20.0))
        said: list[str] = []
        try:
            wiring = Wiring(client=client, leases=None, authority=None, store=types.SimpleNamespace())  # type: ignore[arg-type]
            share = _NoSpark(None, None, SimpleNamespace(name="p"), wiring=wiring,  # type: ignore[arg-type]
                             instance="a", progress=said.append, write_path="auto")
            # not a member: once it reads the target it starts nothing (no Spark needed)
            tox.set_latency("zk", 5_000)  # its reads are on the wire when the connection drops
            outcome: dict[str, Any] = {}

            def start() -> None:
                try:
                    outcome["ex"] = share.start(Counts(), str(tmp_path / "chk"), wait_s=60.0, caps={})
                except Exception as exc:
                    outcome["error"] = exc

            thread = threading.Thread(target=start)
            thread.start()
            time.sleep(1.0)
            tox.set_enabled("zk", False)  # the server is gone for the client: its reads fail with ConnectionLoss
            tox.set_latency("zk", 0)
            tox.set_enabled("zk", True)  # another server (here the same one) answers within the session timeout
            thread.join(timeout=60)
            assert not thread.is_alive()
            assert "error" not in outcome, f"the start stopped: {outcome.get('error')!r}"
            assert outcome["ex"] is None
            assert any("ZooKeeper does not answer; looking again" in s for s in said), said
            assert said[-1] == "counts: instance a holds no interval now"
            assert share.stood_by == ["counts"]
        finally:
            client.stop()
            client.close()
    finally:
        tox.stop()


def test_a_command_meeting_a_lost_zookeeper_session_or_connection_ends_with_one_typed_line() -> None:
    from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError

    from deltawheel.cli import _typed

    lost, closed, expired = _typed(ConnectionLoss()), _typed(ConnectionClosedError("closed")), \
        _typed(SessionExpiredError())
    assert isinstance(lost, LeaseSuspendedError)
    assert isinstance(expired, LeaseLostError) and isinstance(closed, LeaseLostError)
    assert exit_code(lost) == exit_code(expired) == 4
    assert "run the command again" in str(lost) and "ConnectionLoss" in str(lost)
    assert _typed(ValueError("a bug")) is None  # anything else stays a traceback
