"""Bounded HTTP(S) downloads: media files, OTA manifests, model files.

One GET (plus redirects), its body streamed to a sink in blocks. Where it may go is an egress
policy's (`egress.EgressPolicy`): the URL's host as written, then every address actually
connected to (the name is resolved once per connection, each address checked before it is
connected to, so DNS cannot rebind it; every redirect hop is checked again; the node's own
addresses are told by `is_own_address`). A URL with credentials is refused (they are never
sent); a path or query outside ASCII is percent-encoded. Bounded in every way a server can
abuse: size (a Content-Length over the cap is refused before the body, and the body is cut off
at the cap whatever the headers said), time (an overall deadline, and a stall timeout while no
byte arrives), redirects (to a URL the policy allows, never from https to http, at most N).
Every socket wait is at most POLL seconds, and between waits the cancel event, the deadline and
the stall clock are checked, so a cancel takes effect within POLL from the connection attempt
on: connecting, the TLS handshake, headers and body alike (name resolution, the system's, is the
one step that cannot be cut short). No retries (callers use tenacity), no proxies, no cookies,
no content decoding. Nothing a server sends reaches an error: not its status line's reason,
not a banner, not a header (a redirect's Location included). An error's text (`str`) is its
coarse public code (`Failure`) and the URL without credentials or query; `detail` says the
precise cause for a debug log (a refused connection, a timeout, the HTTP status).
"""

from __future__ import annotations

import errno
import http.client
import io
import ipaddress
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

from agent.core.egress import EgressPolicy, IPAddress, mapped, special_class
from agent.core.refusal import Refused

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
    """Why a fetch failed, precisely (for the program's decisions and the debug log)."""

    BAD_SCHEME = "bad_scheme"
    """Not an http or https URL."""
    BAD_URL = "bad_url"
    NOT_ALLOWED = "not_allowed"
    """The egress policy refuses the URL, an address it resolved to, or a redirect's target;
    or the URL carries credentials."""
    REDIRECT_REFUSED = "redirect_refused"
    """More redirects than allowed, or one without a usable Location."""
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


class Failure(StrEnum):
    """Why a fetch failed, as a publisher may learn it: coarse, so that a failure maps no port
    (refused, filtered and no route are all `unreachable`)."""

    REFUSED_BY_POLICY = "refused_by_policy"
    """The egress policy refused it (the URL, an address it resolved to, a redirect)."""
    BAD_URL = "bad_url"
    UNREACHABLE = "unreachable"
    """No HTTP answer: resolution, connection, TLS, not HTTP, or no answer in time."""
    HTTP_ERROR = "http_error"
    """An answer the fetch cannot use: a status other than 200/206, a bad range, redirects."""
    TOO_LARGE = "too_large"
    TIMEOUT = "timeout"
    """An answer whose body did not come in time."""
    INCOMPLETE = "incomplete"
    """An answer whose body ended early."""
    CANCELLED = "cancelled"


_FAILURES: Final = {
    FetchReason.BAD_SCHEME: Failure.BAD_URL,
    FetchReason.BAD_URL: Failure.BAD_URL,
    FetchReason.NOT_ALLOWED: Failure.REFUSED_BY_POLICY,
    FetchReason.REDIRECT_REFUSED: Failure.HTTP_ERROR,
    FetchReason.TOO_LARGE: Failure.TOO_LARGE,
    FetchReason.TIMEOUT: Failure.TIMEOUT,
    FetchReason.STALLED: Failure.TIMEOUT,
    FetchReason.CANCELLED: Failure.CANCELLED,
    FetchReason.HTTP_ERROR: Failure.HTTP_ERROR,
    FetchReason.RANGE_UNSUPPORTED: Failure.HTTP_ERROR,
    FetchReason.CONNECTION_FAILED: Failure.UNREACHABLE,
    FetchReason.TLS_ERROR: Failure.UNREACHABLE,
    FetchReason.BAD_RESPONSE: Failure.UNREACHABLE,
    FetchReason.INCOMPLETE: Failure.INCOMPLETE,
}


