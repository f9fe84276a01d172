"""The shipped ACL (`config/mosquitto-acl.example`) on a real Mosquitto, with a password file made
here: each user may publish and read what its features need, nothing else.

The model: four kinds of user, each with what its features need, derived from the agent's own
code where the code says it (a node's subscriptions are its route table with every feature on;
Home Assistant's commands and reads are the topics of the entities the node announces; Rhasspy's
are the node's Hermes routes and replies; the operator's are the OTA topics and its tool's sync
marker). A matrix test publishes every topic of that universe as every user and reads it back as
every user, and compares with the model; the other tests run the real agent as its node user and
drive each user's publications to their effect, and the forbidden ones to a refusal.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from agent.core.states import HermesKind
from agent.protocol import hermes
from agent.protocol.discovery import (
    CLEAR_QUEUE_PAYLOAD,
    TEST_CHIME_PAYLOAD,
    DeviceInfo,
    discovery_messages,
)
from agent.protocol.hermes import HermesContext
from agent.protocol.routes import route_table
from agent.protocol.topics import Topics
from agent.settings.loading import from_mapping
from harness import ROOT, TIMEOUT, AgentProcess, Broker, agent_config, wait_until, write_config
from harness.fleet_sim import tool
from ota import release

pytestmark = pytest.mark.broker

ACL = ROOT / "config" / "mosquitto-acl.example"
PREFIX = "voice"
NODE, OTHER = "kitchen", "hall"
"""The node under test, and another node of the fleet (an intruder, for the node's topics)."""
GROUP = "downstairs"
HA, RHASSPY, OPERATOR = "homeassistant", "rhasspy", "voice-operator"
SERVICES = (HA, RHASSPY, OPERATOR)
USERS = (NODE, OTHER, *SERVICES)
SYNC = f"{PREFIX}/_ota/ota-acl-test/sync"
"""The operator's tool's sync marker (`<prefix>/_ota/<client id>/sync`, docs/fleet.md)."""
NOT_AUTHORIZED = 135
NO_SUBSCRIBERS = 16
"""PUBACK reason codes: 0 and 16 (accepted, no one subscribed yet), or 135 (refused)."""
PUBLIC_KEY = release.public_text(Ed25519PrivateKey.generate())


def password(user: str) -> str:
    """Each user's password in the test's password file."""
    return f"pw of {user}"


# ---- the model: what each user's features need ----------------------------------------------


def node_config_raw(node: str) -> dict[str, Any]:
    """A node with every feature that uses the broker on: discovery, a speak group, Hermes (its
    site id is its node id, as the ACL asks), model updates with an OTA group."""
    return {
        "node_id": node,
        "speak": {"groups": [GROUP]},
        "hermes": {"enabled": True, "site_id": node},
        "ota": {"trusted_keys": [PUBLIC_KEY], "groups": [GROUP]},
        "homeassistant": {"discovery": True},
    }


def concrete(topic_filter: str) -> str:
    """A topic a filter matches (a request id for `+`)."""
    return topic_filter.replace("+", "r1")


def discovery(node: str) -> list[tuple[str, dict[str, Any]]]:
    """The node's Home Assistant discovery configs, as the agent builds them."""
    device = DeviceInfo(node, node, "0", "maker", "board", {"default": "Default"})
    messages = discovery_messages("homeassistant", Topics(PREFIX, node), device)
    return [(topic, json.loads(payload)) for topic, payload in messages]


@dataclass(frozen=True)
class Needs:
    """Topics a user publishes, and topics it reads."""

    writes: frozenset[str]
    reads: frozenset[str]


def node_needs(node: str) -> Needs:
    """A node reads what its route table subscribes to; it writes its reports, its discovery
    configs and its Hermes replies."""
    config = from_mapping(node_config_raw(node))
    topics = Topics(PREFIX, node)
    routes = route_table(config, topics, lambda: uuid.uuid4().hex).routes
    reads = {concrete(f) for f in routes}
    writes = {topics.status, topics.state, topics.events, topics.result, topics.update}
    writes |= {topic for topic, _ in discovery(node)}
    for kind in HermesKind:
        context = HermesContext(kind, "r1", node, "s1")
        writes |= {hermes.finished(context)[0], hermes.error(context, "e")[0]}
    writes.add(hermes.voices_reply("r1", node, {})[0])
    return Needs(frozenset(writes), frozenset(reads))


def home_assistant_needs(nodes: tuple[str, ...]) -> Needs:
    """Home Assistant writes its entities' command topics and reads their state and availability
    topics (from the node's own discovery configs), reads discovery and sends its birth; its
    automations speak to a node, to every node and to a speak group (speak, stop, ack)."""
    writes = {"homeassistant/status", f"{PREFIX}/all/speak"}
    writes |= {f"{PREFIX}/group/{GROUP}/{command}" for command in ("speak", "stop", "ack")}
    reads: set[str] = set()
    for node in nodes:
        topics = Topics(PREFIX, node)
        writes |= {topics.speak, topics.stop, topics.ack}
        for topic, config in discovery(node):
            reads.add(topic)
            writes |= {v for k, v in config.items() if k == "command_topic"}
            reads |= {v for k, v in config.items() if k in ("state_topic", "availability_topic")}
        reads.add(topics.events)
    return Needs(frozenset(writes), frozenset(reads))


def rhasspy_needs(nodes: tuple[str, ...]) -> Needs:
    """Rhasspy writes what the nodes' Hermes routes take and reads their replies."""
    writes: set[str] = set()
    reads: set[str] = set()
    for node in nodes:
        own = node_needs(node)
        writes |= {t for t in own.reads if t.startswith(("hermes/", "rhasspy/"))}
        reads |= {t for t in own.writes if t.startswith(("hermes/", "rhasspy/"))}
    return Needs(frozenset(writes), frozenset(reads))


def operator_needs(nodes: tuple[str, ...]) -> Needs:
    """The operator's tool offers, cancels and rolls back on the OTA topics, publishes the
    revocation, reads status, state and events, and writes and reads its sync marker."""
    writes = {SYNC, f"{PREFIX}/all/revocation", f"{PREFIX}/all/ota", f"{PREFIX}/group/{GROUP}/ota"}
    reads = {SYNC}
    for node in nodes:
        topics = Topics(PREFIX, node)
        writes.add(topics.ota)
        reads |= {topics.status, topics.state, topics.events}
    return Needs(frozenset(writes), frozenset(reads))


def needs(user: str) -> Needs:
    """What the user's features need, plus what Mosquitto's `pattern` lines give every user
    (the node grants with the user's own name as node id; see the ACL's header). The services
    serve any node: every user name is a node id to them."""
    fleet = USERS
    own = {
        HA: home_assistant_needs(fleet),
        RHASSPY: rhasspy_needs(fleet),
        OPERATOR: operator_needs(fleet),
    }.get(user, Needs(frozenset(), frozenset()))
    as_node = node_needs(user)
    return Needs(own.writes | as_node.writes, own.reads | as_node.reads)


def universe() -> list[str]:
    """Every topic any user needs, of both nodes and of each service user's name."""
    topics: set[str] = set()
    for user in USERS:
        found = needs(user)
        topics |= found.writes | found.reads
    return sorted(topics)


# ---- real clients ------------------------------------------------------------------------------


class UserClient:
    """A paho MQTT 5 client logged in as one user: the broker's answer to each publish (PUBACK
    reason code) and every message it receives."""

    def __init__(self, broker: Broker, user: str, will: tuple[str, bytes] | None = None) -> None:
        self.user = user
        self.messages: list[mqtt.MQTTMessage] = []
        self._acks: dict[int, int] = {}
        self._subscribed: set[int] = set()
        self._connected: list[int] = []
        self._changed = threading.Condition()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{user}-{uuid.uuid4().hex[:6]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.username_pw_set(user, password(user))
        if will is not None:
            self._client.will_set(will[0], will[1], qos=1, retain=True)
        self._client.on_connect = self._on_connect
        self._client.on_publish = self._on_publish
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._client.connect(broker.host, broker.port)
        self._client.loop_start()
        self._wait(lambda: bool(self._connected), "CONNACK")

    @property
    def connack(self) -> int:
        """The broker's CONNACK reason code (0: accepted)."""
        return self._connected[0]

    def _on_connect(self, *args: Any) -> None:
        code: ReasonCode = args[3]
        with self._changed:
            self._connected.append(code.value)
            self._changed.notify_all()

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, code: Any, _p: Any) -> None:
        with self._changed:
            self._acks[mid] = code.value
            self._changed.notify_all()

    def _on_subscribe(self, _client: Any, _userdata: Any, mid: int, *_rest: Any) -> None:
        with self._changed:
            self._subscribed.add(mid)
            self._changed.notify_all()

    def _on_message(self, _client: Any, _userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    def _wait(self, condition: Any, what: str, timeout: float = TIMEOUT) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout):
                raise AssertionError(f"{self.user}: no {what} in {timeout} s")

    def publish(self, topic: str, payload: bytes | str, retain: bool = False) -> int:
        """Publish at QoS 1; the PUBACK's reason code (0 accepted; 16 accepted, no subscriber
        yet, reported here as 0; 135 not authorized)."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        self._wait(lambda: info.mid in self._acks, f"PUBACK for {topic}")
        code = self._acks[info.mid]
        return 0 if code == NO_SUBSCRIBERS else code

    def allowed(self, topic: str, payload: bytes | str, retain: bool = False) -> None:
        """Publish, and fail unless the broker accepted it."""
        code = self.publish(topic, payload, retain)
        assert code == 0, f"{self.user} may not publish {topic}: reason {code}"

    def refused(self, topic: str, payload: bytes | str, retain: bool = False) -> None:
        """Publish, and fail unless the broker refused it."""
        code = self.publish(topic, payload, retain)
        assert code == NOT_AUTHORIZED, f"{self.user} published {topic}: reason {code}"

    def subscribe(self, *filters: str) -> None:
        """Subscribe (QoS 1) and wait for the SUBACK."""
        _, mid = self._client.subscribe([(f, 1) for f in filters])
        self._wait(lambda: mid in self._subscribed, "SUBACK")

    def wait_count(self, topic: str, count: int) -> None:
        """Wait until `count` messages arrived on topic."""
        self._wait(
            lambda: sum(1 for m in self.messages if m.topic == topic) >= count,
            f"{count} messages on {topic}",
        )

    def received(self, topic: str | None = None) -> list[mqtt.MQTTMessage]:
        """What arrived so far (on one topic)."""
        with self._changed:
            return [m for m in self.messages if topic is None or m.topic == topic]

    def wait_message(self, topic: str, match: Any = None, what: str = "") -> mqtt.MQTTMessage:
        """Wait for a message on topic (whose JSON payload satisfies `match`, if given)."""

        def found() -> list[mqtt.MQTTMessage]:
            hits = [m for m in self.messages if m.topic == topic]
            return [m for m in hits if match is None or match(_json(m.payload))]

        self._wait(lambda: bool(found()), what or f"message on {topic}")
        with self._changed:
            return found()[-1]

    def events(self, request_id: str) -> list[dict[str, Any]]:
        """The node's events of one request that this client read."""
        found = [_json(m.payload) for m in self.received(Topics(PREFIX, NODE).events)]
        return [e for e in found if e.get("id") == request_id]

    def wait_event(self, request_id: str, event: str) -> dict[str, Any]:
        """Wait for an event of a request on the node's events topic."""
        events = Topics(PREFIX, NODE).events
        message = self.wait_message(
            events,
            lambda e: e.get("id") == request_id and e.get("event") == event,
            f"{event} of {request_id}",
        )
        return _json(message.payload)

    def disconnect_with_will(self) -> None:
        """MQTT 5's DISCONNECT that asks the broker to publish the Last Will now."""
        reason = ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message")
        self._client.disconnect(reasoncode=reason)
        self._client.loop_stop()

    def close(self) -> None:
        """Disconnect cleanly (nothing if already disconnected)."""
        self._client.disconnect()
        self._client.loop_stop()


def _json(payload: bytes | bytearray) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def acl_broker(workdir: Path) -> Broker:
    """A Mosquitto with the shipped ACL file as it is and a password file for every user."""
    broker = Broker(workdir)
    broker.require_login({user: password(user) for user in USERS}, acl=ACL)
    return broker


# ---- every user, every topic -----------------------------------------------------------------


def test_each_user_may_publish_and_read_exactly_what_its_features_need(tmp_path: Path) -> None:
    """Every topic of the universe published (retained) by every user: the broker accepts
    exactly the model's writes. Then each user subscribes to `#` and, behind it, to one topic it
    reads (a broker sends one connection's retained messages in order, so that second copy
    closes the first batch): it reads exactly the model's reads."""
    broker = acl_broker(tmp_path / "broker")
    broker.start()
    topics = universe()
    try:
        granted: dict[str, set[str]] = {}
        for user in USERS:
            client = UserClient(broker, user)
            try:
                codes = {t: client.publish(t, f"retained by {user}", retain=True) for t in topics}
            finally:
                client.close()
            assert set(codes.values()) <= {0, NOT_AUTHORIZED}, codes
            granted[user] = {t for t, code in codes.items() if code == 0}
        for user in USERS:
            expected = needs(user).writes & set(topics)
            assert granted[user] == expected, (
                user,
                "granted beyond need:",
                sorted(granted[user] - expected),
                "needed, refused:",
                sorted(expected - granted[user]),
            )
        written = set().union(*granted.values())
        assert written == set(topics), sorted(set(topics) - written)  # each has a writer

        for user in USERS:
            expected = needs(user).reads & set(topics)
            fence = sorted(expected)[0]
            client = UserClient(broker, user)
            try:
                client.subscribe("#")
                client.subscribe(fence)
                client.wait_count(fence, 2)
                batch = [m.topic for m in client.received()]
            finally:
                client.close()
            read = set(batch[: batch.index(fence, batch.index(fence) + 1)])
            assert read == expected, (
                user,
                "read beyond need:",
                sorted(read - expected),
                "needed, not delivered:",
                sorted(expected - read),
            )
        print(f"{len(USERS)} users x {len(topics)} topics, published and read")
    finally:
        broker.stop()


# ---- the real agent as its node user, and each user's publications ---------------------------


@dataclass
class AclFleet:
    """A broker with the shipped ACL, the real agent logged in as its node user (every feature
    that uses the broker on), and the operator's signing key."""

    broker: Broker
    agent: AgentProcess
    workdir: Path
    signing_key: Path

    def password_file(self, user: str) -> Path:
        """A file whose first line is the user's password (as the agent and the tool read)."""
        path = self.workdir / f"{user}.password"
        path.write_text(password(user) + "\n", encoding="utf-8")
        path.chmod(0o600)
        return path

    def denied_publishes(self, client_id: str) -> list[str]:
        """The broker's log lines refusing a publication of this client."""
        log = self.broker.log.read_text(encoding="utf-8", errors="replace")
        return [line for line in log.splitlines() if f"Denied PUBLISH from {client_id} " in line]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, tiny_voice: Path, cache_dir: Path
) -> Iterator[AclFleet]:
    workdir = tmp_path_factory.mktemp("acl")
    broker = acl_broker(workdir / "broker")
    keys = workdir / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "ota", "keygen", str(keys)],
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT,
    )
    assert made.returncode == 0, made.stderr
    signing = keys / "release.key"
    raw = node_config_raw(NODE)
    raw["ota"]["trusted_keys"] = [release.public_text(release.load_private_key(signing))]
    node_password = workdir / f"{NODE}.password"
    node_password.write_text(password(NODE) + "\n", encoding="utf-8")
    node_password.chmod(0o600)
    config = agent_config(
        broker,
        workdir,
        NODE,
        voice=tiny_voice,
        device=f"file:FILE={workdir}/played.raw,FORMAT=raw",
        mqtt={"username": NODE, "password_file": str(node_password)},
        speak=raw["speak"],
        hermes=raw["hermes"],
        ota={**raw["ota"], "health_timeout": 60},
        homeassistant=raw["homeassistant"],
        tts={"voices": {"second": str(tiny_voice)}},
        cache={"dir": str(cache_dir)},
    )
    agent = AgentProcess(write_config(workdir / "agent.yaml", config), workdir / "agent.log")
    acl = AclFleet(broker, agent, workdir, signing)
    broker.start()
    acl.agent.start()
    try:
        yield acl
    finally:
        if acl.agent.alive():
            acl.agent.signal(signal.SIGTERM)
        broker.stop()
    lines = acl.agent.output().splitlines()
    expected = (
        " ERROR agent.updates.updater: Update "  # the failed offers and rollback, logged by design
    )
    errors = [line for line in lines if " ERROR " in line and expected not in line]
    assert not errors, errors


