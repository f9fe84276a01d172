"""The Sparkplug B edge node in the composition: its session's events decided by
`protocol.sparkplug` and carried out on the loop's thread. A command becomes the typed events the
agent's own topics become (`SpeakReceived` of a `SpeakRequest` built by the speak rules'
`finish_request`, `StopRequested`, `AckRequested`, `VolumeRequested`), with `source` sparkplug
and nothing to acknowledge, so it meets the same admission and bounds in the core. One command
is one unit of work, however many metrics it writes: at most one of each (`Command`), its
refusals answered together in `Last error` and one `rejected` event on the agent's events topic
(id `spb-...`), never by dropping the session. See docs/sparkplug.md.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core.messages import (
    AckRequested,
    Delivery,
    Event,
    Lifecycle,
    Notify,
    Priority,
    Rejection,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
    VolumeRequested,
)
from agent.core.reasons import Reason
from agent.core.waiting import rejected
from agent.link.sparkplug.session import BdSeq, SparkplugEvent, SparkplugLink
from agent.protocol.inputs import (
    SparkplugCommand,
    SparkplugConnected,
    SparkplugHostState,
    SparkplugLost,
)
from agent.protocol.payloads import SpeakLimits, finish_request, number_in
from agent.protocol.sparkplug import (
    MAX_REFUSAL_CHARS,
    Command,
    EdgeNode,
    HostMarks,
    SparkplugTopics,
    Verdict,
    Write,
    host_state,
)
from agent.settings.declarations import AgentConfig
from agent.system.clock import clock_sync

_LOGGER = logging.getLogger(__name__)

SOURCE = "sparkplug"
"""The `source` of a Sparkplug request and of its events."""
_NOTHING_TO_ACK = Delivery(0, 0)
"""A Sparkplug command is acknowledged by the session on arrival (QoS 0 or paho's own QoS 1
acknowledgement): nothing is left for the loop to acknowledge."""


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _clock_known() -> bool:
    sync = clock_sync()
    return sync is not None and sync.synchronized


class SparkplugNode:
    """The edge node: its session (`link`), its decisions (`edge`) and what its commands become.
    Only the loop's thread calls it (but `link`'s own callbacks, and `urgency`)."""

    def __init__(
        self,
        config: AgentConfig,
        on_event: Callable[[SparkplugEvent], None],
        storage: Path | None,
        *,
        clock_known: Callable[[], bool] = _clock_known,
    ) -> None:
        spark = config.sparkplug
        edge_id = spark.edge_node_id or config.node_id
        self.topics = SparkplugTopics(spark.group_id, edge_id, spark.device_id)
        self.edge = EdgeNode(self.topics, spark.priority)
        self._limits = SpeakLimits(config.speak.max_payload_bytes, config.speak.max_text_chars)
        self._primary = spark.primary_host_id
        self._clock_known = clock_known
        self._host_online = False
        self._server = ""
        self._marks: dict[str, HostMarks] = {}
        """Per server, what counted of the primary host's STATEs (a host has a session, and
        STATE timestamps, of its own on each server)."""
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

    def urgency(self, event: SparkplugCommand) -> int:
        """The inbox rank of a command (on the session's thread): the class of its Speak when
        that is alarm or critical, else 0 (reads the Priority the loop keeps: one attribute)."""
        label = event.command.speaks_at(self.edge.priority)
        priority = Priority[label.upper()] if label else Priority.INFO
        return int(priority) if priority >= Priority.ALARM else 0

    def state_published(self, payload: bytes) -> None:
        """The agent published its state: the host hears what changed."""
        try:
            state = json.loads(payload)
        except ValueError:
            return
        if isinstance(state, dict):
            self._state = state
            self._send(self.edge.changed(state, _wall_ms()))

    def handle(self, event: SparkplugEvent) -> list[Event | Notify]:
        """One event of the session; what the loop must still handle (a command's requests and
        its refusal's event)."""
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
            case SparkplugCommand(command):
                return self._command(command)
        return []

    def _birth(self) -> None:
        self._send(self.edge.birth(self._state, _wall_ms()))

    def _host(self, payload: bytes) -> None:
        """The primary host's STATE: born once it is online; gone to the next server when it
        goes offline. A STATE older than the last one that counted is ignored (Sparkplug 3.0),
        and so is one stamped implausibly far ahead (`HostMarks.judge`)."""
        parsed = host_state(payload)
        if parsed is None:
            return
        online, stamp = parsed
        marks = self._marks.setdefault(self._server, HostMarks())
        verdict = marks.judge(
            online, stamp, _wall_ms(), time.monotonic() * 1000, clock_known=self._clock_known()
        )
        if verdict is Verdict.IMPLAUSIBLE:
            _LOGGER.warning(
                "A STATE of the primary host %s stamped %d is implausible (more than 5 minutes "
                "ahead of this node's clock, after 2100, or negative): ignored",
                self._primary,
                stamp,
            )
        elif verdict is Verdict.ONLINE:
            self._host_online = True
            if not self.edge.born:
                self._birth()
        elif verdict is Verdict.OFFLINE and self._host_online:
            _LOGGER.warning("The primary host %s went offline: next server", self._primary)
            self._host_online = False
            self.edge.born = False
            self.link.next_server()

    def _command(self, command: Command) -> list[Event | Notify]:
        """What one command becomes, in this order: its Priority kept, a Stop, a Volume, an
        Acknowledge, its Speak; a Rebirth, a Next Server. Its refusals: one answer."""
        out: list[Event | Notify] = []
        refused = [(r.label, r.reason) for r in command.refused]
        reason = Reason.INVALID_FIELD
        values = command.values
        if isinstance(priority := values.get(Write.PRIORITY), str):
            self.edge.priority = priority  # checked against the classes when read
        if command.asks(Write.STOP):
            out.append(StopRequested(False, _NOTHING_TO_ACK))
        if Write.VOLUME in values:
            volume = number_in(values[Write.VOLUME], 0.0, 1.0)
            if volume is None:
                refused.append(("Volume", "expected a number from 0 to 1"))
            else:
                out.append(VolumeRequested(volume, _NOTHING_TO_ACK))
        if command.asks(Write.ACKNOWLEDGE):
            out += [AckRequested(i, _NOTHING_TO_ACK) for i in self._repeating()]
        if isinstance(text := values.get(Write.SPEAK), str):
            speak = self._speak(text)
            if isinstance(speak, Rejection):  # the speak rules' reason is the answer's
                refused.insert(0, ("Speak", f"{speak.reason}: {speak.detail}"))
                reason = speak.reason
            else:
                out.append(speak)
        if command.asks(Write.REBIRTH):
            self._birth()
        if command.asks(Write.NEXT_SERVER):
            self.edge.born = False
            self.link.next_server()
        if refused:
            out.append(self._refused(refused, reason))
        self._send(self.edge.changed(self._state, _wall_ms()))
        return out

    def _speak(self, text: str) -> SpeakReceived | Rejection:
        """A Speak as the speak rules make a request of its text (cleaned, bounded, SSML read
        as SSML), at the Priority kept."""
        request = SpeakRequest(
            _id(), text, priority=Priority[self.edge.priority.upper()], source=SOURCE
        )
        finished = finish_request(request, self._limits)
        if isinstance(finished, Rejection):
            return finished
        self.edge.spoken = text[:255]
        return SpeakReceived(finished, _NOTHING_TO_ACK)

    def _repeating(self) -> list[str]:
        """The ids of the announcements that repeat, as the state last said."""
        repeating = self._state.get("repeating")
        return [i for i in repeating if isinstance(i, str)] if isinstance(repeating, list) else []

    def _refused(self, refusals: list[tuple[str, str]], reason: Reason) -> Notify:
        """One answer for every refusal of a command: `Last error` and one `rejected` event."""
        text = "; ".join(f"{label}: {why}" for label, why in refusals)
        text = text if len(text) <= MAX_REFUSAL_CHARS else text[: MAX_REFUSAL_CHARS - 3] + "..."
        request_id = _id()
        self.edge.refuse(text, request_id)
        _LOGGER.warning("Sparkplug command refused: %s", text)
        answer = rejected(Rejection(request_id, reason, text))
        return Notify(answer.id, Lifecycle.REJECTED, {**answer.details, "source": SOURCE})

    def _send(self, messages: list[tuple[str, bytes]]) -> None:
        for topic, payload in messages:
            self.link.publish(topic, payload)


def _id() -> str:
    return f"spb-{uuid.uuid4().hex[:16]}"