class FetchError(Refused[FetchReason]):
    """A fetch that failed: a refusal whose `detail` (also its `str`, `summary`) is safe to
    publish: the coarse code (`failure`), the HTTP status for `http_error`, and the URL without
    credentials or query. `cause`, the precise one, is for the debug log (it holds nothing a
    server sent, nor the URL's secrets)."""

    def __init__(
        self,
        reason: FetchReason,
        cause: str,
        status: int | None = None,
        *,
        url: str = "",
        answered: bool = True,
    ) -> None:
        self.reason = reason
        self.cause = cause
        self.status = status
        """The HTTP status, for `http_error`."""
        self.url = url
        """The URL asked for, redacted (`redact`)."""
        self.answered = answered
        """Whether the server had answered (a status line) when it failed."""
        super().__init__(reason, self.summary)

    @property
    def failure(self) -> Failure:
        """The coarse code: a timeout before any answer is `unreachable`."""
        if self.reason in {FetchReason.TIMEOUT, FetchReason.STALLED} and not self.answered:
            return Failure.UNREACHABLE
        return _FAILURES[self.reason]

    @property
    def summary(self) -> str:
        """`<code>[ <status>]: <redacted URL>`, safe to publish."""
        code = str(self.failure)
        if self.failure is Failure.HTTP_ERROR and self.status is not None:
            code += f" {self.status}"
        return f"{code}: {self.url}" if self.url else code

    def __str__(self) -> str:
        return self.summary


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
    policy: EgressPolicy,
    max_bytes: int,
    timeout: float = DEFAULT_TIMEOUT,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    cancel: threading.Event | None = None,
    start: int = 0,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> FetchResult:
    """GET `url`, where `policy` allows it, and hand its body to `sink`, block by block, at
    most `max_bytes` in all.

    `start` > 0 asks for the bytes from that offset on (HTTP Range) and requires a 206 answer
    starting there. A URL with credentials (`https://user:pass@host/`) is refused: nothing is
    sent. `ssl_context` defaults to the system's trusted certificates. Raises FetchError; what
    the sink raises goes through unchanged.
    """
    if max_bytes < 0 or start < 0 or max_redirects < 0:
        raise ValueError("max_bytes, start and max_redirects must not be negative")
    safe_url = redact(url)
    guard = _Guard(timeout, stall_timeout, cancel)
    try:
        target = _Target.parse(url, policy)
        return _fetch(
            target, sink, max_bytes, guard, start, max_redirects, headers, ssl_context, policy
        )
    except FetchError as err:
        detail = _scrub(err.cause, _secrets(url))
        raise FetchError(
            err.reason, detail, err.status, url=safe_url, answered=guard.answered
        ) from None


