"""Operator side of model updates over MQTT: offer a release to a node, a group or the fleet,
collect the results, and roll out in stages (canaries first, halting at a failure threshold)."""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.states import FINAL_PHASES, GOOD_PHASES, UpdatePhase

FINAL: Final = FINAL_PHASES
"""Update states after which a node is done with an offer."""
GOOD: Final = GOOD_PHASES


class Fleet:
    """A real MQTT client that offers releases and watches the nodes' update events."""

    def __init__(self, host: str, port: int, prefix: str = "voice") -> None:
        self.prefix = prefix
        self._states: dict[str, dict[str, dict[str, Any]]] = {}  # offer -> node -> last event
        self._lock = threading.Lock()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"ota-fleet-{uuid.uuid4().hex[:8]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.on_message = self._on_message
        subscribed = threading.Event()
        self._client.on_subscribe = lambda *_args: subscribed.set()
        self._client.connect(host, port)
        self._client.subscribe(f"{prefix}/+/events", qos=1)
        self._client.loop_start()
        if not subscribed.wait(10):
            raise ConnectionError(f"no SUBACK from {host}:{port}")

    def _on_message(self, _client: mqtt.Client, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            event = json.loads(message.payload)
        except ValueError:
            return
        if not isinstance(event, dict) or event.get("event") != "update":
            return
        node = message.topic.split("/")[-2]
        with self._lock:
            self._states.setdefault(str(event.get("id")), {})[node] = event

    def offer(self, topic_target: str, envelope: bytes, base_url: str, offer_id: str) -> None:
        """Publish an offer on `<prefix>/<target>/ota` (target: a node id, `group/<g>`, `all`)."""
        body = {"id": offer_id, "manifest": json.loads(envelope), "base_url": base_url}
        info = self._client.publish(f"{self.prefix}/{topic_target}/ota", json.dumps(body), qos=1)
        info.wait_for_publish(10)

    def command(self, node: str, body: dict[str, Any]) -> None:
        """Send `{"rollback": true}` or `{"cancel": true}` to a node."""
        info = self._client.publish(f"{self.prefix}/{node}/ota", json.dumps(body), qos=1)
        info.wait_for_publish(10)

    def states(self, offer_id: str) -> dict[str, dict[str, Any]]:
        """The last update event of each node for this offer."""
        with self._lock:
            return dict(self._states.get(offer_id, {}))

    def wait(
        self,
        offer_id: str,
        nodes: Sequence[str],
        timeout: float,
        progress: Callable[[str], None] = print,
    ) -> dict[str, str]:
        """Wait until every node reached a final state (or the timeout); node -> state."""
        deadline = time.monotonic() + timeout
        shown = ""
        while True:
            states = self.states(offer_id)
            final = {
                n: str(states[n]["state"]) for n in nodes if states.get(n, {}).get("state") in FINAL
            }
            line = f"{offer_id}: {len(final)}/{len(nodes)} done, " + ", ".join(
                f"{state} {list(final.values()).count(state)}"
                for state in sorted(set(final.values()))
            )
            if line != shown:
                progress(line)
                shown = line
            if len(final) == len(nodes) or time.monotonic() > deadline:
                return {n: final.get(n, "timeout") for n in nodes}
            time.sleep(0.2)

    def close(self) -> None:
        """Disconnect."""
        self._client.loop_stop()
        self._client.disconnect()


@dataclass
class Rollout:
    """What a staged rollout did."""

    canary: dict[str, str] = field(default_factory=dict)
    rest: dict[str, str] = field(default_factory=dict)
    halted: bool = False
    rolled_back: list[str] = field(default_factory=list)


def rollout(
    fleet: Fleet,
    nodes: Sequence[str],
    envelope: bytes,
    base_url: str,
    *,
    canary_share: float = 0.2,
    failure_threshold: float = 0.1,
    timeout: float = 600.0,
    progress: Callable[[str], None] = print,
) -> Rollout:
    """Offer to a canary share of the nodes; if their failure share stays at or under the
    threshold, offer to the rest; otherwise halt and roll the canaries back."""
    ordered = sorted(nodes)
    count = max(1, math.ceil(canary_share * len(ordered)))
    canaries, rest = ordered[:count], ordered[count:]
    name = f"rollout-{uuid.uuid4().hex[:8]}"
    result = Rollout()
    progress(f"canaries: {', '.join(canaries)}")
    for node in canaries:
        fleet.offer(node, envelope, base_url, f"{name}-canary")
    result.canary = fleet.wait(f"{name}-canary", canaries, timeout, progress)
    failed = [n for n, state in result.canary.items() if state not in GOOD]
    if len(failed) / len(canaries) > failure_threshold:
        result.halted = True
        progress(f"halted: {len(failed)} of {len(canaries)} canaries failed ({', '.join(failed)})")
        for node, state in result.canary.items():
            if state == UpdatePhase.INSTALLED:
                fleet.command(node, {"id": f"{name}-rollback", "rollback": True})
                result.rolled_back.append(node)
        if result.rolled_back:
            fleet.wait(f"{name}-rollback", result.rolled_back, timeout, progress)
        return result
    progress(f"canaries good; offering to the other {len(rest)}")
    for node in rest:
        fleet.offer(node, envelope, base_url, f"{name}-rest")
    if rest:
        result.rest = fleet.wait(f"{name}-rest", rest, timeout, progress)
    return result
