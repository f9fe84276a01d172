"""Home Assistant itself judges the agent's MQTT discovery: a real Home Assistant core (installed
into a cached venv on first use, see harness.homeassistant) and a real agent on one broker. Every
entity the agent announces must appear as announced with no refusal in Home Assistant's log, and
every control must work through Home Assistant's own services.

One Home Assistant and one agent serve the whole module (a start takes seconds, the first
install minutes); each test leaves both running as it found them."""

from __future__ import annotations

import json
import signal
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.protocol.discovery import TEXT_MAX
from agent.protocol.topics import Topics
from agent.system.board import board
from harness import (
    AgentProcess,
    Broker,
    PulseNullSink,
    Watcher,
    agent_config,
    wait_until,
    write_config,
)
from harness.homeassistant import DISCOVERY_PREFIX, ApiError, HomeAssistant, entity_ids, install
from harness.screenshot import screenshot
from ota import release
from tests.release_server import ReleaseServer
from tests.tiny_voice import write_tiny_voice

pytestmark = [pytest.mark.broker, pytest.mark.clients]

ANNOUNCED: Final = {
    "notify": 1,
    "text": 1,
    "button": 4,
    "number": 1,
    "select": 1,
    "sensor": 9,
    "binary_sensor": 3,
    "event": 1,
    "update": 1,
}
"""Entities per component the README's Home Assistant table lists."""

NOTES: Final = "Clearer vowels."
"""Release notes of the update the last test installs."""


@dataclass
class Node:
    """The agent under test, with a watcher on its own topics."""

    process: AgentProcess
    topics: Topics
    watcher: Watcher

    @property
    def node_id(self) -> str:
        """The agent's node id."""
        return self.topics.node_id

    def start(self) -> None:
        """Start and wait for `online` on its status topic (published after this call)."""
        mark = len(self.watcher.snapshot())
        self.process.start()

        def online() -> bool:
            status = [m for m in self.watcher.snapshot()[mark:] if m.topic == self.topics.status]
            return bool(status) and status[-1].payload == b"online"

        wait_until(lambda: online() or not self.process.alive(), what="the agent online")
        assert self.process.alive(), self.process.output()[-3000:]

    def stop(self) -> None:
        """Stop as systemd does."""
        assert self.process.signal(signal.SIGTERM) == 0, self.process.output()[-3000:]

    def state(self, since: int = 0) -> dict[str, Any]:
        """The latest state JSON it published after message number `since` ({} if none)."""
        found = [m for m in self.watcher.snapshot()[since:] if m.topic == self.topics.state]
        return found[-1].json() if found else {}


@pytest.fixture(scope="module")
def ha_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The broker Home Assistant and the agent share."""
    server = Broker(tmp_path_factory.mktemp("ha-broker"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def seen(ha_broker: Broker) -> Iterator[Watcher]:
    """Everything under the discovery prefix: configs and Home Assistant's birth messages."""
    watcher = Watcher(ha_broker, f"{DISCOVERY_PREFIX}/#")
    yield watcher
    watcher.close()


@pytest.fixture(scope="module")
def homeassistant(
    ha_broker: Broker, seen: Watcher, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HomeAssistant]:
    """Home Assistant core, installed if the cache has none, onboarded, MQTT connected."""
    ha = HomeAssistant(install(), tmp_path_factory.mktemp("homeassistant"), ha_broker)
    ha.start()
    yield ha
    ha.stop()


