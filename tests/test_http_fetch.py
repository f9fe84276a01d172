"""The bounded HTTP fetcher against real local HTTP and HTTPS servers that misbehave on purpose,
and its egress policy: where it may connect (the address actually connected to, every redirect),
what it sends (no credentials; a non-ASCII path percent-encoded) and what its errors say (never
a byte of the server's answer)."""

from __future__ import annotations

import base64
import ipaddress
import random
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

import pytest

from agent.core.egress import EgressPolicy
from agent.guarded.http_fetch import (
    POLL,
    Failure,
    FetchError,
    FetchReason,
    FetchResult,
    fetch,
    fetch_bytes,
    is_own_address,
    redact,
)
from harness import TIMEOUT, free_port, make_pki, wait_until
from harness.listener import Listener

DATA: Final = random.Random(7).randbytes(300_000)
DRIP_SECONDS: Final = 10.0
"""A dripping server's pause between bytes: far longer than a cancel may take."""
USER, PASSWORD = "operator", "s3cr3t-pw"
LOCAL: Final = EgressPolicy.parse(["127.0.0.1:*"], "test.hosts")
"""The test servers' address, any port: named, so loopback is allowed."""
BANNER: Final = b"SSH-2.0-OpenSSH_9.2 token-7f3a9c"
UNICODE_PATH: Final = "/kl\u00e4nge/b\u00fcro l\u00e4uten.wav"


def policy(*entries: str) -> EgressPolicy:
    return EgressPolicy.parse(entries, "test.hosts")