def fetch_bytes(
    url: str,
    *,
    policy: EgressPolicy,
    max_bytes: int,
    timeout: float = DEFAULT_TIMEOUT,
    stall_timeout: float = DEFAULT_STALL_TIMEOUT,
    cancel: threading.Event | None = None,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> bytes:
    """The body of `url` in memory (for small files: manifests, sounds). Raises FetchError.
    Gathered in a BytesIO, whose value is handed over without a copy: a join of the blocks
    would hold the body twice (measured: 32 MiB at the peak for 16 MiB, 16 with BytesIO)."""
    body = io.BytesIO()
    fetch(
        url,
        body.write,
        policy=policy,
        max_bytes=max_bytes,
        timeout=timeout,
        stall_timeout=stall_timeout,
        cancel=cancel,
        headers=headers,
        ssl_context=ssl_context,
    )
    return body.getvalue()


def redact(url: str) -> str:
    """The URL without its credentials and fragment, and its query (which may carry a token)
    as `?...`; a URL that cannot be read as `(invalid URL)`."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(invalid URL)"
    netloc = parts.netloc.rpartition("@")[2]
    query = "?..." if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")) + query


def is_own_address(address: IPAddress) -> bool:
    """Whether a connection to `address` would reach this machine: the route to it leaves from
    the address itself, or a socket may be bound to it (unless the system lets any address be
    bound: `ip_nonlocal_bind`). No packet is sent."""
    address = mapped(address)
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    text = str(address)
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((text, 9))  # UDP: chooses the route, sends nothing
            if mapped(ipaddress.ip_address(probe.getsockname()[0])) == address:
                return True
    except (OSError, ValueError):
        pass
    if _binds_any_address(address.version):
        return False
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((text, 0))
    except OSError:
        return False
    return True


def _binds_any_address(version: int) -> bool:
    """Whether the system lets a socket bind to an address it does not have."""
    try:
        return Path(f"/proc/sys/net/ipv{version}/ip_nonlocal_bind").read_text().strip() != "0"
    except OSError:
        return False


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
        self.answered = False
        """A status line came: later timeouts are the body's."""

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


_PATH_SAFE: Final = "/%!$&'()*+,;=:@"
"""Kept as they are in a path (RFC 3986 pchar and `/`, with escapes already made); anything
else, a non-ASCII letter included, is percent-encoded (as UTF-8)."""
_QUERY_SAFE: Final = _PATH_SAFE + "?"


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    host: str
    """As written (ASCII: an international name in its IDNA form), brackets removed."""
    port: int
    path: str
    """Path and query, percent-encoded, as sent in the request line."""

    @classmethod
    def parse(cls, url: str, policy: EgressPolicy) -> _Target:
        """The target of `url`, if `policy` allows its host and port as written."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as err:
            raise FetchError(FetchReason.BAD_URL, f"not a valid URL ({err})") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise FetchError(FetchReason.BAD_SCHEME, f"{scheme or 'no'} scheme: http or https only")
        if "@" in parts.netloc:
            raise FetchError(FetchReason.NOT_ALLOWED, "credentials in a URL are never sent")
        if not parts.hostname:
            raise FetchError(FetchReason.BAD_URL, "no host")
        try:
            host = parts.hostname.encode("idna").decode("ascii")
        except UnicodeError:
            raise FetchError(FetchReason.BAD_URL, "not a valid host name") from None
        port = port or _DEFAULT_PORTS[scheme]
        problem = policy.host_problem(host, port)
        if problem is not None:
            raise FetchError(FetchReason.NOT_ALLOWED, problem)
        path = urllib.parse.quote(parts.path or "/", safe=_PATH_SAFE)
        if parts.query:
            path += "?" + urllib.parse.quote(parts.query, safe=_QUERY_SAFE)
        return cls(scheme, host, port, path)

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
    policy: EgressPolicy,
) -> FetchResult:
    current = target
    for redirects in range(max_redirects + 1):
        connection = _Connection(current, guard, ssl_context, policy)
        response = None
        try:
            try:
                response = connection.get(current, start, headers)
            except FetchError as err:
                if redirects:  # the host came from a Location: keep it out of the detail
                    reason = f"redirect {redirects}: {err.reason}"
                    raise FetchError(err.reason, reason, err.status) from None
                raise
            guard.answered = True
            if response.status in _REDIRECTS:
                current = _redirect(current, response, redirects, max_redirects, policy)
                guard.answered = False  # the next hop has not answered yet
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
    current: _Target,
    response: http.client.HTTPResponse,
    redirects: int,
    max_redirects: int,
    policy: EgressPolicy,
) -> _Target:
    """The next hop: a URL the policy allows (its addresses are checked when connecting), never
    from https down to http. Nothing of the Location goes into an error."""
    location = response.getheader("Location")
    if not location:
        raise FetchError(FetchReason.REDIRECT_REFUSED, f"HTTP {response.status} without a Location")
    if redirects >= max_redirects:
        raise FetchError(FetchReason.REDIRECT_REFUSED, f"more than {max_redirects} redirects")
    try:
        absolute = urllib.parse.urljoin(current.url, location.strip())
        following = _Target.parse(absolute, policy)
    except (FetchError, ValueError) as err:
        why = "not allowed" if isinstance(err, FetchError) else "not a URL"
        what = err.reason if isinstance(err, FetchError) else FetchReason.BAD_URL
        raise FetchError(FetchReason.NOT_ALLOWED, f"a redirect to a URL {why} ({what})") from None
    if current.scheme == "https" and following.scheme != "https":
        raise FetchError(FetchReason.NOT_ALLOWED, "a redirect from https to http")
    return following


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
        raise FetchError(FetchReason.HTTP_ERROR, f"HTTP {status}", status)  # never its reason
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
        detail = f"asked for bytes from {start}, got a Content-Range that starts elsewhere"
        raise FetchError(FetchReason.RANGE_UNSUPPORTED, detail)
    return int(total) if total.isdigit() else None


class _Connection(http.client.HTTPConnection):
    """One HTTP/1.1 connection whose socket waits are sliced by the guard."""

    def __init__(
        self,
        target: _Target,
        guard: _Guard,
        context: ssl.SSLContext | None,
        policy: EgressPolicy,
    ) -> None:
        super().__init__(target.host, target.port)
        self.default_port = _DEFAULT_PORTS[target.scheme]  # for the Host header
        self._scheme = target.scheme
        self._guard = guard
        self._context = context
        self._policy = policy

    def connect(self) -> None:
        sock = _connect(self.host, self.port, self._guard, self._policy)
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


def _connect(host: str, port: int, guard: _Guard, policy: EgressPolicy) -> socket.socket:
    """A TCP connection, attempted address by address, waiting POLL at a time: the name is
    resolved once, and only addresses the policy allows are connected to."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise FetchError(FetchReason.CONNECTION_FAILED, f"cannot resolve {host}: {err}") from None
    problem: OSError | None = None
    refusal: str | None = None
    for family, kind, protocol, _, address in addresses:
        refused = _refusal(host, str(address[0]), port, policy)
        if refused is not None:
            refusal = refusal or refused
            continue
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
    if problem is None and refusal is not None:  # no address was allowed
        raise FetchError(FetchReason.NOT_ALLOWED, refusal)
    detail = f"cannot connect to port {port}: {_describe(problem) if problem else 'no address'}"
    raise FetchError(FetchReason.CONNECTION_FAILED, detail)


def _refusal(host: str, text: str, port: int, policy: EgressPolicy) -> str | None:
    """Why the policy refuses a resolved address, or None."""
    try:
        address = mapped(ipaddress.ip_address(text))
    except ValueError:
        return f"{host} resolved to something that is no IP address"
    own = special_class(address) is None and is_own_address(address)
    return policy.address_problem(host, address, port, own=own)


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
    """What went wrong, in the words of this machine's libraries, never the server's: an
    `http.client` error (which may quote a status line or header) is named by its type."""
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"certificate: {err.verify_message}"
    if isinstance(err, ssl.SSLError):
        return f"TLS: {err.reason or type(err).__name__}"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return type(err).__name__


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
