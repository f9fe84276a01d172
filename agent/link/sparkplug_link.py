"""The Sparkplug B edge node's own MQTT session (docs/sparkplug.md), beside the agent's link.

Sparkplug asks for a clean session whose Will is the NDEATH: each CONNECT is a new paho client
(MQTT 3.1.1, which every broker of a plant speaks, RabbitMQ's included) with the next `bdSeq`
in its Will. `bdSeq` is kept in a file of the storage directory, so that the NDEATH of the
session before a restart never matches the NBIRTH after it. The servers are tried in order of
`mqtt.hosts` on the agent's own ring (`servers.Ring`: the next after a failed connect, a lost
session, a `Node Control/Next Server` or the primary host going offline; a short delay within a
round, backoff after a failed round), with the same TLS contexts and password.

Its thread runs paho's loop; the callbacks only hand events to the loop (`on_event`), which
decides (`protocol.sparkplug`) and publishes through `publish`.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_when_event_set

from agent.link.servers import V311, Ring, Step, delay, read_password, tls_contexts
from agent.protocol.inputs import (
    SparkplugCommand,
    SparkplugConnected,
    SparkplugHostState,
    SparkplugLost,
)
from agent.protocol.sparkplug import SparkplugTopics, node_death, state_topic
from agent.settings.declarations import MqttConfig, SparkplugConfig, servers

_LOGGER = logging.getLogger(__name__)

SparkplugEvent = SparkplugConnected | SparkplugLost | SparkplugCommand | SparkplugHostState
_CONNACK_TIMEOUT: Final = 10.0
_STABLE_S: Final = 30.0
"""A session that lasted this long resets the pause before the next."""


class BdSeq:
    """The birth/death sequence number, 0-255, kept across restarts in a file (none: memory)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._next = 0
        if path is not None:
            try:
                text = path.read_text(encoding="ascii").strip()
                self._next = int(text) % 256 if text.isdigit() and len(text) <= 3 else 0
            except (OSError, UnicodeDecodeError):
                self._next = 0

    def take(self) -> int:
        """The number of the CONNECT about to be made; the next one is stored."""
        taken = self._next
        self._next = (taken + 1) % 256
        if self._path is not None:
            spare = self._path.with_suffix(".tmp")
            try:
                spare.write_text(f"{self._next}\n", encoding="ascii")
                os.replace(spare, self._path)
            except OSError:
                _LOGGER.warning("Cannot keep the Sparkplug bdSeq in %s", self._path)
        return taken


