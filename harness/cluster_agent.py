"""The real agent on the three-node RabbitMQ cluster (harness/rabbitmq.py), and the MQTT 3.1.1
clients the tests around it need (RabbitMQ 3.10 speaks nothing else; harness.mqtt's Watcher is
MQTT 5): a recording client on one node, the retained messages of each node, a steady numbered
sequence of speak messages, and what the agent's log says about its connections.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.protocol.topics import Topics

from .agent import AgentProcess, agent_config, write_config
from .mqtt import Received
from .rabbitmq import RabbitCluster, RabbitNode
from .wait import TIMEOUT, wait_until

QUIET: Final = 3.0
"""Seconds to wait to see that nothing arrives (a delivery on loopback takes milliseconds)."""


def configure(cluster: RabbitCluster, *lines: str) -> RabbitCluster:
    """Add rabbitmq.conf lines to every node of a cluster not started yet (e.g.
    `mqtt.sparkplug = true`, `mqtt.durable_queue_type = quorum`)."""
    for node in cluster.nodes:
        text = node.config.read_text(encoding="utf-8")
        node.config.write_text(text + "".join(f"{line}\n" for line in lines), encoding="utf-8")
    return cluster


def address(node: RabbitNode) -> str:
    """host:port of the node's MQTT listener (as the agent's log and `--broker` write it)."""
    return f"{node.host}:{node.mqtt_port}"


class Client311:
    """A paho MQTT 3.1.1 client on one node that records every message of its subscriptions
    (subscribed again at each reconnect) and publishes at QoS 1."""

    def __init__(
        self, node: RabbitNode, *topics: str, client_id: str = "", clean: bool = True
    ) -> None:
        self.node = node
        self.messages: list[Received] = []
        self._topics = topics
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv311,
            clean_session=clean,
        )
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = lambda *_args: self._subscribed.set()
        self._client.on_message = self._on_message
        self._client.reconnect_delay_set(1, 2)
        self._client.connect(node.host, node.mqtt_port, keepalive=30)
        self._client.loop_start()
        if topics:
            assert self._subscribed.wait(30), f"no SUBACK from {node.name}"

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure and self._topics:
            client.subscribe([(t, 1) for t in self._topics])

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            received = Received(msg.topic, bytes(msg.payload), bool(msg.retain), time.time())
            self.messages.append(received)

    def snapshot(self) -> list[Received]:
        """A copy of what arrived so far."""
        with self._lock:
            return list(self.messages)

    def events(self, request_id: str | None = None) -> list[dict[str, Any]]:
        """The lifecycle events seen so far (optionally of one request id)."""
        found = [m.json() for m in self.snapshot() if m.topic.endswith("/events")]
        return [e for e in found if request_id is None or e.get("id") == request_id]

    def wait_event(self, request_id: str, event: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait for one event of a request id, and return it."""

        def found() -> list[dict[str, Any]]:
            return [e for e in self.events(request_id) if e.get("event") == event]

        wait_until(lambda: bool(found()), timeout, f"{event} of {request_id}")
        return found()[0]

    def publish(
        self, topic: str, payload: bytes, *, retain: bool = False, wait: bool = True
    ) -> mqtt.MQTTMessageInfo:
        """Publish at QoS 1 (with `wait`, until the node's PUBACK)."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if wait:
            info.wait_for_publish(30)
            assert info.is_published(), f"no PUBACK from {self.node.name}"
        return info

    def close(self) -> None:
        """Disconnect (a DISCONNECT packet: no will)."""
        self._client.disconnect()
        self._client.loop_stop()


def retained(nodes: Iterable[RabbitNode], topic: str) -> dict[str, list[bytes]]:
    """What a new subscriber with `topic` as its filter gets on each node: the retained payloads
    (RabbitMQ keeps them per node), by node name. Asked of all nodes at once."""

    def one(node: RabbitNode) -> list[bytes]:
        client = Client311(node, topic)
        try:
            time.sleep(QUIET)  # a retained message comes right after the SUBACK, if at all
            return [m.payload for m in client.snapshot() if m.retain and m.topic == topic]
        finally:
            client.close()

    listed = list(nodes)
    with ThreadPoolExecutor(len(listed)) as pool:
        return dict(zip((n.name for n in listed), pool.map(one, listed), strict=True))


@dataclass
class ClusterAgent:
    """`python -m agent run` with `mqtt.hosts` listing the cluster's nodes."""

    process: AgentProcess
    node_id: str
    topics: Topics
    capture: Path
    config: dict[str, Any]

    def log(self) -> str:
        """Everything it logged so far."""
        return self.process.output()

    def connections(self) -> list[Connection]:
        """Its sounder's session's connections so far (the alarm lane and the status), in order,
        as its log tells them; the engine's lines, prefixed `engine`, are not these."""
        return [
            Connection(_when(m["at"]), m["server"], m["version"], m["present"] == "True")
            for m in _CONNECTED.finditer(self.log())
        ]

    def engine_connections(self) -> list[Connection]:
        """Its engine's session's connections so far (every speak but the alarm-class ones),
        in order, as its log tells them (the lines prefixed `engine`)."""
        return [
            Connection(_when(m["at"]), m["server"], m["version"], m["present"] == "True")
            for m in _ENGINE_CONNECTED.finditer(self.log())
        ]

    def sparkplug_sessions(self) -> list[tuple[float, str]]:
        """Its Sparkplug sessions so far (the engine's): (time.time() of the line, host:port)."""
        return [(_when(m["at"]), m["server"]) for m in _SPARKPLUG.finditer(self.log())]

    def lines(self, pattern: str, since: float = 0.0) -> list[str]:
        """Its log lines from `since` (a time.time()) on that contain `pattern`."""
        found = []
        for line in self.log().splitlines():
            stamp = _STAMP.match(line)
            if stamp and _when(stamp[0]) >= since and pattern in line:
                found.append(line)
        return found


