"""The Sparkplug B edge node in the composition: its session's events decided by
`protocol.sparkplug` and carried out on the loop's thread. A command becomes the same message
the agent's own topics take (a speak JSON, a stop, an ack, a volume), through the same routes,
so it meets the same refusals and bounds; what cannot be carried out is answered in `Last error`
and with a `rejected` event on the agent's events topic (id `spb-...`), never by dropping the
session. See docs/sparkplug.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.core.messages import Delivery, Lifecycle, Notify
from agent.core.reasons import Reason
from agent.link.sparkplug_link import BdSeq, SparkplugEvent, SparkplugLink
from agent.protocol.inputs import (
    SparkplugCommand,
    SparkplugConnected,
    SparkplugHostState,
    SparkplugLost,
)
from agent.protocol.routes import Route, RoutedEvent
from agent.protocol.sparkplug import (
    EdgeNode,
    Refused,
    SparkplugTopics,
    Write,
    Written,
    host_state,
    read_command,
)
from agent.protocol.topics import Topics
from agent.settings.declarations import CLASSES, AgentConfig

_LOGGER = logging.getLogger(__name__)

NODE_WRITES = frozenset({Write.REBIRTH, Write.NEXT_SERVER})
DEVICE_WRITES = frozenset(
    {Write.SPEAK, Write.PRIORITY, Write.STOP, Write.ACKNOWLEDGE, Write.VOLUME}
)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class SparkplugNode:
    """The edge node: its session (`link`), its decisions (`edge`) and the routes its commands
    take. Only the loop's thread calls it (but `link`'s own callbacks)."""

    def __init__(
        self,
        config: AgentConfig,
        topics: Topics,
        routes: Mapping[str, Route],
        on_event: Callable[[SparkplugEvent], None],
        storage: Path | None,
    ) -> None:
        spark = config.sparkplug
        edge_id = spark.edge_node_id or config.node_id
        self.topics = SparkplugTopics(spark.group_id, edge_id, spark.device_id)
        self.edge = EdgeNode(self.topics, spark.priority)
        self._agent_topics = topics
        self._routes = routes
        self._primary = spark.primary_host_id
        self._host_online = False
        self._server = ""
        self._online_at: dict[str, int] = {}
        """Per server, the timestamp of the primary host's last STATE online that counted (a
        host has a session, and STATE timestamps, of its own on each server)."""
        self._offline_at: dict[str, int] = {}
        """Per server, the timestamp of its last STATE offline that counted: an online older
        than it (a retained message from before) does not count."""
        self._state: dict[str, Any] = {}
        path = None if storage is None else storage / f"sparkplug-{config.node_id}.bdseq"
        self.link = SparkplugLink(
            config.mqtt,
            spark,
            self.topics,
            f"voice-agent-{config.node_id}-spb",
            bd_seq=BdSeq(path),
            on_event=on_event,
        )

    def state_published(self, payload: bytes) -> None:
        """The agent published its state: the host hears what changed."""
        try:
            state = json.loads(payload)
        except ValueError:
            return
        if isinstance(state, dict):
            self._state = state
            self._send(self.edge.changed(state, _wall_ms()))

    def handle(self, event: SparkplugEvent) -> list[RoutedEvent | Notify]:
        """One event of the session; what the loop must still handle (a command's requests,
        the refusals' events)."""
        match event:
            case SparkplugConnected(bd_seq, server):
                self.edge.bd_seq, self.edge.born = bd_seq, False
                self._host_online, self._server = False, server
                if not self._primary:
                    self._birth()
            case SparkplugLost():
                self.edge.born = False
            case SparkplugHostState(payload):
                self._host(payload)
            case SparkplugCommand(device, payload):
                return self._command(device, payload)
        return []

    def _birth(self) -> None:
        self._send(self.edge.birth(self._state, _wall_ms()))

    def _host(self, payload: bytes) -> None:
        """The primary host's STATE: born once it is online; gone to the next server when it
        goes offline. A STATE older than the last one that counted is ignored (Sparkplug 3.0:
        an online older than an offline, or an offline older than the online)."""
        parsed = host_state(payload)
        if parsed is None:
            return
        online, stamp = parsed
        online_at = self._online_at.get(self._server, -1)
        offline_at = self._offline_at.get(self._server, -1)
        if online and stamp >= offline_at and stamp >= online_at:
            self._host_online, self._online_at[self._server] = True, stamp
            if not self.edge.born:
                self._birth()
        elif not online and stamp >= online_at:
            self._offline_at[self._server] = max(offline_at, stamp)
            if self._host_online:
                _LOGGER.warning("The primary host %s went offline: next server", self._primary)
                self._host_online = False
                self.edge.born = False
                self.link.next_server()

    def _command(self, device: bool, payload: bytes) -> list[RoutedEvent | Notify]:
        out: list[RoutedEvent | Notify] = []
        writes = read_command(payload, DEVICE_WRITES if device else NODE_WRITES)
        for write in writes:
            if isinstance(write, Refused):
                out.append(self._refused(write.label, write.reason))
            else:
                out += self._carry_out(write)
        self._send(self.edge.changed(self._state, _wall_ms()))
        return out

    def _carry_out(self, write: Written) -> list[RoutedEvent | Notify]:
        metric, value = write.metric, write.value
        topics = self._agent_topics
        match metric.write:
            case Write.SPEAK:
                self.edge.wrote(metric, value)
                body = {"id": _id(), "text": value, "priority": self.edge.priority}
                return [self._route(topics.speak, json.dumps(body).encode())]
            case Write.PRIORITY:
                if value not in CLASSES:
                    return [self._refused(metric.name, f"expected one of {', '.join(CLASSES)}")]
                self.edge.wrote(metric, value)
            case Write.STOP if value is True:
                return [self._route(topics.stop, b"")]
            case Write.ACKNOWLEDGE if value is True:
                repeating = self._state.get("repeating")
                ids = (
                    [i for i in repeating if isinstance(i, str)]
                    if isinstance(repeating, list)
                    else []
                )
                return [self._route(topics.ack, i.encode()) for i in ids]
            case Write.VOLUME:
                assert isinstance(value, int | float)  # noqa: S101 - read_command's type check
                return [self._route(topics.volume, f"{value:.6f}".encode())]
            case Write.REBIRTH if value is True:
                self._birth()
            case Write.NEXT_SERVER if value is True:
                self.edge.born = False
                self.link.next_server()
        return []

    def _route(self, topic: str, payload: bytes) -> RoutedEvent:
        """A command's message through the route of the agent's own topic (QoS 0: nothing to
        acknowledge)."""
        fingerprint = hashlib.blake2b(b"spb\0" + payload, digest_size=16).hexdigest()
        return self._routes[topic](topic, payload, Delivery(0, 0, False, fingerprint, None))

    def _refused(self, label: str, reason: str) -> Notify:
        request_id = _id()
        self.edge.refuse(label, reason, request_id)
        _LOGGER.warning("Sparkplug command refused: %s: %s", label, reason)
        details = {
            "reason": str(Reason.INVALID_FIELD),
            "detail": f"{label}: {reason}",
            "source": "sparkplug",
        }
        return Notify(request_id, Lifecycle.REJECTED, details)

    def _send(self, messages: list[tuple[str, bytes]]) -> None:
        for topic, payload in messages:
            self.link.publish(topic, payload)


def _id() -> str:
    return f"spb-{uuid.uuid4().hex[:16]}"
