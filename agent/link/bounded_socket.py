"""A bound on what an MQTT server may send a session of the node: each packet's size is read from
its fixed header, and a packet above the session's maximum is refused before a byte of its body
is read.

paho reads a packet in three steps: its first byte, its Remaining Length (a variable byte
integer, one byte at a time), then the rest, as one growing buffer. Without a bound a server
that ignores the Maximum Packet Size the node told it (or any server, in MQTT 3.1.1, which has
none) makes paho hold whatever it announces. `BoundedClient` is paho's client with its socket
wrapped (`_create_socket`, where paho makes the TCP or TLS socket of each connection) in a
`BoundedSocket`, which follows the framing of what it hands paho: the first byte, the length's
bytes, then the body's byte count. When a length is complete and says the packet is larger than
the bound, it raises `PacketTooLargeError` (an OSError: paho ends the connection, which the
session treats as a lost one) and reports it once. That variable byte integer is the only MQTT
read here: everything else is paho's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import paho.mqtt.client as mqtt

if not callable(getattr(mqtt.Client, "_create_socket", None)):  # pragma: no cover - a new paho
    raise ImportError("this paho-mqtt has no Client._create_socket: the packet bound needs it")

_MAX_LENGTH_BYTES: Final = 4


class PacketTooLargeError(ConnectionError):
    """A server announced a packet above the session's maximum: the connection is closed."""


class BoundedSocket:
    """A socket (TCP or TLS) paho reads from, refusing a packet above `max_packet_bytes` from
    its fixed header. Everything but `recv` is the socket's own."""

    def __init__(self, sock: Any, max_packet_bytes: int, refused: Callable[[int], None]) -> None:
        self._sock = sock
        self._max = max_packet_bytes
        self._refused = refused
        self._body_left = 0
        self._in_length = False  # False: the next byte is a packet's first
        self._length = 0
        self._length_bytes = 0

    def recv(self, size: int) -> bytes:
        data: bytes = self._sock.recv(size)
        self._follow(data)
        return data

    def _follow(self, data: bytes) -> None:
        """Follow the framing over `data`; raise before handing over a length that is too large."""
        at, end = 0, len(data)
        while at < end:
            if self._body_left:
                taken = min(self._body_left, end - at)
                self._body_left -= taken
                at += taken
                continue
            if not self._in_length:  # the packet's type and flags
                self._in_length, self._length, self._length_bytes = True, 0, 0
                at += 1
                continue
            byte = data[at]
            at += 1
            self._length += (byte & 0x7F) << (7 * self._length_bytes)
            self._length_bytes += 1
            if byte & 0x80 and self._length_bytes < _MAX_LENGTH_BYTES:
                continue  # more bytes of the length follow (a fifth one: paho refuses it)
            self._in_length = False
            size = 1 + self._length_bytes + self._length
            if size > self._max:
                self._refused(size)
                raise PacketTooLargeError(
                    f"the server announced a packet of {size} bytes, over the {self._max} "
                    "allowed: refused unread, connection closed"
                )
            self._body_left = self._length

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class BoundedClient(mqtt.Client):
    """paho's client whose every connection refuses packets above `max_packet_bytes`
    (`refused` is told the announced size, on paho's thread, before the connection closes)."""

    def __init__(
        self, *args: Any, max_packet_bytes: int, refused: Callable[[int], None], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._max_packet_bytes = max_packet_bytes
        self._on_refused = refused

    def _create_socket(self) -> Any:
        return BoundedSocket(super()._create_socket(), self._max_packet_bytes, self._on_refused)
