"""The MQTT link's side of the bounded socket (`bounded_socket`): a packet a server announced
over `mqtt.max_packet_bytes` (refused before its body is read: the connection ends), and, on
MQTT 3.1.1, a PUBLISH over the bound that comes without its payload (thrown away unread): noted
by topic and packet id on paho's thread, then acknowledged on the connection it came by and
dropped when paho hands it on, so that a persistent session does not send it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import paho.mqtt.client as mqtt

_LOGGER = logging.getLogger("agent.link.mqtt.link")  # the link's log, as before its split


class Oversize:
    """Packets over the bound, refused or cut (paho's network thread only)."""

    def __init__(
        self, max_bytes: int, server: Callable[[], str], note: Callable[[str], None]
    ) -> None:
        """`server`: the server in use, for the log; `note`: told the link's last error."""
        self._max_bytes = max_bytes
        self._server = server
        self._note = note
        self._cut: dict[tuple[str, int], int] = {}
        """MQTT 3.1.1 PUBLISHes over the bound whose payload was thrown away, by topic and
        packet id, until paho hands them on."""

    def refused(self, size: int) -> None:
        """On paho's thread: a server announced a packet above the bound (the connection ends
        before its body is read)."""
        server = self._server()
        self._note(f"{server} sent a packet over mqtt.max_packet_bytes")
        _LOGGER.warning(
            "%s announced a packet of %d bytes, over mqtt.max_packet_bytes (%d): refused "
            "before its body was read, connection closed",
            server,
            size,
            self._max_bytes,
        )

    def cut(self, topic: str, mid: int, size: int) -> None:
        """On paho's thread (MQTT 3.1.1): a PUBLISH over the bound comes without its payload,
        which was thrown away unread; it is acknowledged and dropped when paho hands it on."""
        self._cut[(topic, mid)] = size

    def dropped(self, client: mqtt.Client, message: mqtt.MQTTMessage) -> bool:
        """Whether paho hands on a message that was cut: then acknowledged and dropped."""
        cut = self._cut.pop((message.topic, message.mid if message.qos else 0), None)
        if cut is None:
            return False
        _LOGGER.warning(
            "A message of %d bytes on %s is over mqtt.max_packet_bytes (%d): its payload "
            "was thrown away unread; acknowledged and dropped",
            cut,
            message.topic,
            self._max_bytes,
        )
        if message.qos:
            client.ack(message.mid, message.qos)  # on the connection it came by
        return True
