"""A real HTTP release server for the update tests, with the faults a LAN or a bad server shows:
a connection cut part way, no Range support, endless data, a stall, a trickle."""

from __future__ import annotations

import http.server
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import free_port


@dataclass
class Behaviour:
    """How the server misbehaves; the test changes it while the server runs."""

    cut_after: int | None = None
    """The first full request of each file is closed after this many bytes."""
    honour_range: bool = True
    endless: bool = False
    """After the file, send zeros forever (no Content-Length)."""
    stall_after: int | None = None
    """Every response stops sending after this many bytes and holds the connection."""
    bytes_per_second: int | None = None
    drip_seconds: float | None = None
    """Send one byte, then wait this long, and so on (just fast enough to beat a stall timeout)."""
    redirect: dict[str, str] = field(default_factory=dict)
    """Paths answered with a 302 to another URL."""
    content_length: int | None = None
    """A lying Content-Length, sent instead of the body's true one (the whole body is sent
    either way, then the connection closes)."""
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    """(path, Range header) of every request, in order."""
    sent: int = 0
    """Body bytes sent in all."""
    _cut_done: set[str] = field(default_factory=set)


class ReleaseServer:
    """Serves a directory over HTTP on a free loopback port, misbehaving as told."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.behaviour = Behaviour()
        self.port = free_port()
        self._stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The base URL of the directory."""
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> ReleaseServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release any stalled connection."""
        self._stop.set()
        self._http.shutdown()
        self._http.server_close()

    def serve(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        """Answer one GET according to the behaviour."""
        how = self.behaviour
        name = handler.path.lstrip("/")
        ranged = handler.headers.get("Range")
        how.requests.append((name, ranged))
        path = self.directory / name
        if name in how.redirect:
            handler.send_response(302)
            handler.send_header("Location", how.redirect[name])
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if ".." in name.split("/") or not path.is_file():
            handler.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", ranged or "")
        if match and how.honour_range:
            start = int(match.group(1))
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        body = data[start:]
        if not how.endless:
            length = len(body) if how.content_length is None else how.content_length
            handler.send_header("Content-Length", str(length))
        handler.end_headers()
        if how.cut_after is not None and start == 0 and name not in how._cut_done:
            how._cut_done.add(name)
            body = body[: how.cut_after]
        going = self._send(handler, body, how)
        while how.endless and going and not self._stop.is_set():
            going = self._send(handler, bytes(65536), how)

    def _send(
        self, handler: http.server.BaseHTTPRequestHandler, body: bytes, how: Behaviour
    ) -> bool:
        """Send body in small steps; False when the client went away or the server stalled."""
        step = 1 if how.drip_seconds else 256 if how.bytes_per_second else 4096
        for offset in range(0, len(body), step):
            if how.stall_after is not None and how.sent >= how.stall_after:
                self._stop.wait()  # hold the connection, send nothing
                return False
            chunk = body[offset : offset + step]
            try:
                handler.wfile.write(chunk)
            except OSError:  # the client went away: fine
                return False
            how.sent += len(chunk)
            if how.bytes_per_second:
                time.sleep(len(chunk) / how.bytes_per_second)
            if how.drip_seconds and self._stop.wait(how.drip_seconds):
                return False
        return True
