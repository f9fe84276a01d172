"""Model updates with real agents on a real broker: SIGKILL at every step of an update, an agent
that cannot start on its new model, a result reached while the broker is down, and a staged
rollout over 20 agent processes with the operator tool."""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.states import FINAL_PHASES as FINAL_STATES
from agent.updater import FAULT_ENV
from harness import TIMEOUT, Broker, Watcher, wait_until
from ota import fleet, release
from tests.conftest import RunningAgent, StartAgent
from tests.release_server import ReleaseServer
from tests.test_ota import Release, make_release

pytestmark = pytest.mark.allow_error_logs  # failed updates and killed agents log errors


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    """The fleet's release signing key."""
    return Ed25519PrivateKey.generate()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    """The release server on the LAN."""
    started = ReleaseServer(tmp_path / "releases").start()
    yield started
    started.stop()


def ota_section(key: Ed25519PrivateKey, **more: Any) -> dict[str, dict[str, Any]]:
    """The agent config section that trusts `key`."""
    return {"ota": {"trusted_keys": [release.public_text(key)], "health_timeout": 60, **more}}


def offer(agent: RunningAgent, item: Release, server: ReleaseServer, offer_id: str) -> None:
    """Publish an offer of `item` on the agent's own ota topic."""
    body = item.offer(f"{server.url}{item.directory.name}/", id=offer_id)
    agent.watcher.publish(agent.topics.ota, json.dumps(body).encode())


def update_state(agent: RunningAgent, offer_id: str) -> str:
    """Wait for the final update event of an offer; its state."""
    wait_until(
        lambda: bool(_finals(agent.watcher, offer_id)) or not agent.process.alive(),
        what=f"the result of {offer_id}",
    )
    finals = _finals(agent.watcher, offer_id)
    assert finals, agent.process.output()[-3000:]
    return str(finals[-1]["state"])


def settled(agent: RunningAgent, offer_id: str, killed_offer: str) -> str:
    """The result of `offer_id`, sent after a restart. The killed agent may have died before its
    acknowledgement of `killed_offer` left: the broker then delivers that command again (at least
    once), the restarted agent carries it out, and `offer_id` is answered `busy` meanwhile. The
    result is then the redelivered command's."""
    state = update_state(agent, offer_id)
    return update_state(agent, killed_offer) if state == "busy" else state


def _finals(watcher: Watcher, offer_id: str) -> list[dict[str, Any]]:
    return [
        e for e in watcher.events(offer_id) if e["event"] == "update" and e["state"] in FINAL_STATES
    ]


def speaks(agent: RunningAgent, request_id: str) -> dict[str, Any]:
    """Say something; wait until it finished; the agent's state just after."""
    agent.watcher.publish(
        agent.topics.speak, json.dumps({"id": request_id, "text": "Hi."}).encode()
    )
    agent.watcher.wait_event(request_id, "finished")

    def states() -> list[dict[str, Any]]:
        return [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]

    before = len(states())  # the state is published at most every 0.25 s: take a later one
    wait_until(lambda: len(states()) > before and states()[-1]["queue_depth"] == 0, what="state")
    return states()[-1]