@dataclass(frozen=True)
class Connection:
    """One `Connected to ... with MQTT ... (session present: ...)` of the agent's link."""

    at: float
    """time.time() of the log line."""
    server: str
    version: str
    session_present: bool


_TIME: Final = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
_STAMP: Final = re.compile(_TIME)
_CONNECTED: Final = re.compile(
    rf"(?P<at>{_TIME}) INFO agent\.link\.mqtt\.link: Connected to (?P<server>\S+) with MQTT "
    r"(?P<version>\S+) \(session present: (?P<present>True|False)\)"
)
_ENGINE_CONNECTED: Final = re.compile(
    rf"(?P<at>{_TIME}) INFO engine agent\.link\.mqtt\.link: Connected to (?P<server>\S+) with "
    r"MQTT (?P<version>\S+) \(session present: (?P<present>True|False)\)"
)
_SPARKPLUG: Final = re.compile(
    rf"(?P<at>{_TIME}) INFO (?:engine )?agent\.link\.sparkplug\.session: Sparkplug session on "
    r"(?P<server>\S+) "
)


def _when(stamp: str) -> float:
    """A log line's time (the agent logs local time, to the millisecond) as a time.time()."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def log_time(line: str) -> float:
    """The time.time() of one of the agent's log lines."""
    stamp = _STAMP.match(line)
    if stamp is None:
        raise ValueError(f"not a log line: {line!r}")
    return _when(stamp[0])


def start_cluster_agent(
    cluster: RabbitCluster,
    workdir: Path,
    node_id: str,
    voice: Path,
    cache: Path,
    **sections: Mapping[str, Any],
) -> ClusterAgent:
    """Start the agent with the cluster's nodes in `mqtt.hosts` (node 1 first), `mqtt.protocol`
    left at its default, audio to a raw file; `sections` merged over that."""
    capture = workdir / f"{node_id}.raw"
    hosts = [{"host": n.host, "port": n.mqtt_port} for n in cluster.nodes]
    extra = dict(sections)
    extra["mqtt"] = {"hosts": hosts, **extra.get("mqtt", {})}
    extra["tts"] = {"tier": "fp32", **extra.get("tts", {})}  # as tests/conftest.py: no INT8 build
    extra["cache"] = {"dir": str(cache), **extra.get("cache", {})}
    device = f"file:FILE={capture},FORMAT=raw"
    config = agent_config(None, workdir, node_id, voice=voice, device=device, **extra)
    path = write_config(workdir / f"{node_id}.yaml", config)
    process = AgentProcess(path, workdir / f"{node_id}.log")
    process.start()
    return ClusterAgent(process, node_id, Topics("voice", node_id), capture, config)


