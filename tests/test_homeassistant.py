"""Home Assistant discovery against a real Mosquitto: the configs Home Assistant would read, and
the entities doing what they say."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from agent.discovery import DeviceInfo, discovery_messages, update_state
from agent.topics import Topics
from harness import Broker, PulseNullSink, Watcher, read_pcm, wait_until
from tests import ha_schema
from tests.conftest import RunningAgent, StartAgent

pytestmark = pytest.mark.broker

HA = "homeassistant"


def configs(watcher: Watcher, node: str) -> dict[str, dict[str, Any]]:
    """The latest discovery config per `<component>/<object_id>` of this node."""
    found: dict[str, dict[str, Any]] = {}
    for message in watcher.snapshot():
        parts = message.topic.split("/")
        if len(parts) == 5 and parts[0] == HA and parts[2] == node and parts[4] == "config":
            found[f"{parts[1]}/{parts[3]}"] = message.json()
    return found


def test_every_discovery_config_uses_only_documented_keys() -> None:
    topics = Topics("voice", "kitchen")
    device = DeviceInfo("kitchen", "Voice kitchen", "1.2.3", "voice-agent (joe)", ["default", "x"])
    messages = discovery_messages(HA, topics, device)
    components = set()
    for topic, payload in messages:
        _, component, node, object_id, suffix = topic.split("/")
        assert (node, suffix) == ("kitchen", "config")
        config = json.loads(payload)
        assert ha_schema.problems(component, config) == [], (topic, config)
        assert config["availability_topic"] == topics.status  # the Last Will topic
        assert config["unique_id"] == f"voice_agent_kitchen_{object_id}"
        components.add(component)
    assert components == {"notify", "text", "button", "number", "select", "sensor", "update"}
    assert len({json.loads(p)["unique_id"] for _, p in messages}) == len(messages)
    state = json.loads(update_state("58afce0321b8", None, "Voice model joe"))
    assert set(state) <= ha_schema.UPDATE_STATE_KEYS
    assert state["latest_version"] == state["installed_version"]  # no update offered yet


@pytest.fixture
def discovered(start_agent: StartAgent, broker: Broker) -> tuple[RunningAgent, Watcher]:
    ha = Watcher(broker, f"{HA}/#")
    agent = start_agent(sections={"homeassistant": {"discovery": True, "name": "Hall"}})
    node = agent.topics.node_id
    wait_until(lambda: len(configs(ha, node)) == 15, what="15 discovery configs")
    return agent, ha


def test_discovery_is_published_and_parses(discovered: tuple[RunningAgent, Watcher]) -> None:
    agent, ha = discovered
    found = configs(ha, agent.topics.node_id)
    for key, config in found.items():
        assert ha_schema.problems(key.split("/")[0], config) == [], key
    assert found["text/say"]["max"] == ha_schema.TEXT_MAX_LIMIT
    assert found["select/voice"]["options"] == ["default"]
    assert found["notify/speak"]["device"]["name"] == "Hall"
    retained = [m for m in ha.snapshot() if m.topic.startswith(f"{HA}/")]
    late = Watcher(_broker_of(agent), f"{HA}/+/{agent.topics.node_id}/+/config")
    try:  # retained: a Home Assistant that starts later still finds the device
        wait_until(lambda: len(late.snapshot()) == 15, what="retained configs")
        assert all(m.retain for m in late.snapshot())
    finally:
        late.close()
    assert retained


def _broker_of(agent: RunningAgent) -> Broker:
    return agent.watcher.broker


def test_discovery_is_published_again_after_home_assistant_restarts(
    discovered: tuple[RunningAgent, Watcher],
) -> None:
    _, ha = discovered
    before = len(ha.snapshot())
    sent = ha.publish(f"{HA}/status", b"online")
    wait_until(lambda: len(ha.snapshot()) >= before + 15, 15, "discovery again")
    again = [m for m in ha.snapshot()[before:] if m.topic.endswith("/config")]
    delay = min(m.at for m in again) - sent
    assert 0.4 <= delay <= 6.0, delay  # after a short random delay, not at once


def test_the_stop_button_stops_speech(
    start_agent: StartAgent, broker: Broker, pulse: PulseNullSink
) -> None:
    ha = Watcher(broker, f"{HA}/#")
    agent = start_agent(paced=pulse, sections={"homeassistant": {"discovery": True}})
    wait_until(lambda: "button/stop" in configs(ha, agent.topics.node_id), what="the button")
    button = configs(ha, agent.topics.node_id)["button/stop"]
    agent.watcher.publish(
        agent.topics.speak,
        json.dumps({"id": "long", "text": "One two three four five. " * 12}).encode(),
    )
    agent.watcher.wait_event("long", "started")
    agent.watcher.publish(button["command_topic"], button["payload_press"].encode())
    stopped = agent.watcher.wait_event("long", "stopped", timeout=10)
    assert stopped["priority"] == "info"
    ha.close()


def test_the_volume_number_sets_the_volume_of_the_next_announcement(
    discovered: tuple[RunningAgent, Watcher],
) -> None:
    agent, ha = discovered
    number = configs(ha, agent.topics.node_id)["number/volume"]
    text = f"Check {time.time_ns() % 100000}."
    agent.watcher.publish(agent.topics.speak, json.dumps({"id": "a", "text": text}).encode())
    agent.watcher.wait_event("a", "finished")
    loud = read_pcm(agent.capture)
    agent.watcher.publish(number["command_topic"], b"0.25")

    def volume() -> object:
        states = [m.json() for m in agent.watcher.snapshot() if m.topic == number["state_topic"]]
        return states[-1].get("volume") if states else None

    wait_until(lambda: volume() == 0.25, what="the number's state")
    agent.watcher.publish(agent.topics.speak, json.dumps({"id": "b", "text": text}).encode())
    agent.watcher.wait_event("b", "finished")
    quiet = read_pcm(agent.capture)[len(loud) :]
    assert np.array_equal(quiet, np.round(loud.astype(np.float32) * 0.25).astype(np.int16))


def test_sensors_read_values_the_state_carries(discovered: tuple[RunningAgent, Watcher]) -> None:
    agent, ha = discovered
    agent.watcher.publish(agent.topics.speak, b'{"id": "s", "text": "Sensor check."}')
    agent.watcher.wait_event("s", "finished")

    def state() -> dict[str, Any]:
        states = [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
        return states[-1] if states else {}

    def carries_the_announcement() -> bool:
        current = state()
        finished = current.get("events", {}).get("finished", 0)
        return current.get("last_ttfa_ms") is not None and finished >= 1

    # the state after the event: published on change, gathered for a moment, so it may lag
    wait_until(carries_the_announcement, what="a state that carries the finished announcement")
    current = state()
    for key, config in configs(ha, agent.topics.node_id).items():
        if not key.startswith("sensor/"):
            continue
        field = config["value_template"].split("value_json.")[1].split()[0].split(".")[0]
        assert field in current, (key, field)
    assert current["model_version"] == current["model_sha256"][:12]
    assert current["cache"]["misses"] >= 1
    assert current["events"]["finished"] >= 1


def test_replay_says_the_last_announcement_again(discovered: tuple[RunningAgent, Watcher]) -> None:
    agent, ha = discovered
    button = configs(ha, agent.topics.node_id)["button/replay"]
    agent.watcher.publish(agent.topics.speak, b'{"id": "first", "text": "Dinner is ready."}')
    agent.watcher.wait_event("first", "finished")
    agent.watcher.publish(button["command_topic"], button["payload_press"].encode())
    replayed = agent.watcher.wait_event("first~replay1", "finished")
    assert replayed["cached_sentences"] == replayed["sentences"] == 1
