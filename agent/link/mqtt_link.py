"""The MQTT edge: a paho-mqtt 2.x client with a persistent MQTT 5 session, availability and backoff.

Its own thread runs paho's network loop; callbacks only translate and hand off to the handlers
given at construction, and never let an exception reach paho. Connecting (TCP connect and
CONNACK) is retried with full-jitter exponential backoff by tenacity, first connect included.
"""

from __future__ import annotations

import hashlib
import logging
import random
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_random,
    wait_random_exponential,
)

from agent.core.messages import Delivery
from agent.settings.declarations import MqttConfig

_LOGGER = logging.getLogger(__name__)

MessageHandler = Callable[[str, bytes, Delivery], None]
"""Called on the network thread with topic, payload and how to acknowledge; must not block."""

ONLINE: Final = "online"
OFFLINE: Final = "offline"
_CONNACK_TIMEOUT: Final = 10.0
_STABLE_SECONDS: Final = 30.0
"""A connection that lasted this long resets the reconnect delay."""
_SESSION_TAKEN_OVER: Final = 142
_FLAPPING: Final = 3
"""Connections in a row that drop early before the agent warns about a duplicate client id."""
_MAX_QUEUED_OUT: Final = 10000


class ConnectRefusedError(ConnectionError):
    """The broker answered CONNECT with a failure reason code."""


