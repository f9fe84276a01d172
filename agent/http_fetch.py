"""Bounded HTTP(S) downloads: media files, OTA manifests, model files.

One GET (plus same-origin redirects), its body streamed to a sink in blocks. Bounded in every
way a server can abuse: size (a Content-Length over the cap is refused before the body, and the
body is cut off at the cap whatever the headers said), time (an overall deadline, and a stall
timeout while no byte arrives), redirects (to the same scheme, host and port only, at most N).
Every socket wait is at most POLL seconds, and between waits the cancel event, the deadline and
the stall clock are checked, so a cancel takes effect within POLL from the connection attempt
on: connecting, the TLS handshake, headers and body alike (name resolution, the system's, is the
one step that cannot be cut short). No retries (callers use tenacity), no proxies, no cookies,
no content decoding. Errors carry a reason code and a detail that never shows the URL's
credentials or query. Allowed imports: stdlib.
"""

from __future__ import annotations

import base64
import errno
import http.client
import io
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

POLL: Final = 0.2
"""Longest single socket wait (seconds): how late a cancel, deadline or stall can be seen."""
DEFAULT_TIMEOUT: Final = 60.0
"""Overall deadline of a fetch, redirects included (seconds)."""
DEFAULT_STALL_TIMEOUT: Final = 15.0
"""Longest wait for the next byte (seconds)."""
DEFAULT_MAX_REDIRECTS: Final = 5
USER_AGENT: Final = "voice-agent"
_CHUNK: Final = 64 * 1024
"""Most bytes handed to the sink at a time."""
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


class FetchReason(StrEnum):
    """Why a fetch failed."""

    BAD_SCHEME = "bad_scheme"
    """Not an http or https URL."""
    BAD_URL = "bad_url"
    REDIRECT_REFUSED = "redirect_refused"
    """To another scheme, host or port, or more than the redirects allowed."""
    TOO_LARGE = "too_large"
    TIMEOUT = "timeout"
    """The overall deadline passed."""
    STALLED = "stalled"
    """No byte arrived for the stall timeout."""
    CANCELLED = "cancelled"
    HTTP_ERROR = "http_error"
    """An HTTP status other than 200, or 206 for a range (see `FetchError.status`)."""
    RANGE_UNSUPPORTED = "range_unsupported"
    """A range was asked for and the server sent something else."""
    CONNECTION_FAILED = "connection_failed"
    """Name resolution, connection, or the connection lost before the response."""
    TLS_ERROR = "tls_error"
    """The TLS handshake failed (e.g. a certificate that does not verify)."""
    BAD_RESPONSE = "bad_response"
    """Not valid HTTP."""
    INCOMPLETE = "incomplete"
    """The connection ended before the length the server announced."""


