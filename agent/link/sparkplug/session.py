"""The Sparkplug B edge node's own MQTT session (docs/sparkplug.md), beside the agent's link.

Sparkplug asks for a clean session whose Will is the NDEATH: each CONNECT is a new paho client
(MQTT 3.1.1, which every broker of a plant speaks, RabbitMQ's included) with the next `bdSeq`
in its Will. `bdSeq` is kept in a file of the storage directory (`BdSeq`: read and written
without following links, bounded, a file of any other kind replaced), so that the NDEATH of the
session before a restart never matches the NBIRTH after it. The servers are tried in order of
`mqtt.hosts` on the agent's own ring (`servers.Ring`: the next after a failed connect, a lost
session, a `Node Control/Next Server` or the primary host going offline; a short delay within a
round, backoff after a failed round), with the same TLS contexts and each server's own
credentials.

Each connection holds a packet above `MAX_PACKET_BYTES` (a command's 64 KiB and its topic) off
from its fixed header (`bounded_socket`): a PUBLISH comes without its payload, thrown away
unread, and a command that large is refused as one (`Last error`, a `rejected` event), the
session kept; any other packet that large ends the session (the broker publishes the NDEATH) and
the next begins.

Its thread runs paho's loop; the callbacks read a command (`protocol.sparkplug.command_of`) and
hand events to the loop (`on_event`), which decides (`protocol.sparkplug`) and publishes through
`publish`. Leaving a server (`next_server`, `stop`) is the session thread's work: the loop only
asks, never waits.
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

from agent.guarded import nofollow
from agent.link.mqtt.bounded_socket import BoundedClient
from agent.link.mqtt.servers import V311, Ring, Step, credentials, delay, passwords, tls_contexts
from agent.protocol.inputs import (
    SparkplugCommand,
    SparkplugConnected,
    SparkplugHostState,
    SparkplugLost,
)
from agent.protocol.sparkplug import (
    MAX_COMMAND_BYTES,
    SparkplugTopics,
    command_of,
    node_death,
    state_topic,
    too_large,
)
from agent.settings.declarations import CLASSES, MqttConfig, SparkplugConfig, servers

_LOGGER = logging.getLogger(__name__)

SparkplugEvent = SparkplugConnected | SparkplugLost | SparkplugCommand | SparkplugHostState
_CONNACK_TIMEOUT: Final = 10.0
_STABLE_S: Final = 30.0
"""A session that lasted this long resets the pause before the next."""


MAX_PACKET_BYTES: Final = MAX_COMMAND_BYTES + 4096
"""The largest packet the session takes: a command of 64 KiB with its topic and header."""
_GOODBYE_S: Final = 2.0
"""How long the session thread waits for the broker's acknowledgement of the NDEATH."""
_MAX_BDSEQ_FILE_BYTES: Final = 16


