"""The MQTT edge: a paho-mqtt 2.x client with a persistent session, availability, backoff and
failover between the servers of `mqtt.hosts`, in MQTT 5 or 3.1.1.

Its own thread runs paho's network loop; callbacks only translate and hand off to the handlers
given at construction, and never let an exception reach paho. Connecting (TCP connect and
CONNACK) is retried by tenacity, first connect included, going round the servers as
`servers.Ring` decides: a short delay to the next server, full-jitter exponential backoff per
round of failures.

One paho client serves as long as the server and the MQTT version stay the same (paho resends
what it had in flight, in the same session). Going to another server, or to another version,
takes a new client (paho takes its TLS context and version once): the link keeps every QoS 1
publish until the broker acknowledges it, and hands the new client the ones still
unacknowledged, in order, under the ids it returned. A message received on one connection is
acknowledged on that connection only: its packet id means nothing to the next.

A link may follow another's server (`follow`: the engine's link follows the sounder's, so that
the node's two sessions meet on one broker): it leaves the server in use for that one (its
status `offline` there, a clean disconnect) and comes back to it after a loss (`servers.Ring`).
`on_session` hears the server once the broker acknowledged a connection's subscriptions there
(from then on every message published there reaches this session), and None when it ends.

Each connection holds a packet above `mqtt.max_packet_bytes` off from its fixed header, before
its body is read (`bounded_socket`): MQTT 5 servers are told that maximum and never send more; a
server that does anyway loses the connection, which the link treats as a lost one (the next
server, the usual pauses). An MQTT 3.1.1 server was told nothing: a PUBLISH over the bound comes
without its payload (thrown away unread), and is acknowledged and dropped, so that a persistent
session does not send it again at every reconnect. Each server gets its own credentials only.

A message is handed to its handler, which says whether it kept it: one it did not keep (no room
for it) is acknowledged at once, never left for the broker to send again. With `room` (whether the
handlers' consumer can take another message now), the link reads no further packet of an
established session while it says no (`bounded_socket`'s gate): the broker keeps the rest, so a
broker that sends more than `mqtt.receive_maximum` at once (Mosquitto resuming a session after
its restart, a 3.1.1 broker's own window) makes the consumer wait for it instead of refusing.

Its parts: the reconnect policy (`reconnect`), the delivery and acknowledgement bookkeeping
with paho's acknowledgement of our publishes (`publishes`), the subscription set and who hears
it granted (`subscriptions`), and the bounded socket's side of packets over the bound
(`oversize`); here the client, its thread, the server it follows, and paho's other callbacks.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.core.messages import Delivery
from agent.link.mqtt.bounded_socket import BoundedClient, Gate
from agent.link.mqtt.oversize import Oversize
from agent.link.mqtt.publishes import Publishes
from agent.link.mqtt.reconnect import MaybeNotV5Error, Reconnect
from agent.link.mqtt.servers import (
    UNSUPPORTED_PROTOCOL,
    V5,
    Ring,
    Version,
    credentials,
    passwords,
    refusal,
    tls_contexts,
)
from agent.link.mqtt.subscriptions import MessageHandler, Subscriptions
from agent.settings.declarations import MqttConfig, servers

_LOGGER = logging.getLogger(__name__)

__all__ = ["OFFLINE", "ONLINE", "ConnectRefusedError", "MessageHandler", "MqttLink"]
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
        online_now: Callable[[], bool] | None = None,
        room: Callable[[], bool] | None = None,
        on_session: Callable[[str | None], object] | None = None,
    ) -> None:
        """`online_now`: asked at each connect (on the network thread, the link's lock held)
        whether to say `online` then (None: always); when it says no, `say_online` says it
        later. `room`: asked on the network thread before each packet of a session (not before
        its CONNACK), the next one is read only when it says yes (None: always). `on_session`:
        on the network thread, the server's address once the broker acknowledged the
        subscriptions, None when the connection ends; it must not block."""
        self._config = config
        self._online_now = online_now
        self._client_id = client_id
        self._status_topic = status_topic
        self._subscriptions = Subscriptions(handlers, retained, on_session)
        self._on_connected = on_connected
        self._ring = Ring(servers(config), config.protocol)
        self._contexts = tls_contexts(self._ring.servers)  # a file that cannot be used: now
        self._passwords = passwords(self._ring.servers)
        self._publishes = Publishes()
        self.acknowledged = self._publishes.acknowledged
        """Ids of our publishes the broker acknowledged (filled by the network thread)."""
        self.last_error: str | None = None
        """The last connection or subscription problem (for the state), None once connected."""
        self._stopping = threading.Event()
        self._redelivering = threading.Event()
        self._moving = threading.Event()
        """`follow` asked for another server than the one in use: the connection is left once
        it is up, and the next attempt goes to the leader's server without a pause."""
        self._online_said = False
        """`online` was published on the current connection (or queued for it; under the lock)."""
        self._connack: ReasonCode | None = None
        self._reconnect = Reconnect(config, self._ring, self._stopping)
        self.connected = threading.Event()
        """Set while a session with the broker is up."""
        self.subscribed = self._subscriptions.subscribed
        """Set once the broker acknowledged this connection's subscriptions (what waited in the
        session came before that acknowledgement, from Mosquitto at least); cleared with
        `connected`."""
        self.failed = threading.Event()
        """Set when the link gave up for a reason retrying cannot fix (logged)."""
        # The lock orders publishers, acknowledgers and a change of client; it is never taken
        # inside paho's on_publish (called with paho's own lock held, which publish takes).
        self._lock = threading.Lock()
        self._oversize = Oversize(config.max_packet_bytes, lambda: self.server, self._note)
        self._gate = _gate(self.connected, room)
        self._version: Version = self._ring.version
        self._client_key = (self._ring.index, self._version)
        self._client = self._make_client(self._ring.index, self._version)
        self._thread = threading.Thread(target=self._run_blocking, name="mqtt", daemon=True)

    @property
    def server(self) -> str:
        """host:port of the server in use (while disconnected: of the next attempt)."""
        return self._ring.servers[self._ring.index].address

    @property
    def protocol(self) -> Version:
        """The MQTT version of the current connection (or of the last attempt): "5" or
        "3.1.1"."""
        return self._version

    def _make_client(self, index: int, version: Version) -> mqtt.Client:
        client = BoundedClient(
            CallbackAPIVersion.VERSION2,
            client_id=self._client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if version == V5 else MQTTProtocolVersion.MQTTv311,
            # 3.1.1: the session is kept (the broker decides how long); 5: see `_handshake`
            clean_session=None if version == V5 else False,
            reconnect_on_failure=False,  # we reconnect ourselves, with jitter
            manual_ack=True,  # the app acknowledges once a message is recorded
            max_packet_bytes=self._config.max_packet_bytes,
            refused=self._oversize.refused,
            cut=None if version == V5 else self._oversize.cut,  # MQTT 5 servers were told
            gate=self._gate,
        )
        client.suppress_exceptions = True
        client.max_queued_messages_set(_MAX_QUEUED_OUT)
        credentials(client, self._ring.servers[index], self._passwords[index])
        client.will_set(self._status_topic, OFFLINE, qos=1, retain=True)
        context = self._contexts[index]
        if context is not None:
            # Verified certificate and checked host name; no fallback to plain TCP exists.
            client.tls_set_context(context)
            client.tls_insecure_set(False)
        client.on_socket_open = _on_socket_open
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._publishes.on_publish
        # Any registered callback makes paho leave socket writes to the network thread (it is
        # woken through its socket pair) instead of writing from whichever thread publishes.
        client.on_socket_register_write = _on_socket_register_write
        return client

    # ---- called from other threads ------------------------------------------------------

    def start(self) -> None:
        """Connect (retrying with backoff) and serve, in the link's own thread."""
        self._thread.start()

    def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> int:
        """Publish at QoS 1 (queued while disconnected, and carried to the next server); returns
        the message's id, whose acknowledgement by the broker shows up in `acknowledged`."""
        with self._lock:
            info = self._client.publish(topic, payload, qos=1, retain=retain)
            ours = self._publishes.next_id()
            if info.rc in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                self._publishes.sent(ours, info.mid, (topic, payload, retain))
                return ours
        _LOGGER.warning("Publish to %s dropped: %s", topic, mqtt.error_string(info.rc))
        return ours

    def say_online(self, server: str | None = None) -> None:
        """Publish `online` (retained) now, once a connection: for a link whose `online_now`
        said not yet. With `server`: only if this link's connection (or the attempt under way)
        is to that server."""
        with self._lock:
            here = self._ring.servers[self._client_key[0]].address
            if self._online_said or (server is not None and server != here):
                return
            info = self._client.publish(self._status_topic, ONLINE, qos=1, retain=True)
            self._publishes.meet(info.mid, 0)
            self._online_said = True

    def follow(self, address: str) -> None:
        """Use the server of this address (`host:port`, as `mqtt.hosts` makes it) from now on:
        leave the one in use for it (`offline` said there, a clean disconnect: no Last Will),
        and come back to it after a loss. Safe from any thread; never waits. An address not
        among the servers changes nothing."""
        index = self._ring.follow(address)
        if index is None:
            _LOGGER.warning("Asked to follow %s, which is not in mqtt.hosts: ignored", address)
            return
        with self._lock:
            client = self._client
            if self._client_key[0] == index:
                return
            self._moving.set()
            if not self.connected.is_set():
                return  # the next attempt goes there (or the one under way is left once up)
            info = client.publish(self._status_topic, OFFLINE, qos=1, retain=True)
            self._publishes.meet(info.mid, 0)
        _LOGGER.info("Leaving %s for %s", self.server, address)
        client.disconnect()

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a received QoS 1 message (QoS 0 needs none). One received on an earlier
        connection is not: its broker sends it again, if it kept the session."""
        if delivery.qos == 0:
            return
        with self._lock:
            current = self._publishes.take(delivery)
            if current:
                self._client.ack(delivery.mid, delivery.qos)
        if not current:
            _LOGGER.debug("Message %d is of an earlier connection: not acknowledged", delivery.mid)

    def redeliver(self) -> None:
        """Have the broker send every unacknowledged message again: disconnect cleanly (no Last
        Will), and the link reconnects at once to its persistent session on the same server.
        For messages the journal could not record (see `ledger`): never for a full inbox."""
        self._redelivering.set()
        with self._lock:
            client = self._client
        client.disconnect()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish `offline`, disconnect cleanly (no Last Will) and join the thread."""
        self._stopping.set()
        with self._lock:
            client = self._client
            info = None
            if self.connected.is_set():
                info = client.publish(self._status_topic, OFFLINE, qos=1, retain=True)
                self._publishes.meet(info.mid, 0)
        if info is not None:
            try:
                info.wait_for_publish(timeout)
            except (RuntimeError, ValueError):
                _LOGGER.warning("Could not publish offline before disconnecting")
        client.disconnect()
        self._thread.join(timeout)

    # ---- the network thread -------------------------------------------------------------

    def _run_blocking(self) -> None:
        first = True
        short_sessions = 0  # connections in a row that dropped before _STABLE_SECONDS
        try:
            while not self._stopping.is_set():
                asked = self._redelivering.is_set()  # a reconnect the agent asked for: no pause
                self._redelivering.clear()
                moving = self._moving.is_set()  # `follow` left the server: no pause either
                self._moving.clear()
                if first:
                    self._ring.start_at_leader()
                elif not asked:
                    self._ring.lost()  # on to the next server (the same one if it is alone)
                    if not moving and not self._reconnect.pause(short_sessions):
                        return
                first = False
                self._reconnect.connect(self._use, self._handshake_blocking)
                self._leave_if_astray()
                up_since = time.monotonic()
                self._client.loop_forever()  # returns when the connection ends
                self.connected.clear()
                stable = time.monotonic() - up_since >= _STABLE_SECONDS
                if not (self._redelivering.is_set() or self._moving.is_set()):
                    short_sessions = 0 if stable else short_sessions + 1
                if short_sessions == _FLAPPING and not self._stopping.is_set():
                    _LOGGER.warning(
                        "The connection dropped %d times in a row within %d s: is a second "
                        "agent running with the same node_id (client id %s)? Or does the broker "
                        "close a session it cannot reach (a RabbitMQ cluster whose node that held "
                        "it is down: docs/brokers.md)?",
                        short_sessions,
                        _STABLE_SECONDS,
                        self._client_id,
                    )
        except Exception:
            if not self._stopping.is_set():  # when stopping, tenacity re-raises the last error
                _LOGGER.exception("The MQTT connection failed for good")
                self.failed.set()

    def _leave_if_astray(self) -> None:
        """`follow` asked for another server while this connection was being made: leave it
        now (`offline` said there), once."""
        with self._lock:
            if not self._moving.is_set():
                return
            if self._ring.index == self._ring.leader:
                self._moving.clear()  # made where it was asked for
                return
            info = self._client.publish(self._status_topic, OFFLINE, qos=1, retain=True)
            self._publishes.meet(info.mid, 0)
        _LOGGER.info("Leaving %s for the server followed", self.server)
        self._client.disconnect()

    def _use(self, index: int, version: Version) -> None:
        """Make the client for this server and version, unless it is the one in use; hand it
        our unacknowledged publishes, in order."""
        if (index, version) == self._client_key:
            return
        client = self._make_client(index, version)
        with self._lock:
            self._publishes.hand_over(client)
            self._client, self._client_key, self._version = client, (index, version), version

    def _handshake_blocking(self) -> None:
        """One connection attempt: TCP connect, CONNECT, wait for a successful CONNACK."""
        self._connack = None
        server = self._ring.servers[self._client_key[0]]
        if self._version == V5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = self._config.session_expiry
            properties.ReceiveMaximum = self._config.receive_maximum
            properties.MaximumPacketSize = self._config.max_packet_bytes
            self._client.connect(
                server.host,
                server.port,
                keepalive=self._config.keepalive,
                clean_start=False,  # keep the session: messages sent while away are delivered
                properties=properties,
            )
        else:
            self._client.connect(server.host, server.port, keepalive=self._config.keepalive)
        deadline = time.monotonic() + _CONNACK_TIMEOUT
        while True:
            rc = self._client.loop(timeout=0.1)
            if self._connack is not None:
                break
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                error = f"connection lost before CONNACK: {mqtt.error_string(rc)}"
                raise (MaybeNotV5Error if self._version == V5 else ConnectionError)(error)
            if time.monotonic() > deadline:
                self._client.disconnect()
                raise TimeoutError("no CONNACK from the broker")
        if self._connack.is_failure:
            self.last_error = (
                f"broker refused the connection: {refusal(self._connack, self._version)}"
            )
            if self._connack.value == UNSUPPORTED_PROTOCOL and self._version == V5:
                raise MaybeNotV5Error(self.last_error, refused=True)
            raise ConnectRefusedError(self.last_error)

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
                "Connected to %s with MQTT %s (session present: %s)",
                self.server,
                self._version,
                flags.session_present,
            )
            # A retained command is never replayed at (re)subscribe (`Subscriptions.requests`);
            # MQTT 3.1.1 has no such option: `_on_message` drops those itself.
            with self._lock:
                self._online_said = False
                self._publishes.new_connection()  # packet ids of earlier ones mean nothing here
                client.subscribe(self._subscriptions.requests(self._version))
                if self._online_now is None or self._online_now():
                    info = client.publish(self._status_topic, ONLINE, qos=1, retain=True)
                    self._publishes.meet(info.mid, 0)
                    self._online_said = True
            self.last_error = None
            self.connected.set()
            if self._on_connected is not None:
                self._on_connected()
        except Exception:
            _LOGGER.exception("on_connect failed")

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
            self._subscriptions.granted(self.server)
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
        self._subscriptions.ended()
        if self._stopping.is_set():
            return
        if reason_code.value == _SESSION_TAKEN_OVER:
            _LOGGER.error(
                "Another client connected with this client id and took the session: "
                "is a second agent running with the same node_id?"
            )
        else:
            _LOGGER.warning("Disconnected from the broker at %s: %s", self.server, reason_code)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if self._oversize.dropped(client, message):
            return
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
        if delivery.qos > 0:
            self._publishes.received(delivery)  # one dict operation: atomic
        try:
            subscription, handler = self._subscriptions.route(message.topic)
            if handler is None:
                _LOGGER.warning("Message on unexpected topic %s ignored", message.topic)
                self.ack(delivery)
                return
            if self._subscriptions.replayed(subscription, retain=bool(message.retain)):
                # Sent because of the subscription (MQTT 3.1.1 sets the flag only then; MQTT 5
                # without Retain As Published likewise): a retained command is never replayed.
                _LOGGER.warning("Retained message on %s ignored (not replayed)", message.topic)
                self.ack(delivery)
                return
            if not handler(message.topic, bytes(message.payload), delivery):
                self.ack(delivery)  # answered without room for it: never sent again
        except Exception:
            _LOGGER.exception("Handling a message on %s failed; it is dropped", message.topic)
            self.ack(delivery)  # an unacknowledged message would hold a receive slot for good

    def _note(self, error: str) -> None:
        """The link's last problem (for the state), from another part of it."""
        self.last_error = error


def _gate(connected: threading.Event, room: Callable[[], bool] | None) -> Gate | None:
    """The bounded socket's question, on paho's thread before each packet: a session's next
    packet waits for `room` (its CONNACK never does); None without `room`."""
    if room is None:
        return None
    return lambda: not connected.is_set() or room()


def _on_socket_open(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    try:
        # Without it every small packet can wait ~40 ms for a delayed ACK (platform notes).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):
        _LOGGER.debug("TCP_NODELAY not set", exc_info=True)


def _on_socket_register_write(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Nothing to do: the network thread's select() sees the pending write."""