@pytest.fixture(scope="module")
def signing_key() -> Ed25519PrivateKey:
    """The release signing key the agent trusts."""
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def node(
    ha_broker: Broker,
    tiny_voice: Path,
    pulse: PulseNullSink,
    signing_key: Ed25519PrivateKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Node]:
    """The agent with discovery on, a second voice, trusted update key, paced audio."""
    workdir = tmp_path_factory.mktemp("agent")
    node_id = f"ha{uuid.uuid4().hex[:6]}"
    second = write_tiny_voice(workdir, "second.onnx", gain=0.006)
    config = agent_config(
        ha_broker,
        workdir,
        node_id,
        voice=tiny_voice,
        device="paced_capture",
        tts={"voices": {"second": str(second)}},
        homeassistant={"discovery": True, "area": "Kitchen"},
        ota={
            "trusted_keys": [release.public_text(signing_key)],
            "hosts": ["127.0.0.1:*"],  # the release server
            "health_timeout": 60,
            "download_timeout": 3,
        },
    )
    path = write_config(workdir / "agent.yaml", config)
    process = AgentProcess(path, workdir / "agent.log", pulse.env(workdir / "capture.raw"))
    topics = Topics("voice", node_id)
    agent = Node(process, topics, Watcher(ha_broker, f"voice/{node_id}/#"))
    agent.start()
    yield agent
    if agent.process.alive():
        agent.stop()
    agent.watcher.close()
    errors = [line for line in process.output().splitlines() if " ERROR " in line]
    assert not errors, errors


@pytest.fixture(scope="module")
def entities(homeassistant: HomeAssistant, node: Node, seen: Watcher) -> dict[str, str]:
    """Entity id per object id (`say`, `volume`, ...) once Home Assistant made every entity
    the agent announced."""

    def made() -> dict[str, str]:
        return entity_ids(homeassistant, f"voice_agent_{node.node_id}_")

    wait_until(
        lambda: len(announced(seen, node.node_id)) == sum(ANNOUNCED.values()),
        what="the agent's discovery configs",
    )
    wait_until(
        lambda: (
            len(made()) == len(announced(seen, node.node_id)) or bool(homeassistant.mqtt_problems())
        ),
        what="the entities",
    )
    assert homeassistant.mqtt_problems() == []  # a refused config says why here
    return made()


def announced(seen: Watcher, node_id: str) -> dict[str, dict[str, Any]]:
    """The latest discovery config per `<component>/<object_id>` of a node."""
    found = {}
    for message in seen.snapshot():
        parts = message.topic.split("/")
        if len(parts) == 5 and parts[2] == node_id and parts[4] == "config" and message.payload:
            found[f"{parts[1]}/{parts[3]}"] = message.json()
    return found


def spoken(node: Node, since: int, topic: str = "") -> tuple[bytes, dict[str, Any]]:
    """The first message on `topic` (the speak topic by default) after message number `since`,
    and the `finished` event of what it made (any other end fails at once, with its reason)."""
    topic = topic or node.topics.speak

    def after() -> list[Any]:
        return node.watcher.snapshot()[since:]

    def accepted() -> list[dict[str, Any]]:
        events = [m.json() for m in after() if m.topic == node.topics.events]
        return [e for e in events if e["event"] == "accepted"]

    wait_until(lambda: any(m.topic == topic for m in after()), what=f"a message on {topic}")
    payload = next(m.payload for m in after() if m.topic == topic)
    wait_until(lambda: bool(accepted()), what="an accepted event")
    end = node.watcher.wait_end(accepted()[0]["id"])
    assert end["event"] == "finished", end
    return payload, end


