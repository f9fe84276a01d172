"""A bound on what an MQTT server may send a session of the node: each packet's size is read from
its fixed header, and a packet above the session's maximum never reaches paho whole.

paho reads a packet in three steps: its first byte, its Remaining Length (a variable byte
integer, one byte at a time), then the rest, as one growing buffer. Without a bound a server
that ignores the Maximum Packet Size the node told it (or any server, in MQTT 3.1.1, which has
none) makes paho hold whatever it announces. `BoundedClient` is paho's client with its socket
wrapped (`_create_socket`, where paho makes the TCP or TLS socket of each connection) in a
`BoundedSocket`, which reads each packet's fixed header before paho sees a byte of it. A packet
within the bound passes as it came. Above it:

- in MQTT 5, where the server was told the maximum and sending more is a protocol error, and for
  any packet other than a PUBLISH: `PacketTooLargeError` (an OSError: paho ends the connection,
  which the session treats as a lost one), reported once, before a byte of the body is read;
- a PUBLISH in MQTT 3.1.1 (whose server was told nothing, and whose persistent session would
  send the same message again after every reconnect): paho gets the packet without its payload
  (its topic and packet id, read as the packet's first bytes, under a Remaining Length that says
  so), the payload is read and thrown away as it comes, never held, and the session is told
  (`cut`: topic, packet id, size) so that it answers the message as the too large one it is and
  acknowledges it. The connection stays.

With a `gate` (a question: may another packet be read now?), the next packet is not read while
it says no: the session's consumer has no room, and the broker holds what it sends meanwhile in
the TCP connection and in its own queue (backpressure) instead of the consumer refusing it. A
packet begun is always read to its end; paho is told that nothing is there yet
(BlockingIOError), after a short pause so that its loop does not spin on a socket that stays
readable, and goes on writing (acknowledgements, pings) meanwhile.

Nothing else of MQTT is read here: everything else is paho's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import paho.mqtt.client as mqtt

if not callable(getattr(mqtt.Client, "_create_socket", None)):  # pragma: no cover - a new paho
    raise ImportError("this paho-mqtt has no Client._create_socket: the packet bound needs it")

_MAX_LENGTH_BYTES: Final = 4
_PUBLISH: Final = 3
_CHUNK: Final = 65536
GATE_PAUSE: Final = 0.02
"""Seconds paho's thread waits on a closed gate before it is told that nothing is there."""

Refused = Callable[[int], None]
"""Told the announced size of a packet refused (the connection then closes)."""
Cut = Callable[[str, int, int], None]
"""Told the topic, packet id (0 at QoS 0) and announced size of a PUBLISH whose payload was
thrown away, before paho hands the message on."""
Gate = Callable[[], bool]
"""Asked on paho's thread before each packet: True when the next one may be read now."""