class Server(ThreadingHTTPServer):
    """A local HTTP server whose paths misbehave in known ways (see `Handler`)."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), Handler)
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
        host = str(self.server_address[0])
        return f"{scheme}://{host}:{self.port}{path}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        parts = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        route = ROUTES.get(urllib.parse.unquote(parts.path))
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
        self.wfile.write(BANNER + b"\r\n\r\n")
        self.close_connection = True

    def reason(self, _query: dict[str, str]) -> None:
        self.send_response(503, BANNER.decode())  # a status line whose reason is a secret
        self.send_header("Content-Length", "0")
        self.send_header("X-Banner", BANNER.decode())
        self.end_headers()

    def range_banner(self, _query: dict[str, str]) -> None:
        self.head(206, {"Content-Length": "1", "Content-Range": BANNER.decode()})
        self.write(b"x")

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
    "/reason": Handler.reason,
    "/range-banner": Handler.range_banner,
    UNICODE_PATH: Handler.file,
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
    result = fetch(server.url("/file"), blocks.append, policy=LOCAL, max_bytes=len(DATA))
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
    assert fetch_bytes(server.url("/file"), policy=LOCAL, max_bytes=10**6) == DATA


def test_extra_headers_are_sent(server: Server) -> None:
    fetch_bytes(
        server.url("/file"), policy=LOCAL, max_bytes=10**6, headers={"If-None-Match": '"v1"'}
    )
    assert server.requests[-1][1]["if-none-match"] == '"v1"'


# ---- Range --------------------------------------------------------------------------------


def test_a_download_resumes_from_an_offset(server: Server, tmp_path: Path) -> None:
    part = tmp_path / "model.part"
    part.write_bytes(DATA[:123_456])  # what an interrupted download left
    with part.open("ab") as out:
        result = fetch(server.url("/file"), out.write, policy=LOCAL, max_bytes=10**6, start=123_456)
    assert part.read_bytes() == DATA
    assert (result.status, result.start, result.received) == (206, 123_456, len(DATA) - 123_456)
    assert result.total == len(DATA)
    assert server.requests[-1][1]["range"] == "bytes=123456-"


def test_a_server_that_ignores_the_range_is_refused(server: Server) -> None:
    blocks: list[bytes] = []
    err = failure(
        lambda: fetch(
            server.url("/no-range"), blocks.append, policy=LOCAL, max_bytes=10**6, start=5
        )
    )
    assert err.reason is FetchReason.RANGE_UNSUPPORTED
    assert blocks == []  # nothing of the whole file was appended to the partial one


def test_a_range_that_starts_elsewhere_is_refused(server: Server) -> None:
    err = failure(
        lambda: fetch(server.url("/wrong-range"), print, policy=LOCAL, max_bytes=10**6, start=50)
    )
    assert err.reason is FetchReason.RANGE_UNSUPPORTED
    assert "bytes 0-99" not in err.cause  # the header is the server's


def test_a_range_past_the_end_is_an_http_error(server: Server) -> None:
    err = failure(
        lambda: fetch(server.url("/file"), print, policy=LOCAL, max_bytes=10, start=len(DATA))
    )
    assert (err.reason, err.status) == (FetchReason.HTTP_ERROR, 416)


# ---- size ---------------------------------------------------------------------------------


def test_the_cap_is_inclusive(server: Server) -> None:
    assert len(fetch_bytes(server.url("/file"), policy=LOCAL, max_bytes=len(DATA))) == len(DATA)


@pytest.mark.parametrize(("path", "cap"), [("/file", len(DATA) - 1), ("/declared-huge", 10**6)])
def test_a_content_length_over_the_cap_is_refused_before_the_body(
    server: Server, path: str, cap: int
) -> None:
    blocks: list[bytes] = []
    err = failure(lambda: fetch(server.url(path), blocks.append, policy=LOCAL, max_bytes=cap))
    assert err.reason is FetchReason.TOO_LARGE
    assert blocks == []


def test_no_more_than_the_content_length_is_read(server: Server) -> None:
    """A server that sends more than it announced: only the announced bytes count."""
    assert fetch_bytes(server.url("/short-length"), policy=LOCAL, max_bytes=10**6) == DATA[:10]


def test_a_body_shorter_than_its_content_length_is_incomplete(server: Server) -> None:
    blocks: list[bytes] = []
    err = failure(
        lambda: fetch(server.url("/long-length"), blocks.append, policy=LOCAL, max_bytes=10**6)
    )
    assert err.reason is FetchReason.INCOMPLETE
    assert b"".join(blocks) == DATA[:500]  # what came is kept: a resume can start from it


@pytest.mark.parametrize("path", ["/endless", "/chunked"])
def test_a_body_without_length_is_cut_off_at_the_cap(server: Server, path: str) -> None:
    blocks: list[bytes] = []
    cap = 200_000
    err = failure(lambda: fetch(server.url(path), blocks.append, policy=LOCAL, max_bytes=cap))
    assert err.reason is FetchReason.TOO_LARGE
    assert sum(map(len, blocks)) <= cap
    assert sum(map(len, blocks)) > cap - 64 * 1024


# ---- redirects ----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_the_same_origin_is_followed(server: Server, code: int) -> None:
    for location in ("/file", server.url("/file"), f"http://127.0.0.1:{server.port}/file"):
        quoted = urllib.parse.quote(location, safe="")
        result = fetch(
            server.url(f"/redirect?code={code}&to={quoted}"),
            lambda _: None,
            policy=LOCAL,
            max_bytes=10**6,
        )
        assert (result.status, result.received) == (200, len(DATA))
        assert result.url == server.url("/file")


def test_redirects_up_to_the_limit_are_followed_and_no_more(server: Server) -> None:
    err = failure(
        lambda: fetch(server.url("/loop"), print, policy=LOCAL, max_bytes=10, max_redirects=3)
    )
    assert err.reason is FetchReason.REDIRECT_REFUSED
    assert "more than 3 redirects" in err.cause
    paths = [path for path, _ in server.requests]
    assert paths == ["/loop", "/loop?hops=1", "/loop?hops=2", "/loop?hops=3"]


@pytest.mark.parametrize(
    "location",
    [
        "http://localhost:{port}/file",  # a name the policy does not list, even for this machine
        "http://127.0.0.1:{other}/file",  # a port it does not list
        "http://127.0.0.2:{port}/file",  # another loopback address
        "http://[::ffff:127.0.0.2]:{port}/file",
        "http://2130706434:{port}/file",  # 127.0.0.2 again
        "ftp://127.0.0.1/file",
        "file:///etc/passwd",
        "http://{user}:{password}@127.0.0.1:{port}/file",
    ],
)
def test_a_redirect_the_policy_does_not_allow_is_refused(
    server: Server, other_server: Server, location: str
) -> None:
    target = location.format(
        port=server.port, other=other_server.port, user=USER, password=PASSWORD
    )
    url = server.url(f"/redirect?to={urllib.parse.quote(target, safe='')}")
    err = failure(lambda: fetch_bytes(url, policy=policy(f"127.0.0.1:{server.port}"), max_bytes=9))
    assert err.reason is FetchReason.NOT_ALLOWED
    assert err.failure is Failure.REFUSED_BY_POLICY
    assert other_server.requests == []
    assert len(server.requests) == 1
    for text in (str(err), err.cause):  # the Location is the server's: none of it is shown
        assert target not in text
        assert str(other_server.port) not in text
        assert PASSWORD not in text


def test_a_redirect_to_another_allowed_port_is_followed(
    server: Server, other_server: Server
) -> None:
    target = other_server.url("/file")
    url = server.url(f"/redirect?to={urllib.parse.quote(target, safe='')}")
    allowed = policy(f"127.0.0.1:{server.port}", f"127.0.0.1:{other_server.port}")
    assert fetch_bytes(url, policy=allowed, max_bytes=10**6) == DATA
    assert [path for path, _ in other_server.requests] == ["/file"]


def test_a_redirect_from_https_to_http_is_refused(
    tls: tuple[Server, ssl.SSLContext], server: Server
) -> None:
    secure, context = tls
    target = urllib.parse.quote(server.url("/file"), safe="")
    url = secure.url(f"/redirect?to={target}", scheme="https")
    err = failure(lambda: fetch_bytes(url, policy=LOCAL, max_bytes=10**6, ssl_context=context))
    assert err.reason is FetchReason.NOT_ALLOWED
    assert server.requests == []


def test_a_url_with_credentials_is_refused_and_nothing_is_sent(server: Server) -> None:
    for userinfo in (f"{USER}:{PASSWORD}@", f"{USER}@", ":@", f"{PASSWORD}%40x@"):
        url = f"http://{userinfo}127.0.0.1:{server.port}/auth?token=abc"
        err = failure(lambda: fetch_bytes(url, policy=LOCAL, max_bytes=10))  # noqa: B023
        assert err.reason is FetchReason.NOT_ALLOWED
        for secret in (USER, PASSWORD, "token=abc"):
            assert secret not in str(err)
            assert secret not in err.cause
        assert str(err) == f"refused_by_policy: http://127.0.0.1:{server.port}/auth?..."
    assert server.requests == []  # no request, so no Authorization header ever went out


def test_no_authorization_header_is_ever_sent(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/auth"), policy=LOCAL, max_bytes=10))
    assert err.status == 401
    assert "authorization" not in server.requests[-1][1]


def test_a_non_ascii_path_and_query_are_percent_encoded_and_fetched(server: Server) -> None:
    query = "token=s\u00e9cret&x=a b"
    url = server.url(f"{UNICODE_PATH}?{query}")
    assert fetch_bytes(url, policy=LOCAL, max_bytes=10**6) == DATA
    path, _ = server.requests[-1]
    assert path.isascii()
    assert path == urllib.parse.quote(UNICODE_PATH) + "?token=s%C3%A9cret&x=a%20b"
    err = failure(lambda: fetch_bytes(url + "&missing", policy=policy("127.0.0.2:*"), max_bytes=9))
    assert "cret" not in str(err)
    assert "token" not in str(err)


def test_redact() -> None:
    assert redact("https://u:p@host:8443/a/b?sig=x#f") == "https://host:8443/a/b?..."
    assert redact("http://host/a") == "http://host/a"


# ---- errors -------------------------------------------------------------------------------


def test_a_missing_file_is_an_http_error_with_its_status(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/missing"), policy=LOCAL, max_bytes=10**6))
    assert (err.reason, err.status) == (FetchReason.HTTP_ERROR, 404)
    assert "404" in err.cause
    assert str(err) == f"http_error 404: {server.url('/missing')}"
    assert "Not Found" not in f"{err} {err.cause}"  # the status's reason is the server's text


@pytest.mark.parametrize("path", ["/reason", "/garbage", "/range-banner"])
def test_no_byte_of_the_answer_reaches_the_error(server: Server, path: str) -> None:
    start = 1 if path == "/range-banner" else 0
    err = failure(lambda: fetch(server.url(path), print, policy=LOCAL, max_bytes=99, start=start))
    print(f"{err} ({err.cause})")
    for text in (str(err), err.cause, repr(err)):
        assert "token-7f3a9c" not in text
        assert "OpenSSH" not in text


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://127.0.0.1/x", FetchReason.BAD_SCHEME),
        ("file:///etc/passwd", FetchReason.BAD_SCHEME),
        ("127.0.0.1/x", FetchReason.BAD_SCHEME),
        ("http:///x", FetchReason.BAD_URL),
        ("http://127.0.0.1:99999/x", FetchReason.BAD_URL),
        ("http://[::1/x", FetchReason.BAD_URL),
        ("http://no-such-host.invalid/x", FetchReason.NOT_ALLOWED),
    ],
)
def test_bad_urls_are_refused_with_a_reason(url: str, reason: FetchReason) -> None:
    assert failure(lambda: fetch_bytes(url, policy=LOCAL, max_bytes=10)).reason is reason


def test_a_name_that_does_not_resolve_is_unreachable() -> None:
    url = "http://no-such-host.invalid/x"
    err = failure(lambda: fetch_bytes(url, policy=policy("no-such-host.invalid"), max_bytes=10))
    assert err.reason is FetchReason.CONNECTION_FAILED
    assert err.failure is Failure.UNREACHABLE


def test_a_response_that_is_not_http_is_a_bad_response(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/garbage"), policy=LOCAL, max_bytes=10**6))
    assert err.reason is FetchReason.BAD_RESPONSE
    assert err.failure is Failure.UNREACHABLE


def test_a_closed_port_is_a_connection_failure() -> None:
    err = failure(
        lambda: fetch_bytes(f"http://127.0.0.1:{free_port()}/x", policy=LOCAL, max_bytes=10)
    )
    assert err.reason is FetchReason.CONNECTION_FAILED
    assert "refused" in err.cause.lower()  # for the debug log
    assert "refused" not in str(err)  # published: as unreachable as a filtered port
    assert err.failure is Failure.UNREACHABLE


def test_what_the_sink_raises_goes_through(server: Server) -> None:
    def full_disk(_chunk: bytes) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        fetch(server.url("/file"), full_disk, policy=LOCAL, max_bytes=10**6)


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
                fetch(url, blocks.append, policy=LOCAL, max_bytes=10**6, cancel=cancel,
                      ssl_context=context, timeout=TIMEOUT * 2, stall_timeout=TIMEOUT * 2)
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
    err = failure(
        lambda: fetch_bytes(server.url("/file"), policy=LOCAL, max_bytes=10**6, cancel=cancel)
    )
    assert err.reason is FetchReason.CANCELLED
    assert server.requests == []


def test_the_overall_deadline_ends_a_trickle(server: Server) -> None:
    started = time.monotonic()
    blocks: list[bytes] = []
    err = failure(
        lambda: fetch(
            server.url("/trickle"), blocks.append, policy=LOCAL, max_bytes=10**7, timeout=1.0
        )
    )
    elapsed = time.monotonic() - started
    print(f"deadline 1 s: gave up after {elapsed:.2f} s with {len(blocks)} bytes")
    assert err.reason is FetchReason.TIMEOUT
    assert elapsed >= 1.0
    assert blocks  # bytes kept coming: it was the deadline, not a stall


def test_a_silent_server_is_a_stall(server: Server) -> None:
    err = failure(
        lambda: fetch_bytes(server.url("/silent"), policy=LOCAL, max_bytes=10**6, stall_timeout=0.5)
    )
    assert err.reason is FetchReason.STALLED


# ---- TLS ----------------------------------------------------------------------------------


def test_https_with_a_trusted_certificate(tls: tuple[Server, ssl.SSLContext]) -> None:
    server, context = tls
    url = server.url("/file", scheme="https")
    assert fetch_bytes(url, policy=LOCAL, max_bytes=10**6, ssl_context=context) == DATA
    result = fetch(
        url, lambda _: None, policy=LOCAL, max_bytes=10**6, ssl_context=context, start=1000
    )
    assert (result.status, result.received) == (206, len(DATA) - 1000)


def test_https_with_an_untrusted_certificate_is_a_tls_error(
    tls: tuple[Server, ssl.SSLContext],
) -> None:
    server, _ = tls
    err = failure(
        lambda: fetch_bytes(server.url("/file", scheme="https"), policy=LOCAL, max_bytes=10**6)
    )
    assert err.reason is FetchReason.TLS_ERROR
    assert "certificate" in err.cause


def test_a_cancel_stops_a_dripping_https_download(tls: tuple[Server, ssl.SSLContext]) -> None:
    server, context = tls
    delay, outcome = cancel_while_dripping(server.url("/drip", scheme="https"), bool, context)
    print(f"TLS: cancel honoured after {delay * 1000:.0f} ms")
    assert isinstance(outcome, FetchError)
    assert outcome.reason is FetchReason.CANCELLED
    assert delay < DRIP_SECONDS / 2


# ---- where it may connect: the address connected to -------------------------------------------


@pytest.fixture
def listener() -> Iterator[Listener]:
    bare = Listener("127.0.0.1")
    yield bare
    bare.close()


EVERYWHERE: Final = policy("0.0.0.0/0:*", "[::/0]:*")
"""Every address allowed as written, and no refused class named: loopback, link-local and the
node's own addresses stay refused."""
LOOPBACK_SPELLINGS: Final = (
    "127.0.0.1",
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f000001",
    "0x7f.1",
    "0177.0.0.1",
    "017700000001",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "127.000.000.001",
)


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_loopback_in_every_spelling_is_refused_unless_named(listener: Listener, host: str) -> None:
    url = f"http://{host}:{listener.port}/relay/0?turn=on"
    err = failure(lambda: fetch_bytes(url, policy=EVERYWHERE, max_bytes=10))
    print(f"{host}: {err} ({err.cause})")
    assert err.reason is FetchReason.NOT_ALLOWED
    assert "turn=on" not in f"{err} {err.cause}"
    assert listener.connections() == 0