class FetchError(Exception):
    """A fetch that failed, with a reason code and a detail safe to log and publish."""

    def __init__(self, reason: FetchReason, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status
        """The HTTP status, for `http_error`."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A completed fetch."""

    url: str
    """The URL finally fetched (after redirects), without credentials or query."""
    status: int
    """200, or 206 for a range."""
    received: int
    """Body bytes handed to the sink."""
    start: int
    """Offset in the resource of the first byte received."""
    total: int | None
    """The whole resource's size, when the server said (Content-Length, or Content-Range)."""
    headers: Mapping[str, str]
    """Response headers, names in lower case (e.g. `content-type`, `etag`)."""


def fetch(
    url: str,
    sink: Callable[[bytes], object],
    *,
    max_bytes: int,
    timeout: float = DEFAULT_TIMEOUT,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    cancel: threading.Event | None = None,
    start: int = 0,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> FetchResult:
    """GET `url` and hand its body to `sink`, block by block, at most `max_bytes` in all.

    `start` > 0 asks for the bytes from that offset on (HTTP Range) and requires a 206 answer
    starting there. Credentials in the URL (`https://user:pass@host/`) are sent as Basic
    authentication, also after a redirect (always to the same origin). `ssl_context` defaults
    to the system's trusted certificates. Raises FetchError; what the sink raises goes through
    unchanged.
    """
    if max_bytes < 0 or start < 0 or max_redirects < 0:
        raise ValueError("max_bytes, start and max_redirects must not be negative")
    safe_url = redact(url)
    secrets = _secrets(url)
    guard = _Guard(timeout, stall_timeout, cancel)
    try:
        target = _Target.parse(url)
        return _fetch(target, sink, max_bytes, guard, start, max_redirects, headers, ssl_context)
    except FetchError as err:
        detail = _scrub(f"{safe_url}: {err.detail}", secrets)
        raise FetchError(err.reason, detail, err.status) from None


def fetch_bytes(
    url: str,
    *,
    max_bytes: int,
    timeout: float = DEFAULT_TIMEOUT,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    cancel: threading.Event | None = None,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> bytes:
    """The body of `url` in memory (for small files: manifests, sounds). Raises FetchError."""
    parts: list[bytes] = []
    fetch(
        url,
        parts.append,
        max_bytes=max_bytes,
        timeout=timeout,
        stall_timeout=stall_timeout,
        cancel=cancel,
        headers=headers,
        ssl_context=ssl_context,
    )
    return b"".join(parts)


def redact(url: str) -> str:
    """The URL without its credentials, and its query (which may carry a token) as `?...`."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(invalid URL)"
    netloc = parts.netloc.rpartition("@")[2]
    query = "?..." if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")) + query


# ---- internals ----------------------------------------------------------------------------


class _Guard:
    """The clocks and the cancel event of one fetch."""

    def __init__(
        self, timeout: float, stall_timeout: float, cancel: threading.Event | None
    ) -> None:
        now = time.monotonic()
        self._timeout, self._stall_timeout = timeout, stall_timeout
        self._deadline = now + timeout
        self._last_byte = now
        self._cancel = cancel

    def check(self) -> None:
        """Raise if the fetch is cancelled, late or stalled."""
        now = time.monotonic()
        if self._cancel is not None and self._cancel.is_set():
            raise FetchError(FetchReason.CANCELLED, "cancelled")
        if now >= self._deadline:
            raise FetchError(FetchReason.TIMEOUT, f"not done within {self._timeout:g} s")
        if now - self._last_byte >= self._stall_timeout:
            raise FetchError(FetchReason.STALLED, f"no data for {self._stall_timeout:g} s")

    def progress(self) -> None:
        """Some bytes arrived."""
        self._last_byte = time.monotonic()

    def wait(self) -> float:
        """How long the next socket wait may be (seconds)."""
        now = time.monotonic()
        stall_left = self._last_byte + self._stall_timeout - now
        return max(0.001, min(POLL, self._deadline - now, stall_left))


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str
    """Path and query, as sent in the request line."""
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> _Target:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as err:
            raise FetchError(FetchReason.BAD_URL, f"not a valid URL ({err})") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise FetchError(FetchReason.BAD_SCHEME, f"{scheme or 'no'} scheme: http or https only")
        if not parts.hostname:
            raise FetchError(FetchReason.BAD_URL, "no host")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        authorization = None
        if parts.username is not None or parts.password is not None:
            user = urllib.parse.unquote(parts.username or "")
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            authorization = f"Basic {token}"
        port = port or _DEFAULT_PORTS[scheme]
        return cls(scheme, parts.hostname, port, path, authorization)

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def _fetch(  # noqa: PLR0917 - the public function's arguments, checked
    target: _Target,
    sink: Callable[[bytes], object],
    max_bytes: int,
    guard: _Guard,
    start: int,
    max_redirects: int,
    headers: Mapping[str, str] | None,
    ssl_context: ssl.SSLContext | None,
) -> FetchResult:
    current = target
    for redirects in range(max_redirects + 1):
        connection = _Connection(current, guard, ssl_context)
        response = None
        try:
            response = connection.get(current, start, headers)
            if response.status in _REDIRECTS:
                current = _redirect(target, current, response, redirects, max_redirects)
                continue
            received = _check(response, start, max_bytes)
            received.stream(sink, max_bytes, guard)
            return FetchResult(
                redact(current.url),
                response.status,
                received.count,
                start,
                received.total,
                {name.lower(): value for name, value in response.getheaders()},
            )
        finally:
            if response is not None:
                response.close()
            connection.close()
    raise AssertionError("unreachable: the last redirect is refused")  # pragma: no cover


def _redirect(
    origin: _Target,
    current: _Target,
    response: http.client.HTTPResponse,
    redirects: int,
    max_redirects: int,
) -> _Target:
    location = response.getheader("Location")
    if not location:
        raise FetchError(FetchReason.BAD_RESPONSE, f"HTTP {response.status} without a Location")
    absolute = urllib.parse.urljoin(current.url, location.strip())
    try:
        following = _Target.parse(absolute)
    except FetchError as err:
        detail = f"redirect to {redact(absolute)}: {err.detail}"
        raise FetchError(FetchReason.REDIRECT_REFUSED, detail) from None
    if following.origin != origin.origin:
        detail = f"redirect to another scheme, host or port: {redact(absolute)}"
        raise FetchError(FetchReason.REDIRECT_REFUSED, detail)
    if redirects >= max_redirects:
        detail = f"more than {max_redirects} redirects (the last to {redact(absolute)})"
        raise FetchError(FetchReason.REDIRECT_REFUSED, detail)
    return replace(following, authorization=origin.authorization)


@dataclass(slots=True)
class _Body:
    response: http.client.HTTPResponse
    length: int | None
    """Content-Length: the body ends there, or it is incomplete."""
    total: int | None
    count: int = 0

    def stream(self, sink: Callable[[bytes], object], max_bytes: int, guard: _Guard) -> None:
        while True:
            guard.check()  # also when bytes keep coming: the deadline and cancel still hold
            try:
                chunk = self.response.read1(min(_CHUNK, max_bytes - self.count + 1))
            except http.client.IncompleteRead as err:
                detail = f"closed after {self.count + len(err.partial)} bytes of {self.length}"
                raise FetchError(FetchReason.INCOMPLETE, detail) from None
            except http.client.HTTPException as err:
                raise FetchError(FetchReason.BAD_RESPONSE, _describe(err)) from None
            except OSError as err:
                detail = f"connection lost after {self.count} bytes: {_describe(err)}"
                raise FetchError(FetchReason.INCOMPLETE, detail) from None
            if not chunk:
                if self.length is not None and self.count < self.length:
                    detail = f"closed after {self.count} bytes of {self.length}"
                    raise FetchError(FetchReason.INCOMPLETE, detail)
                return
            if self.count + len(chunk) > max_bytes:  # what fits is handed over first
                room = max_bytes - self.count
                if room:
                    sink(chunk[:room])
                    self.count += room
                raise FetchError(FetchReason.TOO_LARGE, f"more than {max_bytes} bytes")
            sink(chunk)
            self.count += len(chunk)


def _check(response: http.client.HTTPResponse, start: int, max_bytes: int) -> _Body:
    """The response's status and length against what was asked: its body, ready to read."""
    status = response.status
    if status not in {200, 206}:
        detail = f"HTTP {status} {response.reason}".strip()
        raise FetchError(FetchReason.HTTP_ERROR, detail, status)
    length = response.length  # Content-Length, None when chunked or delimited by the close
    total = length
    if start or status == 206:
        if status != 206:
            raise FetchError(
                FetchReason.RANGE_UNSUPPORTED, f"asked for bytes from {start}, got all (200)"
            )
        total = _content_range_total(response.getheader("Content-Range", ""), start)
    if length is not None and length > max_bytes:
        raise FetchError(FetchReason.TOO_LARGE, f"{length} bytes, at most {max_bytes} allowed")
    return _Body(response, length, total)


def _content_range_total(value: str, start: int) -> int | None:
    """The total of `bytes START-END/TOTAL` (None for `*`); refused unless it starts at
    `start`."""
    unit, _, spec = value.strip().partition(" ")
    first, _, rest = spec.partition("-")
    _, _, total = rest.partition("/")
    if unit != "bytes" or not first.isdigit() or int(first) != start:
        detail = f"asked for bytes from {start}, got Content-Range {value[:80]!r}"
        raise FetchError(FetchReason.RANGE_UNSUPPORTED, detail)
    return int(total) if total.isdigit() else None


class _Connection(http.client.HTTPConnection):
    """One HTTP/1.1 connection whose socket waits are sliced by the guard."""

    def __init__(self, target: _Target, guard: _Guard, context: ssl.SSLContext | None) -> None:
        super().__init__(target.host, target.port)
        self.default_port = _DEFAULT_PORTS[target.scheme]  # for the Host header
        self._scheme = target.scheme
        self._guard = guard
        self._context = context

    def connect(self) -> None:
        sock = _connect(self.host, self.port, self._guard)
        try:
            if self._scheme == "https":
                sock = _handshake(sock, self.host, self._context, self._guard)
        except BaseException:
            sock.close()
            raise
        self.sock = cast(socket.socket, _GuardedSocket(sock, self._guard))

    def get(
        self, target: _Target, start: int, headers: Mapping[str, str] | None
    ) -> http.client.HTTPResponse:
        """Send the request, read the status and headers."""
        try:
            self.putrequest("GET", target.path)  # Accept-Encoding: identity (no decoding)
            self.putheader("User-Agent", USER_AGENT)
            if start:
                self.putheader("Range", f"bytes={start}-")
            if target.authorization:
                self.putheader("Authorization", target.authorization)
            for name, value in (headers or {}).items():
                self.putheader(name, value)
            self.endheaders()
            return self.getresponse()
        except http.client.InvalidURL as err:
            raise FetchError(FetchReason.BAD_URL, _describe(err)) from None
        except (http.client.RemoteDisconnected, ConnectionError) as err:
            detail = f"connection lost before the response: {_describe(err)}"
            raise FetchError(FetchReason.CONNECTION_FAILED, detail) from None
        except http.client.HTTPException as err:
            raise FetchError(FetchReason.BAD_RESPONSE, _describe(err)) from None
        except OSError as err:
            raise FetchError(FetchReason.CONNECTION_FAILED, _describe(err)) from None


class _GuardedSocket:
    """What http.client sees as its socket: reads wait at most POLL at a time, checking the
    guard in between (a timed-out `socket.makefile` stream could not be read again). Like a
    socket, it really closes once its reader is closed too (a response that reads until the
    server closes outlives its connection object)."""

    def __init__(self, sock: socket.socket, guard: _Guard) -> None:
        self.sock = sock
        self.guard = guard
        self._readers = 0
        self._closed = False

    def sendall(self, data: bytes) -> None:
        self.guard.check()
        self.sock.settimeout(max(POLL, self.guard.wait()))  # a request fits the send buffer
        try:
            self.sock.sendall(data)
        except TimeoutError:
            self.guard.check()
            raise FetchError(FetchReason.STALLED, "the server does not read the request") from None

    def makefile(self, mode: str, *_args: object, **_kwargs: object) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"unsupported mode {mode!r}")
        self._readers += 1
        return io.BufferedReader(_GuardedReader(self), _CHUNK)

    def release(self) -> None:
        """A reader was closed."""
        self._readers -= 1
        if self._closed and not self._readers:
            self.sock.close()

    def close(self) -> None:
        self._closed = True
        if not self._readers:
            self.sock.close()


class _GuardedReader(io.RawIOBase):
    def __init__(self, owner: _GuardedSocket) -> None:
        super().__init__()
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        sock, guard = self._owner.sock, self._owner.guard
        while True:
            guard.check()
            sock.settimeout(guard.wait())
            try:
                count = sock.recv_into(buffer)
            except TimeoutError:
                continue
            if count:
                guard.progress()
            return count

    def close(self) -> None:
        if not self.closed:
            self._owner.release()
        super().close()


def _connect(host: str, port: int, guard: _Guard) -> socket.socket:
    """A TCP connection, attempted address by address, waiting POLL at a time."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise FetchError(FetchReason.CONNECTION_FAILED, f"cannot resolve {host}: {err}") from None
    problem: OSError | None = None
    for family, kind, protocol, _, address in addresses:
        sock = socket.socket(family, kind, protocol)
        try:
            _connect_one(sock, address, guard)
        except OSError as err:
            sock.close()
            problem = err
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    detail = f"cannot connect to port {port}: {_describe(problem) if problem else 'no address'}"
    raise FetchError(FetchReason.CONNECTION_FAILED, detail)


def _connect_one(sock: socket.socket, address: tuple[object, ...], guard: _Guard) -> None:
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code not in {0, errno.EINPROGRESS, errno.EAGAIN}:
        raise OSError(code, os.strerror(code))
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    while not poller.poll(guard.wait() * 1000):
        guard.check()
    guard.check()
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise OSError(code, os.strerror(code))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    guard.progress()


def _handshake(
    sock: socket.socket, host: str, context: ssl.SSLContext | None, guard: _Guard
) -> socket.socket:
    context = context or ssl.create_default_context()
    try:
        secure = context.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    except (ssl.SSLError, ValueError) as err:
        raise FetchError(FetchReason.TLS_ERROR, _describe(err)) from None
    try:
        while True:
            guard.check()
            secure.settimeout(guard.wait())
            try:
                secure.do_handshake()
            except TimeoutError:
                continue
            guard.progress()
            return secure
    except ssl.SSLError as err:
        secure.close()
        raise FetchError(FetchReason.TLS_ERROR, _describe(err)) from None
    except BaseException:
        secure.close()
        raise


def _describe(err: BaseException) -> str:
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"certificate: {err.verify_message}"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return (str(err) or type(err).__name__)[:200]


def _secrets(url: str) -> list[str]:
    """The URL's user name and password, raw and decoded, to keep out of any message."""
    try:
        parts = urllib.parse.urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
    except ValueError:
        return []
    found = []
    for piece in userinfo.split(":", 1) if userinfo else []:
        found += [piece, urllib.parse.unquote(piece)]
    return sorted({piece for piece in found if len(piece) >= 3}, key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