@dataclass
class Sequence:
    """Numbered speak messages (`<prefix>NNN`, QoS 1, each its own id) published at a steady
    pace by one client, in its own thread, whatever the broker does meanwhile."""

    client: Client311
    topic: str
    prefix: str = "seq"
    pace: float = 0.25
    """Seconds between two publications."""
    sent: list[tuple[str, float, mqtt.MQTTMessageInfo]] = field(default_factory=list)
    """(id, time.time() when published, paho's handle: is_published() once PUBACKed)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sequence:
        """Start publishing."""
        self._thread = threading.Thread(target=self._run, name="sequence", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        number = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            request_id = f"{self.prefix}{number:03d}"
            body = json.dumps({"id": request_id, "text": "Beep."}).encode()
            at = time.time()
            info = self.client.publish(self.topic, body, wait=False)
            self.sent.append((request_id, at, info))
            number += 1
            next_at += self.pace
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        """Stop publishing (the messages in flight keep their chance of a PUBACK)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(TIMEOUT)

    def ids(self, start: float = 0.0, end: float = float("inf")) -> list[str]:
        """The ids published from `start` until `end` (time.time())."""
        return [i for i, at, _ in self.sent if start <= at < end]

    def acknowledged(self) -> set[str]:
        """The ids the publisher's node acknowledged (PUBACK)."""
        return {i for i, _, info in self.sent if info.is_published()}


@dataclass(frozen=True)
class Tally:
    """What became of a sequence, per id, from the agent's events."""

    sent: int
    acknowledged: int
    once: list[str]
    """Finished exactly once."""
    repeated: list[str]
    """Finished more than once (said again): `finished` events of one id that differ (their
    `ts`), not one event delivered twice."""
    lost: list[str]
    """Never finished."""
    lost_acknowledged: list[str]
    """Never finished although the publisher's node acknowledged them."""
    duplicates_rejected: list[str]
    """Answered `rejected` with `duplicate_id` (a copy recognised, not said)."""
    copies: list[str] = field(default_factory=list)
    """Whose `finished` event arrived more than once, byte for byte the same: events are
    delivered at least once (QoS 1: one the lost node delivered before its PUBACK reached the
    agent is sent again on the next node; docs/delivery.md), not said again."""

    def line(self) -> str:
        """The counts in one line."""
        return (
            f"sent {self.sent} (PUBACKed {self.acknowledged}): finished once {len(self.once)}, "
            f"repeated {len(self.repeated)} {self.repeated}, lost {len(self.lost)} "
            f"{_ranges(self.lost)} (of them PUBACKed {len(self.lost_acknowledged)}), "
            f"rejected as duplicates {len(self.duplicates_rejected)}, `finished` delivered "
            f"again (the same event) {len(self.copies)} {self.copies}"
        )


def tally(sequence: Sequence, events: Iterable[dict[str, Any]]) -> Tally:
    """Count the `finished` events of each id of the sequence: a speak said twice has two
    (their `ts` differ); one event delivered twice is one (deduplicated on `id` + `event` +
    `ts`, as docs/delivery.md tells a subscriber to), counted in `copies`."""
    listed = list(events)
    delivered = [(e.get("id"), e.get("ts")) for e in listed if e.get("event") == "finished"]
    finished = Counter(request_id for request_id, _ in set(delivered))
    again = Counter(delivered) - Counter(set(delivered))
    rejected = {
        e.get("id")
        for e in listed
        if e.get("event") == "rejected" and e.get("reason") == "duplicate_id"
    }
    ids = [i for i, _, _ in sequence.sent]
    acked = sequence.acknowledged()
    lost = [i for i in ids if not finished[i]]
    return Tally(
        sent=len(ids),
        acknowledged=len(acked),
        once=[i for i in ids if finished[i] == 1],
        repeated=[i for i in ids if finished[i] > 1],
        lost=lost,
        lost_acknowledged=[i for i in lost if i in acked],
        duplicates_rejected=[i for i in ids if i in rejected],
        copies=[i for i in ids if any(key[0] == i for key in again)],
    )


def _ranges(ids: list[str]) -> str:
    """`seq010..seq041` style runs of consecutive ids, for a short report."""
    if not ids:
        return "[]"
    numbers = [int(re.sub(r"\D", "", i)) for i in ids]
    prefix = re.sub(r"\d+$", "", ids[0])
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return (
        "["
        + ", ".join(
            f"{prefix}{a:03d}" if a == b else f"{prefix}{a:03d}..{prefix}{b:03d}" for a, b in runs
        )
        + "]"
    )
