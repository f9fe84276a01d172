"""The MQTT link's subscription set: the topics (filters) it subscribes to with their handlers,
the options asked at each (re)subscribe (a retained command is never replayed, but where a
retained value is state to restore), the route of a received topic to its subscription; and
whether the broker granted them on the current connection (`subscribed`), which `on_session`
hears: the server once granted, None when the connection ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from agent.core.messages import Delivery
from agent.link.mqtt.servers import V5, Version

_LOGGER = logging.getLogger("agent.link.mqtt.link")  # the link's log, as before its split

MessageHandler = Callable[[str, bytes, Delivery], bool]
"""Called on the network thread with topic, payload and how to acknowledge; must not block.
True: the handler kept the message (it is acknowledged once handled); False: it did not (no
room), and the link acknowledges it at once."""


class Subscriptions:
    """Topic filters, their handlers, those whose retained message is state to restore, and
    whether the broker granted them."""

    def __init__(
        self,
        handlers: Mapping[str, MessageHandler],
        retained: frozenset[str],
        on_session: Callable[[str | None], object] | None,
    ) -> None:
        """`on_session`: see `granted` and `ended`; it must not block."""
        self._handlers = dict(handlers)
        self._retained = retained
        self._on_session = on_session
        self.subscribed = threading.Event()
        """Set once the broker acknowledged this connection's subscriptions (what waited in the
        session came before that acknowledgement, from Mosquitto at least); cleared when the
        connection ends."""

    def requests(self, version: Version) -> list[tuple[str, Any]]:
        """What to subscribe to at a connect, with its options in this MQTT version.

        Never replay a retained command at (re)subscribe (a speak was said when sent), except
        where a retained value is state to restore (the volume). MQTT 3.1.1 has no such option:
        `replayed` tells the link which to drop itself."""
        if version != V5:
            return [(topic, 1) for topic in self._handlers]
        keep = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE)
        skip = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
        return [(t, keep if t in self._retained else skip) for t in self._handlers]

    def route(self, topic: str) -> tuple[str | None, MessageHandler | None]:
        """The subscription a topic came by, and its handler."""
        if topic in self._handlers:
            return topic, self._handlers[topic]
        for subscription, handler in self._handlers.items():
            if mqtt.topic_matches_sub(subscription, topic):
                return subscription, handler
        return None, None

    def replayed(self, subscription: str | None, *, retain: bool) -> bool:
        """Whether a message is a retained one sent because of the subscription, where it is
        no state to restore (MQTT 3.1.1 sets the flag only then; MQTT 5 without Retain As
        Published likewise): never replayed."""
        return retain and subscription not in self._retained

    def granted(self, server: str) -> None:
        """On the network thread: the broker at `server` acknowledged the subscriptions."""
        self.subscribed.set()
        self._tell_session(server)

    def ended(self) -> None:
        """On the network thread: the connection ended."""
        self.subscribed.clear()
        self._tell_session(None)

    def _tell_session(self, server: str | None) -> None:
        if self._on_session is not None:
            try:
                self._on_session(server)
            except Exception:
                _LOGGER.exception("on_session failed")