Connect = Any
"""The `connect` fixture: (user, *filters, will=...) -> a subscribed UserClient."""


@pytest.fixture
def connect(fleet: AclFleet) -> Iterator[Connect]:
    """Clients of the test, logged in as a user and subscribed; closed after the test."""
    opened: list[UserClient] = []

    def make(user: str, *filters: str, will: tuple[str, bytes] | None = None) -> UserClient:
        client = UserClient(fleet.broker, user, will)
        opened.append(client)
        if filters:
            client.subscribe(*filters)
        return client

    yield make
    for client in opened:
        client.close()


def online(fleet: AclFleet, home_assistant: UserClient) -> None:
    """Wait until the node says online (its retained status, read as Home Assistant)."""
    status = Topics(PREFIX, NODE).status
    home_assistant.wait_message(status, what="the node's status")
    wait_until(
        lambda: home_assistant.received(status)[-1].payload == b"online" or not fleet.agent.alive(),
        what="online",
    )
    assert fleet.agent.alive(), fleet.agent.output()


def speak(client: UserClient, topic: str, **payload: Any) -> None:
    """A JSON speak message the broker accepts."""
    client.allowed(topic, json.dumps(payload))


def control_message(fleet: AclFleet, home_assistant: UserClient, name: str) -> None:
    """After the refused publications: a normal message is still spoken, and the node never had
    a publication of its own refused."""
    speak(home_assistant, Topics(PREFIX, NODE).speak, id=f"control-{name}", text="All is well.")
    home_assistant.wait_event(f"control-{name}", "finished")
    assert fleet.denied_publishes(f"voice-agent-{NODE}") == []
    assert fleet.agent.alive()


