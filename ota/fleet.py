"""The operator's live view of the fleet over MQTT: the inventory from retained status and state,
the nodes' update events, and offers and commands sent to them.

One paho client. Its network thread only stores what arrives (the inventory keeps each node's
newest payloads, update events wait in a bounded backlog); the payloads are parsed and validated
(`ota.node_messages`) on the thread that reads them, so no payload can stop or stall the network
thread, and an exception in the callback is counted (`unread`), never raised into paho. A
rollout uses a persistent session (MQTT 5 session expiry, clean start off when resuming), so
update events published while the tool was down are delivered when it comes back.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.core.states import FINAL_PHASES, GOOD_PHASES
from ota.connection import BrokerError, BrokerSettings, connect, new_client
from ota.inventory import Inventory
from ota.node_messages import MAX_EVENT_BYTES, UpdateEvent, parse_update_event
from ota.safe_text import say

__all__ = ["FINAL", "GOOD", "Fleet", "UpdateEvent", "offer_body"]

FINAL: Final = FINAL_PHASES
"""Update states after which a node is done with an offer."""
GOOD: Final = GOOD_PHASES
"""Final states that leave a node on the offered release."""
PUBLISH_STALL: Final = 120.0
"""Seconds without a single acknowledgement of pending publications before giving up."""
MAX_BACKLOG_BYTES: Final = 64 * 1024 * 1024
"""Bytes of update events waiting to be read; beyond, events are dropped (and counted)."""


def offer_body(envelope: bytes, base_url: str, offer_id: str) -> dict[str, Any]:
    """The JSON of an offer (docs/updates.md)."""
    return {"id": offer_id, "manifest": json.loads(envelope), "base_url": base_url}


class Fleet:
    """A real MQTT client that knows the inventory, watches update events and sends offers."""

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        client_id: str | None = None,
        clean_start: bool = True,
        session_expiry: int = 0,
        events: bool = True,
    ) -> None:
        self.settings = settings
        self.prefix = settings.prefix
        self.client_id = client_id or f"ota-{uuid.uuid4().hex[:10]}"
        self.inventory = Inventory(settings.prefix)
        self._lock = threading.Lock()
        self._log: list[UpdateEvent] = []
        self._backlog: list[tuple[str, bytes, float]] = []  # (node, payload, at), unparsed
        self._backlog_bytes = 0
        self.dropped = 0
        """Update events not kept: over MAX_EVENT_BYTES, or the backlog was full."""
        self.unread = 0
        """Messages whose handling raised in paho's callback (ignored; the thread goes on)."""
        self._last: dict[str, dict[str, UpdateEvent]] = {}  # offer -> node -> newest event
        self._final: dict[str, dict[str, UpdateEvent]] = {}  # offer -> node -> newest final
        self._subscribed = threading.Event()
        self._synced: set[str] = set()
        self._heard = time.monotonic()
        """When the last message arrived (sync waits while they keep coming)."""
        p = settings.prefix
        self._sync_topic = f"{p}/_ota/{self.client_id}/sync"
        self._topics = [(f"{p}/+/status", 1), (f"{p}/+/state", 1), (self._sync_topic, 1)]
        self._topics.append(("$SYS/broker/connection/+/state", 0))
        if events:
            self._topics.append((f"{p}/+/events", 1))

        def make(protocol: MQTTProtocolVersion) -> mqtt.Client:
            client = new_client(settings, self.client_id, protocol, clean_session=clean_start)
            client.on_message = self._on_message
            client.on_subscribe = lambda *_args: self._subscribed.set()
            return client

        self._client, self.session_present = connect(
            settings, make, clean_start=clean_start, session_expiry=session_expiry
        )
        self._client.on_connect = self._on_reconnect
        self._subscribe()

    def _subscribe(self) -> None:
        self._subscribed.clear()
        self._client.subscribe(self._topics)
        if not self._subscribed.wait(15):
            self.close()
            raise BrokerError(f"no SUBACK from {self.settings.address}")

    def _on_reconnect(
        self, client: mqtt.Client, _userdata: Any, _flags: Any, reason: Any, _props: Any
    ) -> None:
        if not getattr(reason, "is_failure", False):
            client.subscribe(self._topics)

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        """On paho's thread: store, never parse; nothing raised reaches paho."""
        try:
            self._take(message)
        except Exception:  # noqa: BLE001 - a hostile message must not end the network thread
            with self._lock:
                self.unread += 1

    def _take(self, message: mqtt.MQTTMessage) -> None:
        now = time.time()
        with self._lock:
            self._heard = time.monotonic()
        topic, payload = message.topic, bytes(message.payload)
        if topic == self._sync_topic:
            with self._lock:
                self._synced.add(payload[:64].decode("ascii", "replace"))
            return
        node = self.inventory.feed(topic, payload, bool(message.retain), now)
        if node is None or not topic.endswith("/events"):
            return
        with self._lock:
            if len(payload) > MAX_EVENT_BYTES or (
                self._backlog_bytes + len(payload) > MAX_BACKLOG_BYTES
            ):
                self.dropped += 1
                return
            self._backlog.append((node, payload, now))
            self._backlog_bytes += len(payload)

    def _digest(self) -> None:
        """Parse the update events waiting in the backlog (on the reader's thread)."""
        with self._lock:
            waiting, self._backlog, self._backlog_bytes = self._backlog, [], 0
        events = [parse_update_event(node, payload, at) for node, payload, at in waiting]
        with self._lock:
            for event in events:
                if event is None:
                    continue
                self._log.append(event)
                self._last.setdefault(event.offer, {})[event.node] = event
                if event.final:
                    self._final.setdefault(event.offer, {})[event.node] = event

    def sync(self, timeout: float = 10.0) -> bool:
        """Wait until the retained messages of the subscriptions have arrived: a marker the tool
        publishes after its SUBACK comes back after them (the broker keeps one connection's
        messages in order). The wait lasts while messages keep arriving (a large fleet, a slow
        link or a busy broker) and gives up after `timeout` s without any: False then (an ACL
        may forbid the marker)."""
        token = uuid.uuid4().hex
        self._client.publish(self._sync_topic, token, qos=1)
        started = time.monotonic()
        while True:
            with self._lock:
                if token in self._synced:
                    return True
                quiet_since = max(started, self._heard)
            if time.monotonic() - quiet_since > timeout:
                return False
            time.sleep(0.02)

    def take_unread(self) -> int:
        """Messages the callback could not handle since the last call."""
        with self._lock:
            count, self.unread = self.unread, 0
            return count

    def drain(self) -> list[UpdateEvent]:
        """Update events received since the last call, in arrival order."""
        self._digest()
        with self._lock:
            events, self._log = self._log, []
        return events

    def states(self, offer_id: str) -> dict[str, UpdateEvent]:
        """The newest event of each node for an offer."""
        self._digest()
        with self._lock:
            return dict(self._last.get(offer_id, {}))

    def finals(self, offer_id: str) -> dict[str, UpdateEvent]:
        """The newest final event of each node for an offer."""
        self._digest()
        with self._lock:
            return dict(self._final.get(offer_id, {}))

    def send(self, messages: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Publish (target, body) pairs on `<prefix>/<target>/ota` at QoS 1 and wait until the
        broker acknowledged all of them (a busy broker may take long: this waits as long as
        acknowledgements keep coming). Target: a node id, `group/<g>` or `all`."""
        infos = [
            self._client.publish(f"{self.prefix}/{target}/ota", json.dumps(body), qos=1)
            for target, body in messages
        ]
        waiting = len(infos)
        progressed = time.monotonic()
        while waiting:
            infos = [i for i in infos if not i.is_published()]
            if len(infos) < waiting:
                waiting, progressed = len(infos), time.monotonic()
            elif time.monotonic() - progressed > PUBLISH_STALL:
                raise BrokerError(
                    f"the broker at {self.settings.address} acknowledged none of the last "
                    f"{waiting} publications in {PUBLISH_STALL:.0f} s"
                )
            if infos:
                infos[0].wait_for_publish(0.5)

    def offer(self, target: str, envelope: bytes, base_url: str, offer_id: str) -> None:
        """Offer a release on `<prefix>/<target>/ota` (a node id, `group/<g>`, `all`)."""
        self.send([(target, offer_body(envelope, base_url, offer_id))])

    def publish_revocation(self, envelope: bytes) -> None:
        """Publish a signed revocation, retained, on `<prefix>/all/revocation`: every node reads
        it now and at every connect (a node that was down when it was sent included)."""
        info = self._client.publish(f"{self.prefix}/all/revocation", envelope, qos=1, retain=True)
        info.wait_for_publish(PUBLISH_STALL)

    def command(self, node: str, body: dict[str, Any]) -> None:
        """Send `{"id": ..., "rollback": true}` or `{"id": ..., "cancel": true}` to a node."""
        self.send([(node, body)])

    def wait(
        self,
        offer_id: str,
        nodes: Sequence[str],
        timeout: float,
        progress: Callable[[str], None] = say,
    ) -> dict[str, str]:
        """Wait until every node reached a final state (or the timeout); node -> state
        (`timeout` for a node that gave none)."""
        deadline = time.monotonic() + timeout
        shown = ""
        while True:
            final = {n: e.state for n, e in self.finals(offer_id).items() if n in set(nodes)}
            counts = sorted(set(final.values()))
            line = f"{offer_id}: {len(final)}/{len(nodes)} done" + "".join(
                f", {state} {list(final.values()).count(state)}" for state in counts
            )
            if line != shown:
                progress(line)
                shown = line
            if len(final) == len(nodes) or time.monotonic() > deadline:
                return {n: final.get(n, "timeout") for n in nodes}
            time.sleep(0.1)

    def close(self, forget_session: bool = False) -> None:
        """Disconnect; with `forget_session` the broker drops the persistent session now."""
        properties = None
        if forget_session and self._client.protocol == MQTTProtocolVersion.MQTTv5:
            properties = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0
        self._client.disconnect(properties=properties)
        self._client.loop_stop()
