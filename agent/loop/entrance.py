"""The way into the engine's loop: each edge's input put on the one inbox, on the edge's own
thread and never blocking. An alarm-class request goes to the urgent lane, anything else into
its source's budget; what finds no room is answered `queue_full` (the link acknowledges it at
once, never left to come back). One place for the rule, whichever edge the input came from:
an MQTT message (`message_handler`, on paho's thread), Wyoming's announce target (`announced`),
the Sparkplug session (`sparkplug`), the link coming up (`connected`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from agent.core.messages import Delivery, SpeakReceived, SpeakRequest
from agent.loop.inbox import Inbox
from agent.protocol.inputs import (
    Connected,
    LoopInput,
    RoutedEvent,
    SparkplugCommand,
    SparkplugConnected,
    SparkplugHostState,
    SparkplugLost,
)
from agent.protocol.lanes import in_alarm_lane
from agent.protocol.rooms import SPARKPLUG, WYOMING, is_barrier
from agent.protocol.routes import RouteTable, overflowed, urgency

V = TypeVar("V")

MessageHandler = Callable[[str, bytes, Delivery], bool]
"""What the MQTT link calls for a message (topic, payload, delivery): True when it was taken
(acknowledged once handled), False when it is answered already (the link acknowledges it)."""


class Entrance(Generic[V]):
    """The edges' way into one loop's inbox."""

    def __init__(
        self,
        inbox: Inbox[LoopInput[V]],
        table: RouteTable,
        new_id: Callable[[], str],
        *,
        alarms_elsewhere: bool,
    ) -> None:
        self._inbox = inbox
        self._table = table
        self._new_id = new_id
        self._alarms_elsewhere = alarms_elsewhere
        """An alarm-class speak is the sounder's (its own session reads it): acknowledged, not
        handled here."""
        self._fed = frozenset(table.sources[t] for t in table.routes)
        """The inbox sources the MQTT link feeds."""

    def has_room(self) -> bool:
        """Whether every source the MQTT link feeds has room: the engine's link reads no
        further packet while one is full (the broker keeps the rest)."""
        return all(self._inbox.has_room(source) for source in self._fed)

    def offer(self, event: RoutedEvent | SparkplugCommand, source: str, rank: int) -> bool:
        """Into the inbox (urgent when `rank` > 0; a stop is a barrier); without room,
        answered `queue_full`. False: not kept."""
        barrier = event.command.stops if isinstance(event, SparkplugCommand) else is_barrier(event)
        if self._inbox.offer(event, source, rank=rank, barrier=barrier):
            return True
        routed = None if isinstance(event, SparkplugCommand) else event
        self._inbox.refuse(overflowed(routed, source, self._new_id), source)
        return False

    def message_handler(self, topic: str) -> MessageHandler:
        """The handler of a subscription, on paho's thread: the message routed to one event
        (`routes`) and offered. When its source is full, a message is read only if it may be
        urgent (a cheap look); the others are answered `queue_full` unread."""
        table = self._table
        route, source, peek = table.routes[topic], table.sources[topic], table.peeks[topic]

        def handle(topic: str, payload: bytes, delivery: Delivery) -> bool:
            if not self._inbox.has_room(source) and not peek(payload):
                self._inbox.refuse(overflowed(None, source, self._new_id), source)
                return False
            event = route(topic, payload, delivery)
            if self._alarms_elsewhere and in_alarm_lane(event):
                return False  # the sounder answers it; the link acknowledges it here
            return self.offer(event, source, urgency(event))

        return handle

    def announced(self, request: SpeakRequest) -> None:
        """A request of Wyoming's announce target (no delivery to acknowledge)."""
        event = SpeakReceived(request, Delivery(0, 0))
        self.offer(event, WYOMING, urgency(event))

    def sparkplug(self, event: object, rank: Callable[[SparkplugCommand], int]) -> None:
        """An event of the Sparkplug session, on its thread: a command in Sparkplug's budget
        (`rank`: its urgency, as the edge node judges it), the rest as notices."""
        if isinstance(event, SparkplugCommand):
            self.offer(event, SPARKPLUG, rank(event))
        elif isinstance(event, SparkplugConnected | SparkplugLost | SparkplugHostState):
            self._inbox.notice(event)

    def connected(self) -> None:
        """The MQTT session is up (again)."""
        self._inbox.notice(Connected())