@dataclass(frozen=True)
class Sent:
    """What to look at when a Home Assistant service call speaks nothing: taken before it."""

    ha: HomeAssistant
    node: Node
    broker: Broker
    entity_id: str
    messages: int
    """The node watcher's message count."""
    log: int
    """Home Assistant's log mark."""
    state: dict[str, Any] | None
    """The entity's state object."""

    @classmethod
    def before(cls, ha: HomeAssistant, node: Node, broker: Broker, entity_id: str) -> Sent:
        """Taken just before the call."""
        messages = len(node.watcher.snapshot())
        return cls(ha, node, broker, entity_id, messages, ha.log_mark(), ha.state(entity_id))

    def spoken(self) -> tuple[bytes, dict[str, Any]]:
        """`spoken` on the say topic; when it fails, the evidence of who dropped the message."""
        try:
            return spoken(self.node, self.messages, self.node.topics.say)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.evidence()}") from None

    def evidence(self) -> str:
        """Home Assistant's view of the entity before and after (a notify entity's state is the
        time it last sent: unchanged, Home Assistant never ran the send, as for an unavailable
        entity, which a service call skips without an error), the availability the node
        published, Home Assistant's warnings since, the broker's log of the say topic (each
        PUBLISH with its client), and the node's events since."""
        topics = self.node.topics
        seen = self.node.watcher.snapshot()
        availability = {
            t: [m.payload.decode() for m in seen if m.topic == t]
            for t in (topics.status, topics.engine)
        }
        warnings = [
            f"{r.level} [{r.logger}] {r.message[:300]}"
            for r in self.ha.log_records(self.log)
            if r.level in {"WARNING", "ERROR", "CRITICAL"}
        ]
        log = self.broker.log.read_text(encoding="utf-8", errors="replace")
        broker = [line for line in log.splitlines() if f"'{topics.say}'" in line]
        events = [m.payload.decode() for m in seen[self.messages :] if m.topic == topics.events]
        return "\n".join(
            [
                f"{self.entity_id} before the call: {self.state}",
                f"{self.entity_id} now: {self.ha.state(self.entity_id)}",
                f"availability the node published (oldest first): {availability}",
                f"Home Assistant's warnings since the call: {warnings}",
                f"the broker's log of {topics.say}: {broker[-10:]}",
                f"the node's events since the call: {events}",
            ]
        )


# ---------------------------------------------------------------------------------------------
# Discovery: what Home Assistant made of it
# ---------------------------------------------------------------------------------------------


def test_every_announced_entity_appears_as_announced(
    homeassistant: HomeAssistant, node: Node, seen: Watcher, entities: dict[str, str]
) -> None:
    configs = announced(seen, node.node_id)
    components = [key.split("/")[0] for key in configs]
    assert {c: components.count(c) for c in set(components)} == ANNOUNCED
    devices = [
        d
        for d in homeassistant.device_registry()
        if ["mqtt", f"voice_agent_{node.node_id}"] in d["identifiers"]
    ]
    assert len(devices) == 1
    device = devices[0]
    shared = next(iter(configs.values()))["device"]
    assert device["name"] == f"Voice {node.node_id}"
    assert (device["manufacturer"], device["model"]) == board()  # the machine, not the software
    assert device["sw_version"] == shared["sw_version"]
    assert device["area_id"] == "kitchen"  # homeassistant.area, suggested
    for entity_id in entities.values():  # the retained `online` may come after the config
        homeassistant.wait_state(entity_id, lambda s: s["state"] != "unavailable")
    registry = {e["entity_id"]: e for e in homeassistant.entity_registry()}
    states = {s["entity_id"]: s for s in homeassistant.states()}
    print("| entity | name | state | unit | icon | category |\n|---|---|---|---|---|---|")
    for key, config in sorted(configs.items()):
        component, object_id = key.split("/")
        entry = registry[entities[object_id]]
        attributes = states[entry["entity_id"]]["attributes"]
        print(
            f"| {entry['entity_id']} | {attributes['friendly_name']} | "
            f"{states[entry['entity_id']]['state']} | {attributes.get('unit_of_measurement', '')} "
            f"| {attributes.get('icon', '')} | {entry['entity_category'] or ''} |"
        )
        assert entry["entity_id"].startswith(f"{component}."), key
        assert (entry["platform"], entry["device_id"]) == ("mqtt", device["id"]), key
        assert entry["original_name"] == config["name"], key
        assert attributes["friendly_name"] == f"Voice {node.node_id} {config['name']}", key
        assert entry["original_icon"] == config.get("icon"), key
        assert attributes.get("icon") == config.get("icon"), key
        assert entry["entity_category"] == config.get("entity_category"), key
        assert entry["original_device_class"] == config.get("device_class"), key
        assert attributes.get("unit_of_measurement") == config.get("unit_of_measurement"), key
        assert attributes.get("state_class") == config.get("state_class"), key
    for key, object_id, fields in (
        ("text/say", "say", ("min", "max", "mode")),
        ("number/volume", "volume", ("min", "max", "step", "mode")),
        ("select/voice", "voice", ("options",)),
    ):
        shown = states[entities[object_id]]["attributes"]
        assert {f: shown[f] for f in fields} == {f: configs[key][f] for f in fields}, key
    assert states[entities["voice"]]["attributes"]["options"] == ["default", "second"]
    for key, config in configs.items():  # every entity has its icon, and a category by kind
        assert config.get("icon"), key
    categories = {key: config.get("entity_category") for key, config in configs.items()}
    assert {k for k, c in categories.items() if c == "config"} == {
        "number/volume",
        "select/voice",
        "button/test_chime",
        "update/voice_model",
    }
    assert homeassistant.mqtt_problems() == []


