"""A paho MQTT client that publishes and timestamps every message it receives, for latency.

It sets TCP_NODELAY on its socket (otherwise small packets can wait ~40 ms for a delayed ACK)
and takes `time.perf_counter()` in the network thread as each message arrives, so waits are
not quantized by polling.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

_SUBACK_TIMEOUT: Final = 10.0
_WAKE_SECONDS: Final = 0.25


@dataclass(frozen=True)
class Arrival:
    """One received message and when it arrived (perf_counter seconds)."""

    topic: str
    payload: bytes
    at: float


def _nodelay(_client: mqtt.Client, _userdata: Any, sock: Any) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Probe:
    """Subscribed to the given topic filters from construction until `close`."""

    def __init__(self, host: str, port: int, topics: Sequence[str]) -> None:
        self._arrivals: list[Arrival] = []
        self._changed = threading.Condition()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"bench-probe-{uuid.uuid4().hex[:8]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.on_socket_open = _nodelay
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_args: self._subscribed.set()
        self._client.connect(host, port)
        self._client.subscribe([(topic, 1) for topic in topics])
        self._client.loop_start()
        if not self._subscribed.wait(_SUBACK_TIMEOUT):
            self.close()
            raise TimeoutError("the probe got no SUBACK from the broker")

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        arrival = Arrival(msg.topic, bytes(msg.payload), time.perf_counter())
        with self._changed:
            self._arrivals.append(arrival)
            self._changed.notify_all()

    @property
    def nodelay(self) -> bool:
        """Whether TCP_NODELAY is on for the probe's socket."""
        sock = self._client.socket()
        if not isinstance(sock, socket.socket):
            return False
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    def mark(self) -> int:
        """A position in the arrivals: `wait_for(..., since=mark)` sees only later ones."""
        with self._changed:
            return len(self._arrivals)

    def arrivals(self, since: int = 0) -> list[Arrival]:
        """The arrivals after the mark `since`, in order."""
        with self._changed:
            return self._arrivals[since:]

    def publish(self, topic: str, payload: bytes) -> float:
        """Publish at QoS 1; returns the perf_counter time just before the call."""
        sent = time.perf_counter()
        info = self._client.publish(topic, payload, qos=1)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise ConnectionError(f"publish to {topic} failed: {mqtt.error_string(info.rc)}")
        return sent

    def wait_for(
        self,
        match: Callable[[Arrival], bool],
        since: int,
        timeout: float,
        give_up: Callable[[], bool] = lambda: False,
    ) -> Arrival:
        """The first arrival after `since` that matches; TimeoutError after timeout or give_up."""
        deadline = time.perf_counter() + timeout
        with self._changed:
            while True:
                for arrival in self._arrivals[since:]:
                    if match(arrival):
                        return arrival
                since = len(self._arrivals)
                remaining = deadline - time.perf_counter()
                if remaining <= 0 or give_up():
                    raise TimeoutError("the awaited MQTT message did not arrive")
                self._changed.wait(min(remaining, _WAKE_SECONDS))

    def close(self) -> None:
        """Stop the network thread and disconnect."""
        self._client.loop_stop()
        self._client.disconnect()
