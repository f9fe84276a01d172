"""The bounded HTTP fetcher against real local HTTP and HTTPS servers that misbehave on purpose."""

from __future__ import annotations

import base64
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

import pytest

from agent.http_fetch import (
    POLL,
    FetchError,
    FetchReason,
    FetchResult,
    fetch,
    fetch_bytes,
    redact,
)
from harness import TIMEOUT, free_port, make_pki, wait_until

DATA: Final = random.Random(7).randbytes(300_000)
DRIP_SECONDS: Final = 10.0
"""A dripping server's pause between bytes: far longer than a cancel may take."""
USER, PASSWORD = "operator", "s3cr3t-pw"


class Server(ThreadingHTTPServer):
    """A local HTTP server whose paths misbehave in known ways (see `Handler`)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.stop = threading.Event()
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.sent_bytes = 0

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients here hang up on purpose (cancels, refused redirects, untrusted
        certificates): nothing to print."""

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        parts = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        route = ROUTES.get(parts.path)
        try:
            if route is None:
                self.send_error(404)
            else:
                route(self, query)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: fine

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.server.sent_bytes += len(data)

    # -- routes --

    def file(self, _query: dict[str, str]) -> None:
        asked = self.headers.get("Range", "")
        if not asked.startswith("bytes="):
            self.head(200, {"Content-Length": str(len(DATA)), "Content-Type": "audio/x-test"})
            self.write(DATA)
            return
        first = int(asked.removeprefix("bytes=").partition("-")[0])
        if first >= len(DATA):
            self.head(416, {"Content-Range": f"bytes */{len(DATA)}", "Content-Length": "0"})
            return
        content_range = f"bytes {first}-{len(DATA) - 1}/{len(DATA)}"
        self.head(206, {"Content-Length": str(len(DATA) - first), "Content-Range": content_range})
        self.write(DATA[first:])

    def no_range(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": str(len(DATA))})
        self.write(DATA)

    def wrong_range(self, _query: dict[str, str]) -> None:
        self.head(206, {"Content-Length": "100", "Content-Range": f"bytes 0-99/{len(DATA)}"})
        self.write(DATA[:100])

    def short_length(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": "10"})  # and then much more
        self.write(DATA[:5000])
        self.close_connection = True

    def long_length(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": "100000"})  # and then much less
        self.write(DATA[:500])
        self.close_connection = True

    def declared_huge(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": str(10**9)})
        self.write(DATA[:1000])
        self.server.stop.wait(TIMEOUT)  # the rest never comes

    def endless(self, _query: dict[str, str]) -> None:
        self.head(200, {"Connection": "close"})  # no length: the body ends when the server closes
        self.close_connection = True
        while not self.server.stop.is_set() and self.server.sent_bytes < 10**8:
            self.write(DATA[:16384])

    def chunked(self, _query: dict[str, str]) -> None:
        self.head(200, {"Transfer-Encoding": "chunked"})
        while not self.server.stop.is_set() and self.server.sent_bytes < 10**8:
            self.write(b"4000\r\n" + DATA[:16384] + b"\r\n")

    def redirect(self, query: dict[str, str]) -> None:
        self.head(int(query.get("code", "302")), {"Location": query["to"], "Content-Length": "0"})

    def loop(self, query: dict[str, str]) -> None:
        hops = int(query.get("hops", "0"))
        self.head(302, {"Location": f"/loop?hops={hops + 1}", "Content-Length": "0"})

    def drip(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": "100"})
        for _ in range(100):
            self.write(b"x")
            if self.server.stop.wait(DRIP_SECONDS):
                return

    def drip_headers(self, _query: dict[str, str]) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx":
            self.wfile.write(bytes([byte]))
            if self.server.stop.wait(DRIP_SECONDS):
                return
        self.close_connection = True

    def trickle(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": str(10**6)})
        for _ in range(10**6):
            self.write(b"t")
            if self.server.stop.wait(0.05):
                return

    def silent(self, _query: dict[str, str]) -> None:
        self.head(200, {"Content-Length": "100"})
        self.write(b"s")
        self.server.stop.wait(TIMEOUT)

    def garbage(self, _query: dict[str, str]) -> None:
        self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        self.close_connection = True

    def auth(self, _query: dict[str, str]) -> None:
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != f"Basic {token}":
            self.head(401, {"Content-Length": "0", "WWW-Authenticate": 'Basic realm="t"'})
            return
        self.head(200, {"Content-Length": "2"})
        self.write(b"ok")


ROUTES: Final[dict[str, Callable[[Handler, dict[str, str]], None]]] = {
    "/file": Handler.file,
    "/no-range": Handler.no_range,
    "/wrong-range": Handler.wrong_range,
    "/short-length": Handler.short_length,
    "/long-length": Handler.long_length,
    "/declared-huge": Handler.declared_huge,
    "/endless": Handler.endless,
    "/chunked": Handler.chunked,
    "/redirect": Handler.redirect,
    "/loop": Handler.loop,
    "/drip": Handler.drip,
    "/drip-headers": Handler.drip_headers,
    "/trickle": Handler.trickle,
    "/silent": Handler.silent,
    "/garbage": Handler.garbage,
    "/auth": Handler.auth,
}


def running(server: Server) -> Iterator[Server]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


@pytest.fixture
def server() -> Iterator[Server]:
    yield from running(Server())


@pytest.fixture
def other_server() -> Iterator[Server]:
    yield from running(Server())


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[Server, ssl.SSLContext]]:
    """An HTTPS server and a client context that trusts its throwaway CA."""
    pki = make_pki(tmp_path / "pki")
    server = Server()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.cert, pki.key)
    server.socket = context.wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False
    )
    yield from ((s, ssl.create_default_context(cafile=pki.ca)) for s in running(server))


def failure(call: Callable[[], object]) -> FetchError:
    with pytest.raises(FetchError) as caught:
        call()
    return caught.value


# ---- good fetches -------------------------------------------------------------------------


def test_a_file_is_streamed_to_the_sink_in_blocks(server: Server) -> None:
    blocks: list[bytes] = []
    result = fetch(server.url("/file"), blocks.append, max_bytes=len(DATA))
    assert b"".join(blocks) == DATA
    assert len(blocks) > 1
    assert max(map(len, blocks)) <= 64 * 1024
    assert result == FetchResult(server.url("/file"), 200, len(DATA), 0, len(DATA), result.headers)
    assert result.headers["content-type"] == "audio/x-test"
    _, headers = server.requests[-1]
    assert headers["user-agent"] == "voice-agent"
    assert headers["accept-encoding"] == "identity"
    assert "range" not in headers


def test_fetch_bytes_returns_the_body(server: Server) -> None:
    assert fetch_bytes(server.url("/file"), max_bytes=10**6) == DATA


def test_extra_headers_are_sent(server: Server) -> None:
    fetch_bytes(server.url("/file"), max_bytes=10**6, headers={"If-None-Match": '"v1"'})
    assert server.requests[-1][1]["if-none-match"] == '"v1"'


# ---- Range --------------------------------------------------------------------------------


def test_a_download_resumes_from_an_offset(server: Server, tmp_path: Path) -> None:
    part = tmp_path / "model.part"
    part.write_bytes(DATA[:123_456])  # what an interrupted download left
    with part.open("ab") as out:
        result = fetch(server.url("/file"), out.write, max_bytes=10**6, start=123_456)
    assert part.read_bytes() == DATA
    assert (result.status, result.start, result.received) == (206, 123_456, len(DATA) - 123_456)
    assert result.total == len(DATA)
    assert server.requests[-1][1]["range"] == "bytes=123456-"


def test_a_server_that_ignores_the_range_is_refused(server: Server) -> None:
    blocks: list[bytes] = []
    err = failure(lambda: fetch(server.url("/no-range"), blocks.append, max_bytes=10**6, start=5))
    assert err.reason is FetchReason.RANGE_UNSUPPORTED
    assert blocks == []  # nothing of the whole file was appended to the partial one


def test_a_range_that_starts_elsewhere_is_refused(server: Server) -> None:
    err = failure(lambda: fetch(server.url("/wrong-range"), print, max_bytes=10**6, start=50))
    assert err.reason is FetchReason.RANGE_UNSUPPORTED
    assert "bytes 0-99" in err.detail


def test_a_range_past_the_end_is_an_http_error(server: Server) -> None:
    err = failure(lambda: fetch(server.url("/file"), print, max_bytes=10, start=len(DATA)))
    assert (err.reason, err.status) == (FetchReason.HTTP_ERROR, 416)


# ---- size ---------------------------------------------------------------------------------


def test_the_cap_is_inclusive(server: Server) -> None:
    assert len(fetch_bytes(server.url("/file"), max_bytes=len(DATA))) == len(DATA)


@pytest.mark.parametrize(("path", "cap"), [("/file", len(DATA) - 1), ("/declared-huge", 10**6)])
def test_a_content_length_over_the_cap_is_refused_before_the_body(
    server: Server, path: str, cap: int
) -> None:
    blocks: list[bytes] = []
    err = failure(lambda: fetch(server.url(path), blocks.append, max_bytes=cap))
    assert err.reason is FetchReason.TOO_LARGE
    assert blocks == []


def test_no_more_than_the_content_length_is_read(server: Server) -> None:
    """A server that sends more than it announced: only the announced bytes count."""
    assert fetch_bytes(server.url("/short-length"), max_bytes=10**6) == DATA[:10]


def test_a_body_shorter_than_its_content_length_is_incomplete(server: Server) -> None:
    blocks: list[bytes] = []
    err = failure(lambda: fetch(server.url("/long-length"), blocks.append, max_bytes=10**6))
    assert err.reason is FetchReason.INCOMPLETE
    assert b"".join(blocks) == DATA[:500]  # what came is kept: a resume can start from it


@pytest.mark.parametrize("path", ["/endless", "/chunked"])
def test_a_body_without_length_is_cut_off_at_the_cap(server: Server, path: str) -> None:
    blocks: list[bytes] = []
    cap = 200_000
    err = failure(lambda: fetch(server.url(path), blocks.append, max_bytes=cap))
    assert err.reason is FetchReason.TOO_LARGE
    assert sum(map(len, blocks)) <= cap
    assert sum(map(len, blocks)) > cap - 64 * 1024


# ---- redirects ----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_the_same_origin_is_followed(server: Server, code: int) -> None:
    for location in ("/file", server.url("/file"), f"http://127.0.0.1:{server.port}/file"):
        quoted = urllib.parse.quote(location, safe="")
        result = fetch(
            server.url(f"/redirect?code={code}&to={quoted}"), lambda _: None, max_bytes=10**6
        )
        assert (result.status, result.received) == (200, len(DATA))
        assert result.url == server.url("/file")


def test_redirects_up_to_the_limit_are_followed_and_no_more(server: Server) -> None:
    err = failure(lambda: fetch(server.url("/loop"), print, max_bytes=10, max_redirects=3))
    assert err.reason is FetchReason.REDIRECT_REFUSED
    assert "more than 3 redirects" in err.detail
    paths = [path for path, _ in server.requests]
    assert paths == ["/loop", "/loop?hops=1", "/loop?hops=2", "/loop?hops=3"]


@pytest.mark.parametrize(
    "location",
    [
        "http://localhost:{port}/file",  # another host name, even for the same machine
        "http://127.0.0.1:{other}/file",  # another port
        "https://127.0.0.1:{port}/file",  # another scheme
        "ftp://127.0.0.1/file",
        "file:///etc/passwd",
    ],
)
def test_a_redirect_elsewhere_is_refused(
    server: Server, other_server: Server, location: str
) -> None:
    target = location.format(port=server.port, other=other_server.port)
    url = server.url(f"/redirect?to={urllib.parse.quote(target, safe='')}")
    err = failure(lambda: fetch_bytes(url, max_bytes=10**6))
    assert err.reason is FetchReason.REDIRECT_REFUSED
    assert other_server.requests == []
    assert len(server.requests) == 1


def test_credentials_go_with_same_origin_redirects_and_never_into_messages(
    server: Server,
) -> None:
    base = f"http://{USER}:{PASSWORD}@127.0.0.1:{server.port}"
    assert fetch_bytes(f"{base}/auth", max_bytes=10) == b"ok"
    assert fetch_bytes(f"{base}/redirect?to=%2Fauth", max_bytes=10) == b"ok"
    for path in ("/missing?token=abc", "/redirect?to=http%3A%2F%2Flocalhost%2Fx", "/long-length"):
        err = failure(partial(fetch_bytes, f"{base}{path}", max_bytes=10**6))
        for secret in (USER, PASSWORD, "token=abc"):
            assert secret not in str(err)
        assert f"127.0.0.1:{server.port}" in err.detail
    err = failure(
        lambda: fetch_bytes(f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}/x", max_bytes=1)
    )
    assert PASSWORD not in str(err)


def test_redact() -> None:
    assert redact("https://u:p@host:8443/a/b?sig=x#f") == "https://host:8443/a/b?..."
    assert redact("http://host/a") == "http://host/a"


# ---- errors -------------------------------------------------------------------------------


def test_a_missing_file_is_an_http_error_with_its_status(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/missing"), max_bytes=10**6))
    assert (err.reason, err.status) == (FetchReason.HTTP_ERROR, 404)
    assert "404" in err.detail


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1/x", FetchReason.BAD_SCHEME),
        ("file:///etc/passwd", FetchReason.BAD_SCHEME),
        ("127.0.0.1/x", FetchReason.BAD_SCHEME),
        ("http:///x", FetchReason.BAD_URL),
        ("http://127.0.0.1:99999/x", FetchReason.BAD_URL),
        ("http://[::1/x", FetchReason.BAD_URL),
        ("http://127.0.0.1:1/x y", FetchReason.BAD_URL),
        ("http://no-such-host.invalid/x", FetchReason.CONNECTION_FAILED),
    ],
)
def test_bad_urls_are_refused_with_a_reason(url: str, reason: FetchReason) -> None:
    assert failure(lambda: fetch_bytes(url, max_bytes=10)).reason is reason


def test_a_response_that_is_not_http_is_a_bad_response(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/garbage"), max_bytes=10**6))
    assert err.reason is FetchReason.BAD_RESPONSE


def test_a_closed_port_is_a_connection_failure() -> None:
    err = failure(lambda: fetch_bytes(f"http://127.0.0.1:{free_port()}/x", max_bytes=10))
    assert err.reason is FetchReason.CONNECTION_FAILED
    assert "refused" in err.detail.lower()


def test_what_the_sink_raises_goes_through(server: Server) -> None:
    def full_disk(_chunk: bytes) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        fetch(server.url("/file"), full_disk, max_bytes=10**6)


# ---- time: cancel, deadline, stall ---------------------------------------------------------


def cancel_while_dripping(
    url: str, ready: Callable[[list[bytes]], bool], context: ssl.SSLContext | None = None
) -> tuple[float, object]:
    """Start a fetch of a dripping URL in a thread, cancel it once `ready` (given the blocks
    received) says it is waiting, and return how long it took to give up after the cancel, and
    what it ended with."""
    cancel = threading.Event()
    blocks: list[bytes] = []
    outcome: list[object] = []
    ended = threading.Event()

    def run() -> None:
        try:
            outcome.append(
                fetch(url, blocks.append, max_bytes=10**6, cancel=cancel, ssl_context=context,
                      timeout=TIMEOUT * 2, stall_timeout=TIMEOUT * 2)
            )  # fmt: skip
        except FetchError as err:
            outcome.append(err)
        finally:
            ended.set()

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait_until(lambda: ready(blocks), what="the fetch to be waiting for the server")
        cancel.set()
        cancelled_at = time.monotonic()
        ended.wait(TIMEOUT)
        delay = time.monotonic() - cancelled_at
    finally:
        cancel.set()
        worker.join(TIMEOUT)
    return delay, outcome[0] if outcome else None


def test_a_cancel_stops_a_dripping_download_within_a_second(server: Server) -> None:
    delay, outcome = cancel_while_dripping(server.url("/drip"), bool)
    print(
        f"cancel honoured after {delay * 1000:.0f} ms (poll {POLL} s, drip every {DRIP_SECONDS} s)"
    )
    assert isinstance(outcome, FetchError)
    assert outcome.reason is FetchReason.CANCELLED
    assert delay < DRIP_SECONDS / 2  # generous; it did not wait for the next byte


def test_a_cancel_stops_a_server_dripping_its_headers(server: Server) -> None:
    delay, outcome = cancel_while_dripping(
        server.url("/drip-headers"), lambda _: bool(server.requests)
    )
    assert isinstance(outcome, FetchError)
    assert outcome.reason is FetchReason.CANCELLED
    assert delay < DRIP_SECONDS / 2


def test_a_cancel_before_the_start_sends_nothing(server: Server) -> None:
    cancel = threading.Event()
    cancel.set()
    err = failure(lambda: fetch_bytes(server.url("/file"), max_bytes=10**6, cancel=cancel))
    assert err.reason is FetchReason.CANCELLED
    assert server.requests == []


def test_the_overall_deadline_ends_a_trickle(server: Server) -> None:
    started = time.monotonic()
    blocks: list[bytes] = []
    err = failure(
        lambda: fetch(server.url("/trickle"), blocks.append, max_bytes=10**7, timeout=1.0)
    )
    elapsed = time.monotonic() - started
    print(f"deadline 1 s: gave up after {elapsed:.2f} s with {len(blocks)} bytes")
    assert err.reason is FetchReason.TIMEOUT
    assert elapsed >= 1.0
    assert blocks  # bytes kept coming: it was the deadline, not a stall


def test_a_silent_server_is_a_stall(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/silent"), max_bytes=10**6, stall_timeout=0.5))
    assert err.reason is FetchReason.STALLED


# ---- TLS ----------------------------------------------------------------------------------


def test_https_with_a_trusted_certificate(tls: tuple[Server, ssl.SSLContext]) -> None:
    server, context = tls
    url = server.url("/file", scheme="https")
    assert fetch_bytes(url, max_bytes=10**6, ssl_context=context) == DATA
    result = fetch(url, lambda _: None, max_bytes=10**6, ssl_context=context, start=1000)
    assert (result.status, result.received) == (206, len(DATA) - 1000)


def test_https_with_an_untrusted_certificate_is_a_tls_error(
    tls: tuple[Server, ssl.SSLContext],
) -> None:
    server, _ = tls
    err = failure(lambda: fetch_bytes(server.url("/file", scheme="https"), max_bytes=10**6))
    assert err.reason is FetchReason.TLS_ERROR
    assert "certificate" in err.detail


def test_a_cancel_stops_a_dripping_https_download(tls: tuple[Server, ssl.SSLContext]) -> None:
    server, context = tls
    delay, outcome = cancel_while_dripping(server.url("/drip", scheme="https"), bool, context)
    print(f"TLS: cancel honoured after {delay * 1000:.0f} ms")
    assert isinstance(outcome, FetchError)
    assert outcome.reason is FetchReason.CANCELLED
    assert delay < DRIP_SECONDS / 2