class BdSeq:
    """The birth/death sequence number, 0-255, kept across restarts in a file of the storage
    directory (None: memory only), read and written without following a link. A file that is
    not a regular one (a link, a FIFO, a directory), too large, without a number in it or cut
    short (no line end) is not used: a fresh random value is (unlikely to match the last
    NDEATH), with a warning (`problem`); the next `take` writes a regular file in its place (a
    link is replaced, never followed). Nothing here blocks: a FIFO is never opened."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._next = 0
        self.problem: str | None = None
        """Why the stored value was not used (None: it was, or there was none)."""
        if path is not None:
            value = self._read(path)
            self._next = secrets.randbelow(256) if value is None else value
            if self.problem:
                _LOGGER.warning("Sparkplug bdSeq: %s; starting at %d", self.problem, self._next)

    def _read(self, path: Path) -> int | None:
        data = self._bytes(path)
        if data is None:
            return None
        text = data.decode("ascii", "replace").strip()
        if len(data) > _MAX_BDSEQ_FILE_BYTES or not text.isdigit() or len(text) > 3:
            self.problem = f"{path} holds no number of 0-255 ({len(data)} bytes)"
            return None
        if not data.endswith(b"\n"):  # written whole with its line end: this one was cut
            self.problem = f"{path} is truncated (no line end)"
            return None
        return int(text) % 256

    def _bytes(self, path: Path) -> bytes | None:
        """The file's first bytes (b"0\n" when there is none yet); None, with `problem`, when
        it is no regular file or cannot be read."""
        try:
            directory = nofollow.open_directory(path.parent)
        except OSError as err:
            self.problem = f"its directory cannot be used ({err.strerror or err})"
            return None
        try:
            found = nofollow.kind(directory, path.name)
            if found is None:
                return b"0\n"  # the node's first session
            if found != "file":
                self.problem = f"{path} is {_KINDS.get(found, found)}, not a file: not read"
                return None
            return nofollow.read_file(directory, path.name, _MAX_BDSEQ_FILE_BYTES)
        except OSError as err:
            self.problem = f"{path} cannot be read ({err.strerror or err})"
            return None
        finally:
            os.close(directory)

    def take(self) -> int:
        """The number of the CONNECT about to be made; the next one is stored."""
        taken = self._next
        self._next = (taken + 1) % 256
        if self._path is not None:
            try:
                directory = nofollow.open_directory(self._path.parent)
                try:
                    data = f"{self._next}\n".encode("ascii")
                    nofollow.write_file_atomic(directory, self._path.name, data)
                finally:
                    os.close(directory)
            except OSError as err:
                _LOGGER.warning("Cannot keep the Sparkplug bdSeq in %s: %s", self._path, err)
        return taken


_KINDS: Final = {
    "symlink": "a symbolic link",
    "directory": "a directory",
    "other": "a FIFO, socket or device",
}


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
        self._passwords = passwords(self._ring.servers)
        self._step = Step.ROUND
        self._stopping = threading.Event()
        self._leaving = threading.Event()
        """Asked by the loop: leave this server with an NDEATH (the session thread does it)."""
        self._client: mqtt.Client | None = None
        self._lock = threading.Lock()
        self._session_bd_seq = 0
        self._cut: dict[tuple[str, int], int] = {}
        """PUBLISHes over the bound, by topic and packet id (paho's thread only)."""
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
        if client is not None and not self._leaving.is_set():
            client.publish(topic, payload, qos=0, retain=False)

    def next_server(self) -> None:
        """Leave this server (with an NDEATH) for the next one: asked, not waited for (the
        session thread publishes the NDEATH, waits for its acknowledgement and disconnects)."""
        self._leaving.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Publish the NDEATH, disconnect and join the thread."""
        self._stopping.set()
        self._leaving.set()
        self._thread.join(timeout)

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
            self._serve(client)  # until the session ends
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

    def _serve(self, client: mqtt.Client) -> None:
        """paho's loop until the session ends, or until the loop asks to leave: then the NDEATH,
        its acknowledgement awaited here (at most `_GOODBYE_S`), and the disconnect."""
        while not self._leaving.is_set():
            if client.loop(timeout=0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return
        with self._lock:
            bd_seq = self._session_bd_seq
        info = client.publish(
            self._topics.ndeath, node_death(bd_seq, self._wall_ms()), qos=1, retain=False
        )
        deadline = time.monotonic() + _GOODBYE_S
        while not info.is_published() and time.monotonic() < deadline:
            if client.loop(timeout=0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                break
        if not info.is_published():
            _LOGGER.debug("NDEATH not acknowledged before disconnecting")
        client.disconnect()
        for _ in range(20):  # the DISCONNECT written and the socket closed
            if client.loop(timeout=0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                break

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
        client = BoundedClient(
            CallbackAPIVersion.VERSION2,
            # a client id of its own per CONNECT: a clean session needs nothing of the last one,
            # and a broker that still holds the last one where it cannot reach it (RabbitMQ: on
            # a node that was killed) would refuse the same id elsewhere
            client_id=f"{self._client_id}-{secrets.token_hex(3)}",
            protocol=MQTTProtocolVersion.MQTTv311,
            clean_session=True,
            reconnect_on_failure=False,
            max_packet_bytes=MAX_PACKET_BYTES,
            refused=lambda size: self._refused_packet(server.address, size),
            cut=self._cut_packet,
        )
        client.suppress_exceptions = True
        credentials(client, server, self._passwords[index])
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
        self._leaving.clear()  # a leave asked for the session before is done
        if self._stopping.is_set():
            self._leaving.set()
        self.server = address
        _LOGGER.info("Sparkplug session on %s (bdSeq %d)", address, bd_seq)
        self._on_event(SparkplugConnected(bd_seq, address))
        return client

    @staticmethod
    def _refused_packet(address: str, size: int) -> None:
        _LOGGER.warning(
            "%s announced a packet of %d bytes to the Sparkplug session, over its %d: refused "
            "before its body was read, session closed (its NDEATH follows)",
            address,
            size,
            MAX_PACKET_BYTES,
        )

    def _cut_packet(self, topic: str, mid: int, size: int) -> None:
        """On paho's thread: a PUBLISH over the bound comes without its payload."""
        self._cut[(topic, mid)] = size

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        """On paho's thread: a command read (bounded: the packet's size was checked before),
        a STATE handed on as bytes, nothing more."""
        try:
            cut = self._cut.pop((message.topic, message.mid if message.qos else 0), None)
            if message.topic in (self._topics.dcmd, self._topics.ncmd):
                device = message.topic == self._topics.dcmd
                payload = bytes(message.payload)  # at most MAX_PACKET_BYTES
                if cut is None:
                    command = command_of(payload, device=device, classes=CLASSES)
                else:
                    command = too_large(cut, device=device)
                self._on_event(SparkplugCommand(command))
            elif cut is not None:
                _LOGGER.warning("A STATE of %d bytes was thrown away unread", cut)
            else:
                self._on_event(SparkplugHostState(bytes(message.payload)))
        except Exception:
            _LOGGER.exception("A Sparkplug message on %s was dropped", message.topic)