SCREENSHOT: Final = (
    Path(__file__).resolve().parent.parent / "docs" / "images" / "home-assistant-device.png"
)
"""The device page of a node as Home Assistant's own frontend draws it (docs/home-assistant.md)."""
SHOWN: Final = ("Controls", "Sensors", "Configuration", "Diagnostic", "Speak", "Stop", "Volume")
"""What the page must show before it is photographed: the cards and some of their entities."""


def test_the_device_page_shows_the_node_and_its_controls(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    """Home Assistant's frontend, in headless Chromium, draws the node's device page with its
    controls, sensors and update: the picture the documentation shows, taken here each run."""
    (device,) = [
        d
        for d in homeassistant.device_registry()
        if ["mqtt", f"voice_agent_{node.node_id}"] in d["identifiers"]
    ]
    tokens = {
        "hassUrl": homeassistant.url,
        "clientId": f"{homeassistant.url}/",
        "access_token": homeassistant.token,  # a long-lived token: never refreshed
        "refresh_token": "",
        "expires_in": 10**9,
        "expires": int(time.time() * 1000) + 10**12,
    }
    screenshot(
        f"{homeassistant.url}/config/devices/device/{device['id']}",
        SCREENSHOT,
        [f"Voice {node.node_id}", *SHOWN],
        {"hassTokens": json.dumps(tokens)},
        size=(1280, 1950),
    )
    picture = SCREENSHOT.read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", picture[16:24])  # the IHDR chunk
    assert (width, height) == (1280, 1950)
    assert len(picture) > 50_000  # a drawn page, not a blank one


def test_sensors_show_what_the_state_carries(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    node.watcher.publish(node.topics.speak, b'{"id": "sensors", "text": "Sensor check."}')
    node.watcher.wait_event("sensors", "finished")
    wait_until(lambda: node.state().get("last_ttfa_ms") is not None, what="a measured TTFA")

    def expected(state: dict[str, Any]) -> dict[str, object]:
        return {
            "queue_depth": state["queue_depth"],
            "time_to_first_audio": state["last_ttfa_ms"],
            "synthesis_speed": state["synthesis_speed"],
            "voice_tier": (state.get("tier") or {}).get("used", "fp32"),
            "cache_hit_rate": round(state["cache"]["hit_rate"] * 100, 1),
            "underruns": state["underruns"],
            "last_error": state["last_error"] or "unknown",  # no error: unknown, not "none"
            "speaking": "off",
            "speaker": "off",  # a problem sensor: off while the speaker works
        }

    def mismatches() -> list[tuple[str, object, object]]:
        want = expected(node.state())
        shown = {key: homeassistant.state(entities[key]) for key in want}
        wrong = []
        for key, value in want.items():
            state = shown[key]
            got = None if state is None else state["state"]
            same = got == str(value)
            if isinstance(value, float) and got not in {None, "unknown", "unavailable"}:
                same = float(str(got)) == pytest.approx(value)
            if not same:
                wrong.append((key, got, value))
        return wrong

    try:
        wait_until(lambda: not mismatches(), what="the sensors to show the state")
    except AssertionError:
        assert mismatches() == []
    assert homeassistant.mqtt_problems() == []


# ---------------------------------------------------------------------------------------------
# Controls, through Home Assistant's services
# ---------------------------------------------------------------------------------------------


def test_notify_send_message_speaks(
    homeassistant: HomeAssistant, node: Node, ha_broker: Broker, entities: dict[str, str]
) -> None:
    sent = Sent.before(homeassistant, node, ha_broker, entities["speak"])
    homeassistant.call_service(
        "notify",
        "send_message",
        {"entity_id": entities["speak"], "message": '{"door": "open"} is said, not parsed.'},
    )
    payload, finished = sent.spoken()
    assert payload == b'{"door": "open"} is said, not parsed.'  # plain text, never JSON
    assert finished["priority"] == "info"
    assert finished["audio_seconds"] > 0


def test_text_set_value_speaks_and_home_assistant_caps_it(
    homeassistant: HomeAssistant, node: Node, ha_broker: Broker, entities: dict[str, str]
) -> None:
    sent = Sent.before(homeassistant, node, ha_broker, entities["say"])
    homeassistant.call_service(
        "text", "set_value", {"entity_id": entities["say"], "value": "Dinner is ready."}
    )
    payload, finished = sent.spoken()
    assert payload == b"Dinner is ready."
    assert finished["audio_seconds"] > 0
    with pytest.raises(ApiError, match=rf"too long \(maximum length {TEXT_MAX}\)"):
        homeassistant.call_service(
            "text", "set_value", {"entity_id": entities["say"], "value": "x" * (TEXT_MAX + 1)}
        )


def test_the_stop_button_stops_speech(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    long = json.dumps({"id": "long", "text": "One two three four five. " * 12})
    node.watcher.publish(node.topics.speak, long.encode())
    node.watcher.wait_event("long", "started")
    homeassistant.call_service("button", "press", {"entity_id": entities["stop"]})
    assert node.watcher.wait_event("long", "stopped")["priority"] == "info"


def test_the_test_chime_button_plays_the_test_announcement(
    homeassistant: HomeAssistant, node: Node, seen: Watcher, entities: dict[str, str]
) -> None:
    since = len(node.watcher.snapshot())
    homeassistant.call_service("button", "press", {"entity_id": entities["test_chime"]})
    payload, finished = spoken(node, since)
    config = announced(seen, node.node_id)["button/test_chime"]
    assert payload.decode() == config["payload_press"]
    assert json.loads(payload)["chime"] is True
    assert finished["audio_seconds"] > 0


def test_the_replay_button_says_the_last_announcement_again(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    node.watcher.publish(node.topics.speak, b'{"id": "replay-me", "text": "Bins go out."}')
    node.watcher.wait_event("replay-me", "finished")
    homeassistant.call_service("button", "press", {"entity_id": entities["replay"]})
    replayed = node.watcher.wait_event("replay-me~replay1", "finished")
    assert replayed["sentences"] == 1


def test_the_volume_number_sets_the_volume(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    try:
        homeassistant.call_service(
            "number", "set_value", {"entity_id": entities["volume"], "value": 25}
        )
        wait_until(lambda: node.state().get("volume") == 0.25, what="volume 0.25 in the state")
        homeassistant.wait_state(entities["volume"], lambda s: float(s["state"]) == 25)  # percent
    finally:
        homeassistant.call_service(
            "number", "set_value", {"entity_id": entities["volume"], "value": 100}
        )
        wait_until(lambda: node.state().get("volume") == 1.0, what="volume 1 again")


def test_the_voice_select_sets_the_voice(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    try:
        homeassistant.call_service(
            "select", "select_option", {"entity_id": entities["voice"], "option": "second"}
        )
        wait_until(lambda: node.state().get("voice") == "second", what="voice in the state")
        homeassistant.wait_state(entities["voice"], lambda s: s["state"] == "second")
    finally:
        homeassistant.call_service(
            "select", "select_option", {"entity_id": entities["voice"], "option": "default"}
        )
        wait_until(lambda: node.state().get("voice") == "default", what="default voice again")


def test_the_clear_queue_button_drops_what_waits_and_lets_the_current_one_finish(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    long = json.dumps({"id": "playing", "text": "One two three four five. " * 6})
    node.watcher.publish(node.topics.speak, long.encode())
    node.watcher.publish(node.topics.speak, b'{"id": "waiting", "text": "Never said."}')
    node.watcher.wait_event("playing", "started")
    homeassistant.call_service("button", "press", {"entity_id": entities["clear_queue"]})
    assert node.watcher.wait_event("waiting", "stopped")["cleared"] is True
    node.watcher.wait_event("playing", "finished")


def test_speaking_and_the_announcement_event_follow_what_plays(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    """While an announcement plays, `speaking` is on; when it ends, the event entity fires
    with how it ended."""
    long = json.dumps({"id": "heard", "text": "One two three four five. " * 4})
    node.watcher.publish(node.topics.speak, long.encode())
    homeassistant.wait_state(entities["speaking"], lambda s: s["state"] == "on")
    node.watcher.wait_event("heard", "finished")
    homeassistant.wait_state(entities["speaking"], lambda s: s["state"] == "off")
    fired = homeassistant.wait_state(
        entities["announcement"],
        lambda s: s["attributes"].get("id") == "heard",
        what="the event entity to fire",
    )
    assert fired["attributes"]["event_type"] == "finished"


# ---------------------------------------------------------------------------------------------
# Lifecycles: the agent's and Home Assistant's
# ---------------------------------------------------------------------------------------------


def test_entities_are_unavailable_while_the_agent_is_stopped(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    def available() -> dict[str, bool]:
        states = {s["entity_id"]: s["state"] for s in homeassistant.states()}
        return {key: states.get(e) != "unavailable" for key, e in entities.items()}

    node.stop()
    try:
        wait_until(lambda: not any(available().values()), what="every entity unavailable")
    finally:
        node.start()
    wait_until(lambda: all(available().values()), what="every entity available again")


def test_entities_come_back_after_home_assistant_restarts(
    homeassistant: HomeAssistant, node: Node, seen: Watcher, entities: dict[str, str]
) -> None:
    since = len(seen.snapshot())
    homeassistant.restart()
    after = seen.snapshot()[since:]
    birth = max(i for i, m in enumerate(after) if m.topic == f"{DISCOVERY_PREFIX}/status")
    assert after[birth].payload == b"online"

    def announced_again() -> set[str]:
        """Config topics of the node published live (not retained) after the birth."""
        messages = seen.snapshot()[since + birth :]
        return {
            m.topic
            for m in messages
            if m.topic.endswith("/config") and f"/{node.node_id}/" in m.topic and not m.retain
        }

    wait_until(lambda: len(announced_again()) == sum(ANNOUNCED.values()), what="the configs again")
    after_restart = entity_ids(homeassistant, f"voice_agent_{node.node_id}_")
    assert after_restart == entities  # the same entity ids: no duplicates, nothing renamed
    for entity_id in entities.values():
        homeassistant.wait_state(entity_id, lambda s: s["state"] != "unavailable")
    assert homeassistant.mqtt_problems() == []


def test_settings_from_home_assistant_survive_an_agent_restart(
    homeassistant: HomeAssistant, node: Node, entities: dict[str, str]
) -> None:
    """Home Assistant publishes number and select commands non-retained, so the agent must keep
    the volume and voice it was given itself."""
    volume, voice = entities["volume"], entities["voice"]
    try:
        homeassistant.call_service("number", "set_value", {"entity_id": volume, "value": 40})
        homeassistant.call_service(
            "select", "select_option", {"entity_id": voice, "option": "second"}
        )
        wait_until(
            lambda: (node.state().get("volume"), node.state().get("voice")) == (0.4, "second"),
            what="the settings in the state",
        )
        node.stop()
        since = len(node.watcher.snapshot())
        node.start()

        def restored() -> tuple[object, object]:
            state = node.state(since)
            return state.get("volume"), state.get("voice")

        try:
            wait_until(lambda: restored() == (0.4, "second"), what="the settings after restart")
        except AssertionError:
            assert restored() == (0.4, "second"), "(volume, voice) the restarted agent published"
        homeassistant.wait_state(volume, lambda s: float(s["state"]) == 40)
        homeassistant.wait_state(voice, lambda s: s["state"] == "second")
    finally:
        homeassistant.call_service("number", "set_value", {"entity_id": volume, "value": 100})
        homeassistant.call_service(
            "select", "select_option", {"entity_id": voice, "option": "default"}
        )
        wait_until(
            lambda: (node.state().get("volume"), node.state().get("voice")) == (1.0, "default"),
            what="the settings put back",
        )


# ---------------------------------------------------------------------------------------------
# The update entity (last: it installs a new model on the module's agent)
# ---------------------------------------------------------------------------------------------


def test_the_update_entity_shows_an_update_while_it_runs(
    homeassistant: HomeAssistant,
    node: Node,
    signing_key: Ed25519PrivateKey,
    entities: dict[str, str],
    tmp_path: Path,
) -> None:
    update = entities["voice_model"]
    before = homeassistant.wait_state(update, lambda s: s["state"] == "off")["attributes"]
    assert before["installed_version"] == before["latest_version"] == node.state()["model_version"]
    assert before["in_progress"] is False
    model = write_tiny_voice(tmp_path, "voice1.onnx", gain=0.006)
    manifest = release.build_manifest(model, 1, "1.0", notes=NOTES)
    envelope = release.sign(manifest, [signing_key])
    release.publish_release(tmp_path / "releases" / "r1", model, envelope)
    server = ReleaseServer(tmp_path / "releases").start()
    try:
        total = model.stat().st_size + Path(f"{model}.json").stat().st_size
        server.behaviour.bytes_per_second = 10**9  # small steps (256 bytes), no real pacing
        server.behaviour.stall_after = total // 2  # hold the download half way
        offer = {
            "id": "ha-update",
            "manifest": json.loads(envelope),
            "base_url": f"{server.url}r1/",
        }
        node.watcher.publish(node.topics.ota, json.dumps(offer).encode())
        running = homeassistant.wait_state(
            update,
            lambda s: (
                s["attributes"]["in_progress"] is True
                and 0 < (s["attributes"]["update_percentage"] or 0) < 100
            ),
            what="an update in progress with its percentage",
        )
        assert running["state"] == "on"
        assert running["attributes"]["latest_version"] == "1.0"
        assert running["attributes"]["installed_version"] == before["installed_version"]
        assert running["attributes"]["release_summary"] == NOTES
        server.behaviour.stall_after = None  # the agent times out, resumes with Range
        done = homeassistant.wait_state(
            update,
            lambda s: (
                s["attributes"]["installed_version"] == "1.0"
                and s["attributes"]["in_progress"] is False
            ),
            what="the update installed and over",
        )
    finally:
        server.stop()
    attributes = done["attributes"]
    assert done["state"] == "off"
    assert (attributes["latest_version"], attributes["update_percentage"]) == ("1.0", None)
    assert attributes["release_summary"] == NOTES
    assert homeassistant.mqtt_problems() == []
