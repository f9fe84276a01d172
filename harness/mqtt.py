"""Real MQTT clients for tests: a paho watcher that records what it sees, and `mosquitto_pub`."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .broker import Broker
from .wait import TIMEOUT, wait_until

ENDING_EVENTS: Final = frozenset(
    {"finished", "failed", "rejected", "expired", "stopped", "preempted", "acknowledged"}
)
"""Events that end an announcement, as the topic contract lists them (docs/topics.md): a test's
own copy, not the agent's."""


@dataclass(frozen=True)
class Received:
    """One message seen by a Watcher."""

    topic: str
    payload: bytes
    retain: bool
    at: float = 0.0
    """time.time() when the watcher received it."""

    def json(self) -> dict[str, Any]:
        """The payload as a JSON object."""
        value = json.loads(self.payload)
        assert isinstance(value, dict)
        return value


def _no_delay(_client: mqtt.Client, _userdata: Any, sock: Any) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Watcher:
    """A real paho client that records every message on the given topic filters."""

    def __init__(
        self,
        broker: Broker,
        *topics: str,
        username: str | None = None,
        password: str | None = None,
        ca: Path | None = None,
        persistent: str | None = None,
    ) -> None:
        """Subscribe to `topics`; with `persistent` (a client id) the session outlives broker
        restarts (MQTT 5 session expiry), so nothing published meanwhile is missed."""
        self.broker = broker
        self.messages: list[Received] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=persistent or "",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.on_message = self._on_message
        self._client.on_socket_open = _no_delay
        self._client.on_subscribe = lambda *_args: self._subscribed.set()
        if username is not None:
            self._client.username_pw_set(username, password)
        if ca is not None:
            self._client.tls_set(ca_certs=str(ca))
        properties = None
        if persistent is not None:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 600
        self._client.reconnect_delay_set(1, 2)
        # A session Mosquitto 2.0 keeps across restarts: clean start off from the first connect
        # (with clean start on, it does not persist the session, expiry or not).
        clean = persistent is None
        self._client.connect(broker.host, broker.port, clean_start=clean, properties=properties)
        self._client.subscribe([(t, 1) for t in topics])
        self._client.loop_start()
        assert self._subscribed.wait(10), "no SUBACK"

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            received = Received(msg.topic, bytes(msg.payload), bool(msg.retain), time.time())
            self.messages.append(received)

    def snapshot(self) -> list[Received]:
        """A copy of what arrived so far."""
        with self._lock:
            return list(self.messages)

    def clear(self) -> None:
        """Forget what arrived so far."""
        with self._lock:
            self.messages.clear()

    def events(self, request_id: str | None = None) -> list[dict[str, Any]]:
        """Lifecycle events seen so far (optionally only those of one request id)."""
        found = [m.json() for m in self.snapshot() if m.topic.endswith("/events")]
        return [e for e in found if request_id is None or e["id"] == request_id]

    def wait_event(self, request_id: str, event: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait for one event of a request id, and return it."""

        def found() -> list[dict[str, Any]]:
            return [e for e in self.events(request_id) if e["event"] == event]

        wait_until(lambda: bool(found()), timeout, f"{event} of {request_id}")
        return found()[0]

    def wait_end(self, request_id: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait for a request's last event, whichever it is (ENDING_EVENTS), and return it."""

        def found() -> list[dict[str, Any]]:
            return [e for e in self.events(request_id) if e["event"] in ENDING_EVENTS]

        wait_until(lambda: bool(found()), timeout, f"the end of {request_id}")
        return found()[0]

    def wait_payload(self, topic: str, payload: bytes, timeout: float = TIMEOUT) -> Received:
        """Wait for a message with exactly this payload on topic."""

        def found() -> list[Received]:
            return [m for m in self.snapshot() if m.topic == topic and m.payload == payload]

        wait_until(lambda: bool(found()), timeout, f"{payload!r} on {topic}")
        return found()[-1]

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> float:
        """Publish from this client (no process start in the way); returns time.time() before."""
        sent = time.time()
        self._client.publish(topic, payload, qos=qos).wait_for_publish(10)
        return sent

    def close(self) -> None:
        """Disconnect."""
        self._client.loop_stop()
        self._client.disconnect()


def publish(broker: Broker, topic: str, payload: bytes, qos: int = 1) -> None:
    """Publish with the real `mosquitto_pub` client (payload read raw from stdin)."""
    args = ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-t", topic, "-q", str(qos)]
    args += ["-s"] if payload else ["-n"]
    subprocess.run(args, input=payload, check=True, timeout=TIMEOUT)
