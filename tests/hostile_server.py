"""A hostile MQTT server for tests: a TCP server that speaks just enough MQTT to be taken for a
broker (it reads CONNECT and answers CONNACK, for MQTT 5 and 3.1.1), then does what its script
says: announce a huge packet, send garbage, withhold acknowledgements, command the node. It is
the attacker of the threat model's "hostile or compromised server in the ring"
(docs/security.md), not a stand-in for the node's own side: everything of the node under test
is real (paho, its sockets, the agent).

Every CONNECT it reads is recorded (client id, protocol level, user name and password as sent),
so a test sees what the node gave away.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = (
    1,
    2,
    3,
    4,
    8,
    9,
    12,
    13,
    14,
)
_MAX_READ: Final = 1 << 20
"""The most the server reads of one packet from the node (it needs no more)."""


def varint(value: int) -> bytes:
    """MQTT's variable byte integer (any value: the server may lie past 268,435,455)."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def packet(kind: int, body: bytes, flags: int = 0) -> bytes:
    return bytes([kind << 4 | flags]) + varint(len(body)) + body


def utf8(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("!H", len(data)) + data


def publish(topic: str, payload: bytes, *, qos: int = 0, mid: int = 1, v5: bool = False) -> bytes:
    """A PUBLISH to the node (QoS 0 or 1)."""
    body = utf8(topic) + (struct.pack("!H", mid) if qos else b"") + (b"\x00" if v5 else b"")
    return packet(PUBLISH, body + payload, qos << 1)


@dataclass
class Connect:
    """What a client sent in its CONNECT."""

    client_id: str
    level: int
    """4: MQTT 3.1.1; 5: MQTT 5."""
    username: str | None
    password: bytes | None


@dataclass
class Connection:
    """One accepted connection, for the script: reading and writing raw bytes."""

    sock: socket.socket
    connect: Connect
    server: HostileServer

    @property
    def v5(self) -> bool:
        return self.connect.level == 5

    def send(self, data: bytes) -> bool:
        """Write bytes; False once the node has closed the connection."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def read_packet(self, timeout: float = 30.0) -> tuple[int, bytes] | None:
        """The next packet from the node (type, body), or None when it closed or went quiet."""
        self.sock.settimeout(timeout)
        try:
            return _read_packet(self.sock)
        except (OSError, ValueError):
            return None

    def ack_subscriptions(self) -> None:
        """Answer the node's SUBSCRIBE (granting each filter at QoS 1); PUBLISHes met on the
        way are acknowledged (QoS 1) and kept in `server.published`."""
        while (got := self.read_packet()) is not None:
            kind, body = got
            if kind == SUBSCRIBE:
                mid = body[:2]
                count = _filters(body, v5=self.v5)
                props = b"\x00" if self.v5 else b""
                self.send(packet(SUBACK, mid + props + b"\x01" * count))
                return
            self.note(kind, body)

    def note(self, kind: int, body: bytes) -> None:
        if kind == PUBLISH:
            self.server.published.append(body)

    def serve(self) -> None:
        """Answer pings and keep what is published, until the node closes."""
        while (got := self.read_packet(timeout=120)) is not None:
            kind, body = got
            if kind == PINGREQ:
                self.send(packet(PINGRESP, b""))
            self.note(kind, body)


Script = Callable[[Connection], None]
"""What the server does after its CONNACK; returning closes the connection."""


@dataclass
class HostileServer:
    """A TCP server on 127.0.0.1 that answers CONNECT with CONNACK (`refuse`: a refusal for
    the clients it names), then runs `script` per connection on its own thread."""

    script: Script
    refuse: Callable[[Connect], bool] = lambda _connect: False
    connects: list[Connect] = field(default_factory=list)
    published: list[bytes] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.host, self.port = "127.0.0.1", self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="hostile-server", daemon=True)
        self._thread.start()

    @property
    def entry(self) -> dict[str, object]:
        """Its `mqtt.hosts` entry."""
        return {"host": self.host, "port": self.port}

    @property
    def entry_address(self) -> str:
        """host:port, as the node names it."""
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self._open.append(sock)
            threading.Thread(target=self._handle, args=(sock,), daemon=True).start()

    def _handle(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(30)
            kind, body = _read_packet(sock)
            if kind != CONNECT:
                return
            connect = _parse_connect(body)
            self.connects.append(connect)
            code = 0x87 if self.refuse(connect) else 0  # "Not authorized" (3.1.1: 5)
            if connect.level == 5:
                sock.sendall(packet(CONNACK, bytes([0, code, 0])))
            else:
                sock.sendall(packet(CONNACK, bytes([0, 5 if code else 0])))
            if not code:
                self.script(Connection(sock, connect, self))
        except (OSError, ValueError) as err:
            if not self._stopping.is_set() and not isinstance(err, ConnectionError | TimeoutError):
                self.errors.append(err)
        finally:
            with contextlib.suppress(OSError):
                sock.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def _read_varint(sock: socket.socket) -> int:
    value = 0
    for shift in range(0, 28, 7):
        byte = _read_exactly(sock, 1)[0]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
    raise ValueError("malformed length")


def _read_packet(sock: socket.socket) -> tuple[int, bytes]:
    first = _read_exactly(sock, 1)[0]
    length = _read_varint(sock)
    if length > _MAX_READ:
        raise ValueError("too large")
    return first >> 4, _read_exactly(sock, length)


def _string(body: bytes, at: int) -> tuple[bytes, int]:
    (size,) = struct.unpack_from("!H", body, at)
    return body[at + 2 : at + 2 + size], at + 2 + size


def _skip_varint(body: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = body[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _filters(body: bytes, *, v5: bool) -> int:
    """How many topic filters a SUBSCRIBE body holds."""
    at = 2
    if v5:
        size, at = _skip_varint(body, at)
        at += size
    count = 0
    while at < len(body):
        _, at = _string(body, at)
        at += 1  # its options
        count += 1
    return count


def _parse_connect(body: bytes) -> Connect:
    _, at = _string(body, 0)  # "MQTT"
    level, flags = body[at], body[at + 1]
    at += 4  # level, flags, keepalive
    if level == 5:
        size, at = _skip_varint(body, at)
        at += size
    client_id, at = _string(body, at)
    if flags & 0x04:  # a Will
        if level == 5:
            size, at = _skip_varint(body, at)
            at += size
        _, at = _string(body, at)
        _, at = _string(body, at)
    username = password = None
    if flags & 0x80:
        name, at = _string(body, at)
        username = name.decode(errors="replace")
    if flags & 0x40:
        password, at = _string(body, at)
    return Connect(client_id.decode(errors="replace"), level, username, password)
