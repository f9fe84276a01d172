"""The README's "Home Assistant in five minutes", followed to the letter against a real Home
Assistant core (harness.homeassistant): its configuration snippet, read out of README.md, is the
file the agent reads (the broker's address and the password file's place filled in, as the
reader fills in theirs), the password file written as step 3 says, and the node logs in with
that user to a broker that checks passwords. The device it names appears in Home Assistant,
and both automations of step 6, read out of the README too, make it speak. A README whose steps
do not work fails here."""

from __future__ import annotations

import re
import shlex
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from agent.settings.loading import SYSTEM_CONFIG_PATH
from harness import ROOT, AgentProcess, Broker, Watcher, read_pcm, wait_until, write_config
from harness.homeassistant import HomeAssistant, install
from harness.unit import unit_settings

pytestmark = [pytest.mark.broker, pytest.mark.clients]

PASSWORD: Final = "kitchen-secret"


def readme_section() -> str:
    """The README's Home Assistant section, up to the next one."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("## Home Assistant in five minutes", 1)[1].split("\n## ", 1)[0]


def blocks(language: str) -> list[str]:
    """The section's fenced code blocks in a language, in order (their indentation removed)."""
    found = re.findall(rf"^( *)```{language}\n(.*?)^\1```", readme_section(), re.M | re.S)
    return [
        "\n".join(line.removeprefix(indent) for line in body.splitlines()) for indent, body in found
    ]


def steps() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The configuration snippet, the notify automation and the MQTT one."""
    documents = [yaml.safe_load(block) for block in blocks("yaml")]
    (config,) = [d for d in documents if "mqtt" in d]
    (notify,) = [d for d in documents if d.get("action") == "notify.send_message"]
    (publish,) = [d for d in documents if d.get("action") == "mqtt.publish"]
    return config, notify, publish


def test_the_section_edits_the_file_the_installed_service_reads() -> None:
    """Step 3 names the file that the installed agent reads when none is named (the unit's
    command names none), and its password line writes the file the snippet names."""
    section = readme_section()
    assert f"`{SYSTEM_CONFIG_PATH}`, the file the service reads" in section
    (exec_start,) = unit_settings(ROOT / "config" / "voice-agent.service")["ExecStart"]
    assert shlex.split(exec_start)[1:] == ["run"]  # no --config: the default lookup
    config, _, _ = steps()
    (line,) = [b for b in blocks("sh") if "password" in b]
    assert shlex.split(line.split("|", 1)[1])[-1] == config["mqtt"]["password_file"]
    notify_first = section.index("notify.send_message")
    assert notify_first < section.index("mqtt.publish")  # the native way first


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The broker of the README: the node's login checked (a wrong password is refused),
    Home Assistant's MQTT entry anonymous as the harness makes it."""
    config, _, _ = steps()
    server = Broker(tmp_path_factory.mktemp("readme-broker"))
    server.require_login({config["mqtt"]["username"]: PASSWORD})
    text = server.config.read_text(encoding="utf-8")
    server.config.write_text(text.replace("allow_anonymous false", "allow_anonymous true"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def homeassistant(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HomeAssistant]:
    """Home Assistant core with its MQTT integration on that broker."""
    ha = HomeAssistant(install(), tmp_path_factory.mktemp("readme-homeassistant"), broker)
    ha.start()
    yield ha
    ha.stop()


@pytest.fixture(scope="module")
def node(
    broker: Broker, tiny_voice: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentProcess, Watcher, Path]]:
    """The agent reading the README's snippet as its configuration file; the deployment's own
    values (where audio goes, caches, the small test voice) from the environment only."""
    work = tmp_path_factory.mktemp("readme-node")
    config, _, _ = steps()
    password_file = work / "mqtt-password"
    password_file.write_text(f"{PASSWORD}\n", encoding="utf-8")
    password_file.chmod(0o600)
    config["mqtt"] |= {
        "host": broker.host,
        "port": broker.port,
        "password_file": str(password_file),
    }
    path = write_config(work / "agent.yaml", config)
    capture = work / "played.raw"
    env = {
        "XDG_CACHE_HOME": str(work / "cache"),
        "XDG_STATE_HOME": str(work / "state"),
        "VOICE_AGENT_AUDIO_DEVICE": f"file:FILE={capture},FORMAT=raw",
        "VOICE_AGENT_TTS_VOICE": str(tiny_voice),
    }
    agent = AgentProcess(path, work / "agent.log", env)
    watcher = Watcher(broker, f"voice/{config['node_id']}/#")
    agent.start()
    try:
        status = f"voice/{config['node_id']}/status"
        wait_until(
            lambda: (
                any(m.topic == status and m.payload == b"online" for m in watcher.snapshot())
                or not agent.alive()
            ),
            what="the node online",
        )
        assert agent.alive(), agent.output()[-3000:]
        yield agent, watcher, capture
    finally:
        if agent.alive():
            assert agent.signal(signal.SIGTERM) == 0, agent.output()[-3000:]
        watcher.close()


def finished_after(watcher: Watcher, since: int) -> dict[str, Any]:
    """The first `finished` event published after message number `since`."""

    def found() -> list[dict[str, Any]]:
        events = [m.json() for m in watcher.snapshot()[since:] if m.topic.endswith("/events")]
        return [e for e in events if e["event"] == "finished"]

    wait_until(lambda: bool(found()), what="a finished event")
    return found()[0]


def test_the_device_appears_and_notify_send_message_speaks(
    homeassistant: HomeAssistant, node: tuple[AgentProcess, Watcher, Path]
) -> None:
    agent, watcher, capture = node
    config, notify, _ = steps()
    name = f"Voice {config['node_id']}"  # as step 5 says
    assert f'device "{name}" appears' in readme_section()

    def device() -> list[dict[str, Any]]:
        return [d for d in homeassistant.device_registry() if d["name"] == name]

    wait_until(lambda: bool(device()), what=f"the device {name!r} in Home Assistant")
    entity = notify["target"]["entity_id"]
    homeassistant.wait_state(entity, lambda s: s["state"] != "unavailable", what=entity)
    (on_device,) = [e for e in homeassistant.entity_registry() if e["entity_id"] == entity]
    assert on_device["device_id"] == device()[0]["id"]  # the README's entity is the device's

    since = len(watcher.snapshot())
    domain, service = notify["action"].split(".")
    homeassistant.call_service(domain, service, {**notify["target"], **notify["data"]})
    finished = finished_after(watcher, since)
    assert finished["audio_seconds"] > 0
    said = [m.payload for m in watcher.snapshot()[since:] if m.topic.endswith("/say")]
    assert said == [notify["data"]["message"].encode()]
    assert len(read_pcm(capture)) > 0
    assert agent.alive()


def test_the_mqtt_publish_automation_speaks_in_its_class(
    homeassistant: HomeAssistant, node: tuple[AgentProcess, Watcher, Path]
) -> None:
    _, watcher, _ = node
    _, _, publish = steps()
    since = len(watcher.snapshot())
    domain, service = publish["action"].split(".")
    homeassistant.call_service(domain, service, publish["data"])
    finished = finished_after(watcher, since)
    assert finished["priority"] == yaml.safe_load(publish["data"]["payload"])["priority"]
    assert homeassistant.mqtt_problems() == []
