"""A bare TCP listener that answers nothing and counts the connections made to it: whether a
fetch reached an address it must not (the egress tests)."""

from __future__ import annotations

import socket


class Listener:
    """Listens on `host`:`port` (0: a free one) without blocking."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])

    def connections(self) -> int:
        """Connections made since the last call (each accepted and closed)."""
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()