class SparkplugLink:
    """The Sparkplug session and its thread."""

    def __init__(
        self,
        mqtt_config: MqttConfig,
        config: SparkplugConfig,
        topics: SparkplugTopics,
        client_id: str,
        *,
        bd_seq: BdSeq,
        on_event: Callable[[SparkplugEvent], None],
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._mqtt = mqtt_config
        self._config = config
        self._topics = topics
        self._client_id = client_id
        self._bd_seq = bd_seq
        self._on_event = on_event
        self._wall_ms = wall_ms
        self._ring = Ring(servers(mqtt_config), V311)  # the agent's ring rule, 3.1.1 always
        self._contexts = tls_contexts(self._ring.servers)  # a file that cannot be used: now
        self._password = read_password(mqtt_config.password_file)
        self._step = Step.ROUND
        self._stopping = threading.Event()
        self._client: mqtt.Client | None = None
        self._lock = threading.Lock()
        self._session_bd_seq = 0
        self.server = ""
        """host:port of the session in use ("" while there is none)."""
        self._thread = threading.Thread(target=self._run, name="sparkplug", daemon=True)

    # ---- from the loop ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def publish(self, topic: str, payload: bytes) -> None:
        """Births, data and deaths: QoS 0, not retained (Sparkplug 3.0)."""
        with self._lock:
            client = self._client
        if client is not None:
            client.publish(topic, payload, qos=0, retain=False)

    def next_server(self) -> None:
        """Leave this server (with an NDEATH) for the next one."""
        self._goodbye()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish the NDEATH, disconnect and join the thread."""
        self._stopping.set()
        self._goodbye()
        self._thread.join(timeout)

    def _goodbye(self) -> None:
        with self._lock:
            client, bd_seq = self._client, self._session_bd_seq
        if client is None:
            return
        info = client.publish(
            self._topics.ndeath, node_death(bd_seq, self._wall_ms()), qos=1, retain=False
        )
        try:
            info.wait_for_publish(2.0)
        except (RuntimeError, ValueError):
            _LOGGER.debug("NDEATH not acknowledged before disconnecting")
        client.disconnect()

    # ---- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        short = 0  # sessions in a row that ended within _STABLE_S
        low, high = self._mqtt.reconnect_min, self._mqtt.reconnect_max
        while not self._stopping.is_set():
            retrying = Retrying(
                wait=self._wait,
                retry=retry_if_exception_type(OSError),
                stop=stop_when_event_set(self._stopping),
                sleep=self._sleep,
                reraise=True,
            )
            try:
                for attempt in retrying:
                    with attempt:
                        client = self._attempt()
            except OSError:
                return  # stopping
            up_since = time.monotonic()
            client.loop_forever()  # until the session ends
            with self._lock:
                self._client = None
            self.server = ""
            short = 0 if time.monotonic() - up_since >= _STABLE_S else short + 1
            if not self._stopping.is_set():
                _LOGGER.warning("Sparkplug session ended; trying the next server")
                self._on_event(SparkplugLost())
                self._ring.lost()
                # a server that closes each session at once (RabbitMQ while the node that held
                # the last one is down) is not hammered: the pause grows, as the agent's does
                self._stopping.wait(min(high, low * 2 ** min(short, 16)))

    def _attempt(self) -> mqtt.Client:
        """One CONNECT to the ring's current server; on failure the ring moves on."""
        try:
            client = self._connect(self._ring.index)
        except OSError:
            self._step = self._ring.failed(maybe_not_v5=False)
            raise
        self._ring.connected()
        return client

    def _wait(self, _state: RetryCallState) -> float:
        return delay(
            self._step, self._ring.rounds, self._mqtt.reconnect_min, self._mqtt.reconnect_max
        )

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a stop ends the wait at once

    def _connect(self, index: int) -> mqtt.Client:
        """One CONNECT to a server with the next bdSeq in the NDEATH Will; raises OSError (to
        try the next server) when it fails."""
        server, context = self._ring.servers[index], self._contexts[index]
        bd_seq = self._bd_seq.take()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            # a client id of its own per CONNECT: a clean session needs nothing of the last one,
            # and a broker that still holds the last one where it cannot reach it (RabbitMQ: on
            # a node that was killed) would refuse the same id elsewhere
            client_id=f"{self._client_id}-{secrets.token_hex(3)}",
            protocol=MQTTProtocolVersion.MQTTv311,
            clean_session=True,
            reconnect_on_failure=False,
        )
        client.suppress_exceptions = True
        if self._mqtt.username is not None:
            client.username_pw_set(self._mqtt.username, self._password)
        if context is not None:  # verified certificate and host name, no plain TCP fallback
            client.tls_set_context(context)
        client.will_set(
            self._topics.ndeath, node_death(bd_seq, self._wall_ms()), qos=1, retain=False
        )
        answer: dict[str, Any] = {}
        client.on_connect = lambda _c, _u, _f, reason, _p: answer.setdefault("reason", reason)
        client.on_message = self._on_message
        address = server.address
        try:
            client.connect(server.host, server.port, keepalive=self._config.keepalive)
        except OSError as err:  # ssl.SSLError included
            raise ConnectionError(f"cannot reach {address}: {err}") from err
        deadline = time.monotonic() + _CONNACK_TIMEOUT
        while "reason" not in answer:
            if client.loop(timeout=0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS or (
                time.monotonic() > deadline
            ):
                client.disconnect()
                raise ConnectionError(f"no CONNACK from {address}")
        reason = answer["reason"]
        if reason.is_failure:
            client.disconnect()
            raise ConnectionError(f"{address} refused the Sparkplug session: {reason}")
        subscriptions = [(self._topics.ncmd, 1), (self._topics.dcmd, 1)]
        if self._config.primary_host_id:
            subscriptions.append((state_topic(self._config.primary_host_id), 1))
        client.subscribe(subscriptions)
        client.on_disconnect = lambda *_args: None
        with self._lock:
            self._client, self._session_bd_seq = client, bd_seq
        self.server = address
        _LOGGER.info("Sparkplug session on %s (bdSeq %d)", address, bd_seq)
        self._on_event(SparkplugConnected(bd_seq, address))
        return client

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        """On paho's thread: hand the bytes on, nothing more."""
        try:
            payload = bytes(message.payload)
            if message.topic == self._topics.dcmd:
                self._on_event(SparkplugCommand(True, payload))
            elif message.topic == self._topics.ncmd:
                self._on_event(SparkplugCommand(False, payload))
            else:
                self._on_event(SparkplugHostState(payload))
        except Exception:
            _LOGGER.exception("A Sparkplug message on %s was dropped", message.topic)