def test_a_name_that_resolves_to_loopback_is_refused(listener: Listener) -> None:
    """`localhost` is allowed as a name: the address it resolves to is still checked."""
    url = f"http://localhost:{listener.port}/x"
    err = failure(lambda: fetch_bytes(url, policy=policy("localhost:*"), max_bytes=10))
    assert err.reason is FetchReason.NOT_ALLOWED
    assert "loopback" in err.cause
    assert listener.connections() == 0


def test_a_named_loopback_address_is_allowed(server: Server) -> None:
    for entry in (f"127.0.0.1:{server.port}", "127.0.0.0/8:*", f"[::ffff:127.0.0.1]:{server.port}"):
        assert fetch_bytes(server.url("/file"), policy=policy(entry), max_bytes=10**6) == DATA
    assert fetch_bytes(
        f"http://localhost:{server.port}/file",
        policy=policy("localhost:*", "127.0.0.1:*", "[::1]:*"),
        max_bytes=10**6,
    ) == DATA  # fmt: skip


@pytest.mark.parametrize(
    "host",
    ["169.254.169.254", "[fe80::1]", "0.0.0.0", "[::]", "224.0.0.1",  # noqa: S104 - URL hosts
     "255.255.255.255", "[ff02::1]", "240.0.0.1", "[::ffff:169.254.169.254]"],
)  # fmt: skip
def test_link_local_unspecified_multicast_broadcast_are_refused_before_connecting(
    host: str,
) -> None:
    err = failure(lambda: fetch_bytes(f"http://{host}:80/x", policy=EVERYWHERE, max_bytes=10))
    print(f"{host}: {err.cause}")
    assert err.reason is FetchReason.NOT_ALLOWED