def state(client: UserClient) -> dict[str, Any]:
    """The node's latest state this client read."""
    found = client.received(Topics(PREFIX, NODE).state)
    assert found, "no state"
    return _json(found[-1].payload)


def test_home_assistant_drives_every_entity_and_reads_what_the_node_reports(
    fleet: AclFleet, connect: Connect
) -> None:
    """As Home Assistant's user: discovery read and sent again on its birth; say (notify, text)
    spoken and its end read on the node's `result` topic (the Announcement event entity); speak
    (automations, Test chime), every node's and the group's speak; the group's ack and stop;
    Stop, Clear queue and Replay last; volume and voice; the update entity's state. Offers,
    rollbacks, revocations and forged reports are refused."""
    topics = Topics(PREFIX, NODE)
    ha = connect(HA, f"{PREFIX}/+/#", "homeassistant/#")
    online(fleet, ha)
    configs = [topic for topic, _ in discovery(NODE)]
    wait_until(lambda: all(ha.received(t) for t in configs), what="every discovery config")
    ha.allowed("homeassistant/status", "online")  # the birth: every config again
    wait_until(lambda: all(len(ha.received(t)) >= 2 for t in configs), what="discovery again")

    def results(event_type: str) -> int:
        found = [_json(m.payload) for m in ha.received(topics.result)]
        return sum(1 for r in found if r.get("event_type") == event_type)

    ha.allowed(topics.say, "Hello from Home Assistant.")
    wait_until(lambda: results("finished") >= 1, what="the say's result")
    ha.allowed(topics.speak, TEST_CHIME_PAYLOAD)
    wait_until(lambda: results("finished") >= 2, what="the test chime's result")
    for topic, request in (
        (topics.speak, "ha-speak"),
        (f"{PREFIX}/all/speak", "ha-all"),
        (topics.group(GROUP, "speak"), "ha-group"),
    ):
        speak(ha, topic, id=request, text="Dinner is ready.")
        ha.wait_event(request, "finished")
    ha.allowed(topics.replay, "replay")
    ha.wait_message(
        topics.events,
        lambda e: "~replay" in str(e.get("id")) and e.get("event") == "finished",
        "the replay",
    )

    speak(
        ha, topics.group(GROUP, "speak"), id="kettle", text="Kettle.", repeat=0, repeat_interval=30
    )
    ha.wait_event("kettle", "finished")
    ha.allowed(topics.group(GROUP, "ack"), "kettle")
    ha.wait_event("kettle", "acknowledged")
    speak(ha, topics.speak, id="pump", text="Pump.", repeat=0, repeat_interval=30)
    ha.wait_event("pump", "finished")
    ha.allowed(topics.stop, "stop")  # the Stop button
    ha.wait_event("pump", "stopped")
    for stop, request in ((topics.stop, "later"), (topics.group(GROUP, "stop"), "later-group")):
        speak(ha, topics.speak, id=request, text="Later.", at=time.time() + 120)
        ha.wait_event(request, "accepted")
        ha.allowed(stop, CLEAR_QUEUE_PAYLOAD)  # the Clear queue button; the group's stop
        assert ha.wait_event(request, "stopped")["cleared"] is True

    ha.allowed(topics.volume, "0.4")
    wait_until(lambda: state(ha).get("volume") == 0.4, what="volume 0.4 in the state")
    ha.allowed(topics.voice, "second")
    wait_until(lambda: state(ha).get("voice") == "second", what="voice `second` in the state")
    ha.allowed(topics.voice, "default")
    ha.allowed(topics.volume, "1")
    assert _json(ha.wait_message(topics.update).payload)["installed_version"]

    offer = {"id": "ha-offer", "manifest": "x", "signatures": [], "base_url": "http://x/"}
    for topic in (topics.ota, f"{PREFIX}/all/ota", f"{PREFIX}/group/{GROUP}/ota"):
        ha.refused(topic, json.dumps(offer))
        ha.refused(topic, json.dumps({"id": "ha-rollback", "rollback": True}))
    ha.refused(f"{PREFIX}/all/revocation", json.dumps({"manifest": "x"}), retain=True)
    for forged in (topics.status, topics.state, topics.events, topics.result, topics.update):
        ha.refused(forged, "offline")
    ha.refused(hermes.SAY, json.dumps({"text": "x", "siteId": NODE}))
    control_message(fleet, ha, "ha")
    assert not ha.events("ha-offer")
    assert not ha.events("ha-rollback")


