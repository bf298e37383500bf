"""A TCP relay that records what its clients send: what goes over the wire, seen by a test."""

from __future__ import annotations

import contextlib
import re
import socket
import threading


class Relay:
    """Relays TCP connections to ``target``, keeping every byte the clients send in :attr:`seen`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._refusals: list[tuple[bytes, int]] = []
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

    def refuse(self, request: bytes, times: int) -> None:
        """Answer the next ``times`` requests that the regular expression ``request`` matches at their
        start with a 503 (and close their connection), as a store shedding load does; they are still
        kept in :attr:`seen`."""
        with self._lock:
            self._refusals.append((request, times))

    def _refused(self, data: bytes) -> bool:
        with self._lock:
            for i, (line, left) in enumerate(self._refusals):
                if left and re.match(line, data):
                    self._refusals[i] = (line, left - 1)
                    return True
        return False

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool, client: socket.socket | None = None) -> None:
        with contextlib.suppress(OSError), src, dst:
            while data := src.recv(65536):
                if record:
                    with self._lock:
                        self.seen.extend(data)
                if client is not None and self._refused(data):
                    client.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    client.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, upstream]
            # both duplicates before either pump runs: a refusing pump closes ``client`` at once
            to_upstream, to_client = upstream.dup(), client.dup()
            threading.Thread(target=self._pump, args=(client, to_upstream, True, client), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, to_client, False), daemon=True).start()