@pytest.mark.parametrize("host", ["192.168.1.20", "10.0.0.1", "172.16.0.1", "[fd00::99]"])
@pytest.mark.parametrize("port", [80, 22, 8123])
def test_a_lan_host_the_policy_does_not_name_is_refused(host: str, port: int) -> None:
    """Decided from the URL alone: nothing is resolved or connected (no traffic to a LAN)."""
    err = failure(lambda: fetch_bytes(f"http://{host}:{port}/x", policy=LOCAL, max_bytes=10))
    assert err.reason is FetchReason.NOT_ALLOWED
    assert "not allowed by test.hosts" in err.cause


def own_addresses() -> list[str]:
    """This machine's non-loopback addresses, as the routes to two documentation networks
    leave from them (a UDP connect: no packet is sent)."""
    found = []
    for family, probe in ((socket.AF_INET, "198.51.100.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                address = ipaddress.ip_address(sock.getsockname()[0].partition("%")[0])
        except OSError:
            continue
        if not address.is_loopback and not address.is_link_local:
            found.append(str(address))
    return found


def test_is_own_address() -> None:
    own = own_addresses()
    assert own, "this machine has no address but loopback"
    for text in [*own, "127.0.0.1", "127.0.0.2", "::1"]:
        assert is_own_address(ipaddress.ip_address(text)), text
    for text in ("198.51.100.7", "2001:db8::7", "203.0.113.9"):
        assert not is_own_address(ipaddress.ip_address(text)), text
    assert is_own_address(ipaddress.ip_address(f"::ffff:{next(a for a in own if '.' in a)}"))


def test_the_nodes_own_address_is_refused_unless_named_alone() -> None:
    own = next(a for a in own_addresses() if "." in a)
    server = Server(own)
    for _ in running(server):
        network = ipaddress.ip_network(f"{own}/24", strict=False)
        for broad in (EVERYWHERE, policy(f"{network}:*")):
            err = failure(lambda: fetch_bytes(server.url("/file"), policy=broad, max_bytes=10**6))  # noqa: B023
            assert err.reason is FetchReason.NOT_ALLOWED
            assert "an address of this node" in err.cause
        assert server.requests == []
        named = policy(f"{own}:{server.port}")
        assert fetch_bytes(server.url("/file"), policy=named, max_bytes=10**6) == DATA


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[list[str]]]:
    """A test resolver for names under `.example`: each lookup takes the next list of
    addresses (the last is kept); other names go to the system's resolver."""
    answers: dict[str, list[list[str]]] = {}
    system = socket.getaddrinfo

    def getaddrinfo(host: str, port: int, *args: object, **kwargs: object) -> Sequence[object]:
        if host not in answers:
            return system(host, port, *args, **kwargs)  # type: ignore[arg-type]
        queue = answers[host]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def test_only_the_allowed_addresses_of_a_name_are_connected_to(
    server: Server, resolver: dict[str, list[list[str]]]
) -> None:
    decoy = Listener("127.0.0.2", server.port)  # the same port on another loopback address
    try:
        resolver["media.example"] = [["127.0.0.2", "127.0.0.1"]]
        allowed = policy("media.example:*", "127.0.0.1:*")
        url = f"http://media.example:{server.port}/file"
        assert fetch_bytes(url, policy=allowed, max_bytes=10**6) == DATA
        assert decoy.connections() == 0
        resolver["media.example"] = [["127.0.0.2"]]
        err = failure(lambda: fetch_bytes(url, policy=allowed, max_bytes=10**6))
        assert err.reason is FetchReason.NOT_ALLOWED
        assert decoy.connections() == 0
    finally:
        decoy.close()


def test_a_name_rebound_to_loopback_after_a_redirect_is_refused(
    server: Server, resolver: dict[str, list[list[str]]]
) -> None:
    """DNS rebinding: the first lookup gives an allowed address, the next (the redirect's hop,
    a new connection) a loopback one; each connection's address is checked."""
    decoy = Listener("127.0.0.2", server.port)
    try:
        resolver["media.example"] = [["127.0.0.1"], ["127.0.0.2"]]
        target = urllib.parse.quote(f"http://media.example:{server.port}/file", safe="")
        url = f"http://media.example:{server.port}/redirect?to={target}"
        allowed = policy("media.example:*", "127.0.0.1:*")
        err = failure(lambda: fetch_bytes(url, policy=allowed, max_bytes=10**6))
        assert err.reason is FetchReason.NOT_ALLOWED
        assert [path for path, _ in server.requests] == [f"/redirect?to={target}"]
        assert decoy.connections() == 0
    finally:
        decoy.close()


def test_an_empty_policy_fetches_nothing(server: Server) -> None:
    err = failure(lambda: fetch_bytes(server.url("/file"), policy=EgressPolicy(), max_bytes=9))
    assert err.reason is FetchReason.NOT_ALLOWED
    assert "is empty" in err.cause
    assert server.requests == []