def test_rhasspy_drives_the_hermes_topics_and_reads_only_their_replies(
    fleet: AclFleet, connect: Connect
) -> None:
    """As Rhasspy's user: say and playBytes answered (sayFinished, playFinished), getVoices
    answered, setVolume applied, toggleOff answering without playing and toggleOn; the node's
    own topics and the update topics refused, and nothing of them read."""
    ha = connect(HA, f"{PREFIX}/+/#")
    online(fleet, ha)
    rhasspy = connect(RHASSPY, "#")
    rhasspy.allowed(hermes.SAY, json.dumps({"text": "Hi.", "siteId": NODE, "id": "rh-say"}))
    rhasspy.wait_message(hermes.SAY_FINISHED, lambda m: m.get("id") == "rh-say")
    rhasspy.allowed(f"hermes/audioServer/{NODE}/playBytes/rh-play", wav())
    rhasspy.wait_message(
        f"hermes/audioServer/{NODE}/playFinished", lambda m: m.get("id") == "rh-play"
    )
    rhasspy.allowed(hermes.GET_VOICES, json.dumps({"id": "rh-voices", "siteId": NODE}))
    voices = rhasspy.wait_message(hermes.VOICES, lambda m: m.get("id") == "rh-voices")
    assert {v["voiceId"] for v in _json(voices.payload)["voices"]} >= {"default", "second"}
    rhasspy.allowed(hermes.SET_VOLUME, json.dumps({"volume": 0.3, "siteId": NODE}))
    wait_until(lambda: state(ha).get("volume") == 0.3, what="volume 0.3 in the state")
    rhasspy.allowed(hermes.SET_VOLUME, json.dumps({"volume": 1, "siteId": NODE}))

    def hermes_finished() -> int:
        found = [_json(m.payload) for m in ha.received(Topics(PREFIX, NODE).events)]
        return sum(
            1 for e in found if str(e.get("id")).startswith("hermes-") and e["event"] == "finished"
        )

    before = hermes_finished()
    rhasspy.allowed(hermes.TOGGLE_OFF, json.dumps({"siteId": NODE}))
    rhasspy.allowed(hermes.SAY, json.dumps({"text": "Muted.", "siteId": NODE, "id": "rh-off"}))
    rhasspy.wait_message(hermes.SAY_FINISHED, lambda m: m.get("id") == "rh-off")
    rhasspy.allowed(hermes.TOGGLE_ON, json.dumps({"siteId": NODE}))
    rhasspy.allowed(hermes.SAY, json.dumps({"text": "Back.", "siteId": NODE, "id": "rh-on"}))
    rhasspy.wait_message(hermes.SAY_FINISHED, lambda m: m.get("id") == "rh-on")
    wait_until(lambda: hermes_finished() >= before + 1, what="the unmuted say's events")
    assert hermes_finished() == before + 1  # the muted one was answered, not played

    topics = Topics(PREFIX, NODE)
    for topic in (topics.speak, topics.say, topics.volume, topics.ota, f"{PREFIX}/all/speak"):
        rhasspy.refused(topic, json.dumps({"id": "rh-forbidden", "text": "x"}))
    rhasspy.refused(f"{PREFIX}/all/revocation", "x", retain=True)
    control_message(fleet, ha, "rhasspy")
    assert not ha.events("rh-forbidden")
    assert all(m.topic.startswith(("hermes/", "rhasspy/")) for m in rhasspy.received())


