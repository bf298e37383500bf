"""A TCP relay that records what its clients send: what goes over the wire, seen by a test."""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Relays TCP connections to ``target``, keeping every byte the clients send in :attr:`seen`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        """``host:port`` of the relay."""
        return f"127.0.0.1:{self._server.getsockname()[1]}"

    def cut(self) -> None:
        """Close every open connection (a client's kept-alive one included), as a server or a NAT may."""
        with self._lock:
            socks, self._open = self._open, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError), src, dst:
            while data := src.recv(65536):
                if record:
                    with self._lock:
                        self.seen.extend(data)
                dst.sendall(data)

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream.dup(), True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client.dup(), False), daemon=True).start()