def sha256(path: Path) -> str:
    """The file's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_exit(agent: RunningAgent) -> int:
    """Wait for the agent to end by itself; its exit code."""
    wait_until(lambda: not agent.process.alive(), what="the agent to end")
    return agent.process.signal(signal.SIGTERM)


@pytest.mark.parametrize(
    "step", ["download", "verify", "install", "healthcheck", "switch", "commit", "rollback"]
)
def test_killed_at_each_step_comes_back_verified_and_the_update_completes(
    step: str,
    start_agent: StartAgent,
    server: ReleaseServer,
    key: Ed25519PrivateKey,
    tiny_voice: Path,
) -> None:
    """SIGKILL at the step, restart: a fully verified model speaks; offering again completes."""
    item = make_release(server.directory, key, 1)
    factory, new = sha256(tiny_voice), sha256(item.model)
    node, sections = f"kill-{step}", ota_section(key)
    if step == "rollback":
        agent = start_agent(tiny_voice, node_id=node, sections=sections)
        offer(agent, item, server, "first")
        assert update_state(agent, "first") == "installed"
        agent.process.signal(signal.SIGTERM)
        agent = start_agent(tiny_voice, node_id=node, sections=sections, env={FAULT_ENV: step})
        agent.watcher.publish(agent.topics.ota, b'{"id": "back", "rollback": true}')
    else:
        agent = start_agent(tiny_voice, node_id=node, sections=sections, env={FAULT_ENV: step})
        offer(agent, item, server, "first")
    assert wait_exit(agent) == -signal.SIGKILL

    again = start_agent(tiny_voice, node_id=node, sections=sections)
    state = speaks(again, "after-restart")
    assert state["model_sha256"] in {factory, new}, state
    if step == "rollback":
        if _finals(again.watcher, "back"):  # delivered again and carried out (see `settled`)
            assert update_state(again, "back") == "rolled_back"
        else:  # a second rollback would go to the other slot again: only when none ran
            again.watcher.publish(again.topics.ota, b'{"id": "back-again", "rollback": true}')
            assert settled(again, "back-again", "back") == "rolled_back"
        expected = (factory, 0)
    else:
        offer(again, item, server, "again")
        assert settled(again, "again", "first") in {"installed", "already_installed"}
        expected = (new, 1)
    state = speaks(again, "after-update")
    assert (state["model_sha256"], state["model_release"]) == expected


def test_a_model_the_agent_cannot_start_on_is_rolled_back_after_three_starts(
    start_agent: StartAgent, server: ReleaseServer, key: Ed25519PrivateKey, tiny_voice: Path
) -> None:
    """Installed, then killed before any start confirmed it; the model then breaks the start
    (here: the slot's file damaged). Three failed starts, and the fourth runs the old model."""
    item = make_release(server.directory, key, 1)
    node, sections = "crashloop", ota_section(key, max_start_attempts=3)
    agent = start_agent(tiny_voice, node_id=node, sections=sections, env={FAULT_ENV: "commit"})
    body = item.offer(f"{server.url}{item.directory.name}/", id="first")
    agent.watcher.publish("voice/all/ota", json.dumps(body).encode())  # the fleet topic
    assert wait_exit(agent) == -signal.SIGKILL
    slot_model = next((agent.capture.parent / "storage" / "ota" / node / "slots").rglob("*.onnx"))
    slot_model.write_bytes(b"damaged")
    for _ in range(3):
        failing = start_agent(tiny_voice, node_id=node, sections=sections, wait=False)
        assert wait_exit(failing) == 1
    back = start_agent(tiny_voice, node_id=node, sections=sections)
    assert update_state(back, "first") == "rolled_back"  # reported under the offer's id
    assert _finals(back.watcher, "first")[-1]["reason"] == "start_failed"
    state = speaks(back, "old-model")
    assert (state["model_sha256"], state["model_release"]) == (sha256(tiny_voice), 0)


def test_a_result_reached_while_the_broker_is_down_is_delivered_after(
    start_agent: StartAgent,
    broker: Broker,
    server: ReleaseServer,
    key: Ed25519PrivateKey,
    tiny_voice: Path,
) -> None:
    """A slow download on a group topic; the broker stops; the update ends; the broker returns:
    the `installed` event arrives, and the update entity shows the new version."""
    item = make_release(server.directory, key, 1)
    sections = ota_section(key, groups=["lobby"])
    agent = start_agent(tiny_voice, node_id="outage", sections=sections)
    watcher = Watcher(broker, "voice/outage/#", persistent="outage-watcher")
    server.behaviour.bytes_per_second = 1500
    body = item.offer(f"{server.url}{item.directory.name}/", id="during-outage")
    watcher.publish("voice/group/lobby/ota", json.dumps(body).encode())
    wait_until(
        lambda: any(e["event"] == "update" for e in watcher.events("during-outage")),
        what="the update to start",
    )
    broker.stop()
    state_file = agent.capture.parent / "storage" / "ota" / "outage" / "state.json"
    wait_until(
        lambda: state_file.is_file() and json.loads(state_file.read_text())["release"] == 1,
        what="the update to end with the broker down",
    )
    assert not any(e.get("state") == "installed" for e in watcher.events("during-outage"))
    broker.start()
    assert update_state_of(watcher, "during-outage") == "installed"
    update = [m.json() for m in watcher.snapshot() if m.topic == agent.topics.update]
    wait_until(
        lambda: any(
            u["installed_version"] == "1.0" and not u["in_progress"]
            for u in (m.json() for m in watcher.snapshot() if m.topic == agent.topics.update)
        ),
        what="the update entity to show 1.0",
    )
    assert any(u.get("in_progress") for u in update)  # progress was shown before the outage
    watcher.close()


def update_state_of(watcher: Watcher, offer_id: str) -> str:
    """The final update state of an offer as a watcher saw it."""
    wait_until(lambda: bool(_finals(watcher, offer_id)), TIMEOUT, f"the result of {offer_id}")
    return str(_finals(watcher, offer_id)[-1]["state"])


def test_staged_rollout_over_twenty_agents(
    start_agent: StartAgent,
    broker: Broker,
    server: ReleaseServer,
    key: Ed25519PrivateKey,
    tiny_voice: Path,
) -> None:
    """20 agents. A good release: the 4 canaries install before any other node is offered it,
    then the rest. A release too big for two canaries' memory limit: the rollout halts at the
    threshold, the canaries that installed it roll back, no other node is touched."""
    nodes = [f"n{i:02d}" for i in range(20)]
    small = {"n00", "n01"}  # small devices: a 300 MB limit for the check
    agents = {
        node: start_agent(
            tiny_voice,
            node_id=node,
            sections=ota_section(key, health_memory_mb=300 if node in small else 2048),
            wait=False,
        )
        for node in nodes
    }
    for agent in agents.values():
        agent.wait_online()
    good = make_release(server.directory, key, 1)
    heavy = make_release(server.directory, key, 2, fault="heavy")
    operator = fleet.Fleet(broker.host, broker.port)
    lines: list[str] = []
    try:
        first = fleet.rollout(
            operator,
            nodes,
            good.envelope,
            f"{server.url}{good.directory.name}/",
            canary_share=0.2,
            failure_threshold=0.25,
            timeout=TIMEOUT * 3,
            progress=lines.append,
        )
        assert not first.halted
        assert sorted(first.canary) == nodes[:4]
        assert set(first.canary.values()) == set(first.rest.values()) == {"installed"}
        canaries_done = max(_event_time(agents[n], "installed") for n in nodes[:4])
        rest_started = min(_event_time(agents[n], "verifying") for n in nodes[4:])
        assert canaries_done < rest_started

        second = fleet.rollout(
            operator,
            nodes,
            heavy.envelope,
            f"{server.url}{heavy.directory.name}/",
            canary_share=0.2,
            failure_threshold=0.25,
            timeout=TIMEOUT * 3,
            progress=lines.append,
        )
    finally:
        operator.close()
    assert second.halted
    assert second.canary == {
        "n00": "failed",
        "n01": "failed",
        "n02": "installed",
        "n03": "installed",
    }
    assert second.rolled_back == ["n02", "n03"]
    assert second.rest == {}
    for node in nodes:
        state = speaks(agents[node], f"check-{node}")
        assert (state["model_sha256"], state["model_release"]) == (sha256(good.model), 1), node
    assert any("halted" in line for line in lines), lines


def _event_time(agent: RunningAgent, update_state: str) -> float:
    found = [
        m.at
        for m in agent.watcher.snapshot()
        if m.topic == agent.topics.events
        and m.json().get("event") == "update"
        and m.json().get("state") == update_state
    ]
    assert found, f"{agent.topics.events}: no {update_state}"
    return found[0]
