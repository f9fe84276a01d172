"""The MQTT link's delivery bookkeeping: our QoS 1 publishes until the broker acknowledges them
(handed to a new client, in order, when the server or the version changes), the meeting of our
ids with the current client's packet ids (the acknowledgement may come before the publisher
noted its id: each side finds the other's with one setdefault), and the QoS 1 messages received
on the current connection, not acknowledged yet.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.core.messages import Delivery

_ACKED: Final = -1
"""In the meeting: the broker acknowledged this packet id before its publisher noted its id."""


class Publishes:
    """Ids of our publishes, their acknowledgements, and the current connection's deliveries.

    Called holding the link's lock, but for `on_publish` (paho's callback, with paho's own lock
    held, which a publisher holding the link's lock waits for) and `received` (one dict
    operation on the network thread)."""

    def __init__(self) -> None:
        self.acknowledged: deque[int] = deque()
        """Ids of our publishes the broker acknowledged (filled by the network thread)."""
        self._last_id = 0
        self._outgoing: dict[int, tuple[str, bytes | str, bool]] = {}
        """Our QoS 1 publishes the broker has not acknowledged, by the id `publish` returned."""
        self._meeting: dict[int, int] = {}
        """The current client's packet ids of our publishes: our id, or _ACKED when the
        acknowledgement came first."""
        self._deliveries: dict[int, Delivery] = {}
        """QoS 1 messages of the current connection not acknowledged yet, by packet id."""

    def next_id(self) -> int:
        """Our id for the next publish."""
        self._last_id += 1
        return self._last_id

    def sent(self, ours: int, mid: int, message: tuple[str, bytes | str, bool]) -> None:
        """Our publish `ours` (topic, payload, retain) went to the client as packet `mid`: kept
        until the broker acknowledges it."""
        self._outgoing[ours] = message
        self.meet(mid, ours)

    def meet(self, mid: int, ours: int) -> None:
        """Note our id of a publish by its packet id (0: the link's own, not kept); if its
        acknowledgement came first, it is acknowledged now."""
        if self._meeting.setdefault(mid, ours) == _ACKED:
            del self._meeting[mid]
            self._acknowledged(ours)

    def on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        """paho's callback: the broker acknowledged packet `mid` of the current client."""
        # Called with paho's message lock held: no lock of ours here (a publisher holds ours
        # while it waits for paho's). One setdefault meets the publisher's note of its id.
        meeting = self._meeting
        ours = meeting.setdefault(mid, _ACKED)
        if ours != _ACKED:
            meeting.pop(mid, None)
            self._acknowledged(ours)

    def hand_over(self, client: mqtt.Client) -> None:
        """A new client: it gets our unacknowledged publishes, in order (new packet ids)."""
        self._meeting = {}
        for ours, (topic, payload, retain) in self._outgoing.items():
            info = client.publish(topic, payload, qos=1, retain=retain)
            self.meet(info.mid, ours)

    def received(self, delivery: Delivery) -> None:
        """A QoS 1 message came on the current connection (network thread)."""
        self._deliveries[delivery.mid] = delivery  # one dict operation: atomic

    def take(self, delivery: Delivery) -> bool:
        """Whether this delivery is of the current connection (and not acknowledged yet): it
        is forgotten, to be acknowledged now."""
        current = self._deliveries.get(delivery.mid) == delivery
        if current:
            del self._deliveries[delivery.mid]
        return current

    def new_connection(self) -> None:
        """Packet ids of earlier connections mean nothing on this one."""
        self._deliveries = {}

    def _acknowledged(self, ours: int) -> None:
        if ours:  # 0: the link's own publish (online, offline)
            self._outgoing.pop(ours, None)
            self.acknowledged.append(ours)  # deque.append is atomic: no lock, no blocking