class PacketTooLargeError(ConnectionError):
    """A server announced a packet above the session's maximum: the connection is closed."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class BoundedSocket:
    """A socket (TCP or TLS) paho reads from, holding packets above `max_packet_bytes` off
    (see the module). Everything but `recv` and `pending` is the socket's own."""

    def __init__(
        self,
        sock: Any,
        max_packet_bytes: int,
        refused: Refused,
        cut: Cut | None,
        gate: Gate | None = None,
    ) -> None:
        self._sock = sock
        self._max = max_packet_bytes
        self._refused = refused
        self._cut = cut
        self._gate = gate
        self._ready = bytearray()
        """Bytes for paho."""
        self._header = bytearray()
        """The fixed header being read (first byte, then the length's bytes)."""
        self._variable = bytearray()
        """The topic and packet id of a PUBLISH being cut."""
        self._variable_size = 0
        self._announced = 0
        self._body_left = 0
        """Bytes of a packet's body to pass to paho as they come."""
        self._discard = 0
        """Bytes of a cut packet's payload to read and throw away."""

    def recv(self, size: int) -> bytes:
        while not self._ready:
            if self._closed_gate():
                raise BlockingIOError("the consumer has no room: the next packet waits")
            data = self._advance()
            if not data:
                return b""  # the server closed the connection
        given = bytes(self._ready[:size])
        del self._ready[:size]
        return given

    def pending(self) -> int:
        """Bytes readable without waiting (paho skips its select() while there are some)."""
        if self._between_packets() and self._gate is not None and not self._gate():
            return 0  # TLS's buffered bytes wait with the rest
        inner = getattr(self._sock, "pending", None)
        return len(self._ready) + (inner() if inner is not None else 0)

    def _between_packets(self) -> bool:
        return not (
            self._ready or self._header or self._body_left or self._variable_size or self._discard
        )

    def _closed_gate(self) -> bool:
        """Between two packets, with a gate that says no now and still after a short pause."""
        if self._gate is None or not self._between_packets() or self._gate():
            return False
        time.sleep(GATE_PAUSE)
        return not self._gate()

    def _read(self, size: int) -> bytes:
        data: bytes = self._sock.recv(size)  # BlockingIOError, SSLWantReadError: paho's to handle
        return data

    def _advance(self) -> bytes:
        """Read what comes next from the socket (raising when nothing is there); b"" at its
        end. Whatever is for paho goes to `_ready`."""
        if self._discard:
            data = self._read(min(self._discard, _CHUNK))
            self._discard -= len(data)
            return data
        if self._body_left:
            data = self._read(min(self._body_left, _CHUNK))
            self._body_left -= len(data)
            self._ready += data
            return data
        if self._variable_size:
            return self._read_variable_header()
        data = self._read(1)
        if data:
            self._header += data
            self._header_read()
        return data

    def _header_read(self) -> None:
        """A byte of a fixed header was read: when the length is complete, judge the size."""
        length_bytes = self._header[1:]
        if not length_bytes or (length_bytes[-1] & 0x80 and len(length_bytes) < _MAX_LENGTH_BYTES):
            return  # more of the length follows (a fifth byte: paho refuses the packet)
        length = sum((b & 0x7F) << (7 * i) for i, b in enumerate(length_bytes))
        size = 1 + len(length_bytes) + length
        if size <= self._max:
            self._ready += self._header
            self._header.clear()
            self._body_left = length
            return
        if self._cut is None or self._header[0] >> 4 != _PUBLISH:
            self._refused(size)
            raise PacketTooLargeError(
                f"the server announced a packet of {size} bytes, over the {self._max} allowed: "
                "refused unread, connection closed"
            )
        self._announced, self._variable_size = length, 2  # the topic's length comes first
        self._variable.clear()

    def _read_variable_header(self) -> bytes:
        """Read a cut PUBLISH's topic and packet id; once whole, hand paho the packet without
        its payload and throw the payload away."""
        data = self._read(self._variable_size - len(self._variable))
        self._variable += data
        if len(self._variable) == 2:  # the topic's length: the topic and the packet id follow
            qos = (self._header[0] >> 1) & 0x03
            self._variable_size = 2 + int.from_bytes(self._variable, "big") + (2 if qos else 0)
            if self._variable_size > self._announced:  # a topic longer than its packet
                self._refused(len(self._header) + self._announced)
                raise PacketTooLargeError("a PUBLISH whose topic is longer than the packet")
        if data and len(self._variable) >= self._variable_size:
            first, variable = self._header[0], bytes(self._variable)
            size = len(self._header) + self._announced
            self._discard = max(0, self._announced - len(variable))
            self._header.clear()
            self._variable_size = 0
            qos = (first >> 1) & 0x03
            topic = variable[2 : len(variable) - (2 if qos else 0)]
            mid = int.from_bytes(variable[-2:], "big") if qos else 0
            assert self._cut is not None  # noqa: S101 - only cut when there is someone to tell
            self._cut(topic.decode("utf-8", "replace"), mid, size)
            self._ready += bytes([first]) + _varint(len(variable)) + variable
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class BoundedClient(mqtt.Client):
    """paho's client whose every connection holds packets above `max_packet_bytes` off:
    refused (`refused`, then the connection closes) or, with `cut`, a PUBLISH handed over
    without its payload; with `gate`, the next packet read only once it says so (see the
    module). All three are called on paho's thread."""

    def __init__(
        self,
        *args: Any,
        max_packet_bytes: int,
        refused: Refused,
        cut: Cut | None = None,
        gate: Gate | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._max_packet_bytes = max_packet_bytes
        self._on_refused = refused
        self._on_cut = cut
        self._gate = gate

    def _create_socket(self) -> Any:
        return BoundedSocket(
            super()._create_socket(),
            self._max_packet_bytes,
            self._on_refused,
            self._on_cut,
            self._gate,
        )