class MqttLink:
    """Owns the paho client and its thread; publishes, acknowledges and reports availability."""

    def __init__(
        self,
        config: MqttConfig,
        client_id: str,
        status_topic: str,
        handlers: Mapping[str, MessageHandler],
        *,
        retained: frozenset[str] = frozenset(),
        on_connected: Callable[[], object] | None = None,
    ) -> None:
        self._config = config
        self._client_id = client_id
        self._status_topic = status_topic
        self._handlers = dict(handlers)
        self._retained = retained
        self._on_connected = on_connected
        self.acknowledged: deque[int] = deque()
        """Ids of our publishes the broker acknowledged (filled by the network thread)."""
        self.last_error: str | None = None
        """The last connection or subscription problem (for the state), None once connected."""
        self._stopping = threading.Event()
        self._redelivering = threading.Event()
        self._connack: ReasonCode | None = None
        self.connected = threading.Event()
        """Set while a session with the broker is up."""
        self.failed = threading.Event()
        """Set when the link gave up for a reason retrying cannot fix (logged)."""
        self._client = self._make_client(client_id)
        self._thread = threading.Thread(target=self._run_blocking, name="mqtt", daemon=True)

    def _make_client(self, client_id: str) -> mqtt.Client:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=False,  # we reconnect ourselves, with jitter
            manual_ack=True,  # the app acknowledges once a message is recorded
        )
        client.suppress_exceptions = True
        client.max_queued_messages_set(_MAX_QUEUED_OUT)
        if self._config.username is not None:
            client.username_pw_set(self._config.username, self._password())
        client.will_set(self._status_topic, OFFLINE, qos=1, retain=True)
        tls = self._config.tls
        if tls.enabled:
            # Verified certificate and checked host name; no fallback to plain TCP exists.
            client.tls_set(
                ca_certs=str(tls.ca_file) if tls.ca_file else None,
                certfile=str(tls.cert_file) if tls.cert_file else None,
                keyfile=str(tls.key_file) if tls.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
                tls_version=ssl.PROTOCOL_TLS_CLIENT,
            )
            client.tls_insecure_set(False)
        client.on_socket_open = self._on_socket_open
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        # Any registered callback makes paho leave socket writes to the network thread (it is
        # woken through its socket pair) instead of writing from whichever thread publishes.
        client.on_socket_register_write = self._on_socket_register_write
        return client

    def _password(self) -> str | None:
        path = self._config.password_file
        if path is None:
            return None
        if path.stat().st_mode & 0o077:
            _LOGGER.warning("%s can be read by other users than the agent's: chmod 600 it", path)
        lines = path.read_text(encoding="utf-8").splitlines()
        return lines[0] if lines else ""

    # ---- called from other threads ------------------------------------------------------

    def start(self) -> None:
        """Connect (retrying with backoff) and serve, in the link's own thread."""
        self._thread.start()

    def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> int:
        """Publish at QoS 1 (queued by paho while disconnected); returns the message id, whose
        acknowledgement by the broker shows up in `acknowledged`."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            _LOGGER.warning("Publish to %s dropped: %s", topic, mqtt.error_string(info.rc))
        return int(info.mid)

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a received QoS 1 message (QoS 0 needs none)."""
        if delivery.qos > 0:
            self._client.ack(delivery.mid, delivery.qos)

    def redeliver(self) -> None:
        """Have the broker send every unacknowledged message again: disconnect cleanly (no Last
        Will), and the link reconnects at once to its persistent session. For messages the
        agent had no room for (see `inbox`)."""
        self._redelivering.set()
        self._client.disconnect()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish `offline`, disconnect cleanly (no Last Will) and join the thread."""
        self._stopping.set()
        if self.connected.is_set():
            info = self._client.publish(self._status_topic, OFFLINE, qos=1, retain=True)
            try:
                info.wait_for_publish(timeout)
            except (RuntimeError, ValueError):
                _LOGGER.warning("Could not publish offline before disconnecting")
        self._client.disconnect()
        self._thread.join(timeout)

    # ---- the network thread -------------------------------------------------------------

    def _run_blocking(self) -> None:
        first = True
        short_sessions = 0  # connections in a row that dropped before _STABLE_SECONDS
        try:
            while not self._stopping.is_set():
                asked = self._redelivering.is_set()  # a reconnect the agent asked for: no pause
                self._redelivering.clear()
                if not first and not asked and not self._pause_before_reconnect(short_sessions):
                    return
                self._connect_with_backoff(first=first)
                first = False
                up_since = time.monotonic()
                self._client.loop_forever()  # returns when the connection ends
                self.connected.clear()
                stable = time.monotonic() - up_since >= _STABLE_SECONDS
                if not self._redelivering.is_set():
                    short_sessions = 0 if stable else short_sessions + 1
                if short_sessions == _FLAPPING and not self._stopping.is_set():
                    _LOGGER.warning(
                        "The connection dropped %d times in a row within %d s: is a second "
                        "agent running with the same node_id (client id %s)?",
                        short_sessions,
                        _STABLE_SECONDS,
                        self._client_id,
                    )
        except Exception:
            if not self._stopping.is_set():  # when stopping, tenacity re-raises the last error
                _LOGGER.exception("The MQTT connection failed for good")
                self.failed.set()

    def _pause_before_reconnect(self, short_sessions: int) -> bool:
        """Wait a jittered delay that grows while connections keep dropping; False if stopping.

        Without it a fleet reconnects in lockstep after a broker restart, and two agents with
        the same client id would take the session from each other in a tight loop.
        """
        low, high = self._config.reconnect_min, self._config.reconnect_max
        delay = random.uniform(low, min(high, low * 2 ** (short_sessions + 1)))  # noqa: S311
        _LOGGER.info("Reconnecting in %.2f s", delay)
        return not self._stopping.wait(delay)

    def _connect_with_backoff(self, *, first: bool) -> None:
        retrying = Retrying(
            # Full jitter: uniform between reconnect_min and a doubling cap, plus up to
            # reconnect_min more so that even the first retries of a fleet spread out.
            wait=wait_random_exponential(
                multiplier=self._config.reconnect_min,
                max=self._config.reconnect_max,
                min=self._config.reconnect_min,
            )
            + wait_random(0, self._config.reconnect_min),
            retry=retry_if_exception_type(OSError),
            stop=stop_when_event_set(self._stopping),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                self._handshake_blocking(first=first)
                first = False

    def _handshake_blocking(self, *, first: bool) -> None:
        """One connection attempt: TCP connect, CONNECT, wait for a successful CONNACK."""
        self._connack = None
        if first:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self._config.session_expiry
            properties.ReceiveMaximum = self._config.receive_maximum
            properties.MaximumPacketSize = self._config.max_packet_bytes
            self._client.connect(
                self._config.host,
                self._config.port,
                keepalive=self._config.keepalive,
                clean_start=False,  # keep the session: messages sent while away are delivered
                properties=properties,
            )
        else:
            self._client.reconnect()
        deadline = time.monotonic() + _CONNACK_TIMEOUT
        while True:
            rc = self._client.loop(timeout=0.1)
            if self._connack is not None:
                break
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                raise ConnectionError(f"connection lost before CONNACK: {mqtt.error_string(rc)}")
            if time.monotonic() > deadline:
                self._client.disconnect()
                raise TimeoutError("no CONNACK from the broker")
        if self._connack.is_failure:
            self.last_error = f"broker refused the connection: {self._connack}"
            raise ConnectRefusedError(self.last_error)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a stop request ends the wait at once

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        _LOGGER.warning(
            "Cannot connect to %s:%d (%s); retry %d in %.2f s",
            self._config.host,
            self._config.port,
            error,
            state.attempt_number,
            delay,
        )

    def _on_socket_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        try:
            # Without it every small packet can wait ~40 ms for a delayed ACK (platform notes).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            _LOGGER.debug("TCP_NODELAY not set", exc_info=True)

    def _on_socket_register_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        """Nothing to do: the network thread's select() sees the pending write."""

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._connack = reason_code
        if reason_code.is_failure:
            return
        try:
            _LOGGER.info(
                "Connected to %s:%d (session present: %s)",
                self._config.host,
                self._config.port,
                flags.session_present,
            )
            # Never replay a retained command at (re)subscribe (a speak was said when sent),
            # except where a retained value is state to restore (the volume).
            keep = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE)
            skip = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
            client.subscribe(
                [(topic, keep if topic in self._retained else skip) for topic in self._handlers]
            )
            client.publish(self._status_topic, ONLINE, qos=1, retain=True)
            self.last_error = None
            self.connected.set()
            if self._on_connected is not None:
                self._on_connected()
        except Exception:
            _LOGGER.exception("on_connect failed")

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self.acknowledged.append(mid)  # deque.append is atomic: no lock, no blocking

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        refused = [str(code) for code in reason_codes if code.is_failure]
        if not refused:
            return
        # A broker that refuses a subscription (e.g. an ACL) would leave the agent deaf: report
        # it and go through the reconnect path, whose pauses grow while sessions stay short.
        self.last_error = f"broker refused a subscription: {', '.join(refused)}"
        _LOGGER.error("%s; reconnecting later", self.last_error)
        client.disconnect()

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self.connected.clear()
        if self._stopping.is_set():
            return
        if reason_code.value == _SESSION_TAKEN_OVER:
            _LOGGER.error(
                "Another client connected with this client id and took the session: "
                "is a second agent running with the same node_id?"
            )
        else:
            _LOGGER.warning("Disconnected from the broker: %s", reason_code)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        fingerprint = hashlib.blake2b(
            message.topic.encode() + b"\0" + message.payload, digest_size=16
        ).hexdigest()
        expiry = getattr(message.properties, "MessageExpiryInterval", None)
        delivery = Delivery(
            message.mid,
            message.qos,
            bool(message.dup),
            fingerprint,
            float(expiry) if isinstance(expiry, int) else None,
        )
        try:
            handler = self._handlers.get(message.topic) or next(
                (
                    h
                    for sub, h in self._handlers.items()
                    if mqtt.topic_matches_sub(sub, message.topic)
                ),
                None,
            )
            if handler is None:
                _LOGGER.warning("Message on unexpected topic %s ignored", message.topic)
                self.ack(delivery)
                return
            handler(message.topic, bytes(message.payload), delivery)
        except Exception:
            _LOGGER.exception("Handling a message on %s failed; it is dropped", message.topic)
            self.ack(delivery)  # an unacknowledged message would hold a receive slot for good