def wav() -> bytes:
    """A short 16-bit mono WAV (a playBytes payload)."""
    import io  # noqa: PLC0415
    import wave  # noqa: PLC0415

    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(b"\x00\x10" * 3200)
    return out.getvalue()


def test_the_operator_alone_offers_rolls_back_and_revokes_with_its_tool(
    fleet: AclFleet, connect: Connect
) -> None:
    """`python -m ota` as the operator's user: `status` lists the node (its sync marker came
    back), `offer` to the group and to every node and `rollback` reach the node and their
    answers reach the tool, `revoke` publishes the retained revocation the node notes. The
    operator cannot speak or forge a node's reports."""
    ha = connect(HA, f"{PREFIX}/+/#")
    online(fleet, ha)
    operator = connect(OPERATOR, Topics(PREFIX, NODE).events)
    login = ["--username", OPERATOR, "--password-file", str(fleet.password_file(OPERATOR))]

    def run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
        line = tool(fleet.broker, command, *args, *login)
        return subprocess.run(line, capture_output=True, text=True, check=False, timeout=600)

    shown = run("status", "--json")
    assert shown.returncode == 0, shown.stderr
    assert "incomplete" not in shown.stderr, shown.stderr
    assert NODE in json.dumps(json.loads(shown.stdout))
    # a user whose ACL forbids the marker: the view is shown, with the warning that it may be
    # incomplete once nothing arrived for --sync-timeout s
    ha_login = ["--username", HA, "--password-file", str(fleet.password_file(HA))]
    unsynced = subprocess.run(
        tool(fleet.broker, "status", "--json", "--sync-timeout", "2", *ha_login),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert unsynced.returncode == 0, unsynced.stderr
    assert "may be incomplete" in unsynced.stderr, unsynced.stderr
    assert NODE in json.dumps(json.loads(unsynced.stdout))

    from harness.fleet_sim import release_envelope  # noqa: PLC0415

    envelope = release_envelope(
        fleet.workdir / "release", release.load_private_key(fleet.signing_key), 2
    )
    unreachable = "http://127.0.0.1:9/r2/"  # nothing listens: the download fails, and says so
    for target in (["--group", GROUP], ["--all"]):
        offered = run("offer", str(envelope), "--base-url", unreachable, *target, "--nodes", NODE)
        assert offered.returncode == 1, offered.stderr  # the tool read the node's final answer
    finals = {
        e["id"]
        for e in (_json(m.payload) for m in operator.received())
        if e.get("event") == "update"
        and str(e.get("id")).startswith("offer-")
        and e.get("state") == "failed"
    }
    assert len(finals) == 2, finals
    back = run("rollback", "--node", NODE, "--wait", "60")
    assert back.returncode == 1, back.stderr
    operator.wait_message(
        Topics(PREFIX, NODE).events,
        lambda e: e.get("event") == "update" and e.get("reason") == "nothing_to_roll_back",
        "the rollback's answer",
    )
    revoked = run("revoke", "--key", str(fleet.signing_key), "--min-release", "1")
    assert revoked.returncode == 0, revoked.stderr
    operator.wait_message(
        Topics(PREFIX, NODE).events,
        lambda e: e.get("event") == "update" and e.get("state") == "noted",
        "the revocation noted",
    )

    topics = Topics(PREFIX, NODE)
    for topic in (topics.speak, topics.say, topics.volume, topics.stop, f"{PREFIX}/all/speak"):
        operator.refused(topic, json.dumps({"id": "op-forbidden", "text": "x"}))
    for forged in (topics.status, topics.state, topics.events, "homeassistant/status"):
        operator.refused(forged, "offline")
    control_message(fleet, ha, "operator")
    assert not ha.events("op-forbidden")


def test_another_node_cannot_command_impersonate_or_read_the_node(
    fleet: AclFleet, connect: Connect
) -> None:
    """As another node's user: every topic the node takes (its own, the fleet's, the group's,
    Hermes, OTA, the revocation) and every topic it reports on is refused, and none of it
    reaches the node; it reads the group's messages but not the node's own commands; a Last
    Will on the node's status is never published, its own is."""
    topics = Topics(PREFIX, NODE)
    ha = connect(HA, f"{PREFIX}/+/#")
    online(fleet, ha)
    intruder = connect(OTHER, "#")
    targets = node_needs(NODE).reads | node_needs(NODE).writes
    forbidden = sorted(targets - needs(OTHER).writes)
    assert len(forbidden) > 40, forbidden
    for number, topic in enumerate(forbidden):
        payload = {"id": f"intruder-{number}", "text": "Intruded.", "volume": 0.1, "siteId": NODE}
        intruder.refused(topic, json.dumps(payload))
    speak(ha, topics.group(GROUP, "speak"), id="after-intruder", text="Still here.")
    ha.wait_event("after-intruder", "finished")
    assert not [e for e in ha.received(topics.events) if b"intruder-" in e.payload]
    assert state(ha).get("volume") == 1

    ha.allowed(topics.say, "Private words.")  # the node's own command: not for other nodes
    speak(ha, topics.group(GROUP, "speak"), id="fence", text="For the group.")
    intruder.wait_message(topics.group(GROUP, "speak"), lambda m: m.get("id") == "fence")
    assert not intruder.received(topics.say)
    assert not [m for m in intruder.received() if m.topic.startswith(f"{PREFIX}/{NODE}/")]

    forged = connect(OTHER, will=(topics.status, b"offline"))
    forged.disconnect_with_will()
    own = connect(OTHER, will=(Topics(PREFIX, OTHER).status, b"offline"))
    own.disconnect_with_will()
    ha.wait_message(Topics(PREFIX, OTHER).status)  # the broker published the second will
    assert [m.payload for m in ha.received(topics.status)][-1] == b"online"
    control_message(fleet, ha, "intruder")
