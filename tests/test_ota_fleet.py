"""Model updates with real agents on a real broker: SIGKILL at every step of an update, an agent
that cannot start on its new model, a result reached while the broker is down, and a staged
rollout in waves over 20 agent processes with the operator tool, and its inventory of real
agents."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.core.states import FINAL_PHASES as FINAL_STATES
from agent.updates.steps import FAULT_ENV
from harness import TIMEOUT, Broker, Watcher, wait_until
from harness.fleet_sim import tool
from ota import release, rollout_state
from tests.conftest import RunningAgent, StartAgent
from tests.release_server import ReleaseServer
from tests.test_ota import Release, make_release
from tests.tiny_voice import write_tiny_voice

pytestmark = pytest.mark.broker


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
    trusted = {"trusted_keys": [release.public_text(key)], "hosts": ["127.0.0.1:*"]}
    return {"ota": {**trusted, "health_timeout": 60, **more}}


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
    """Say something; wait until it finished; a state published after it (a state is published
    when it changes, at most every 0.25 s: it may reach the watcher before or after the event;
    a retained one of an earlier run comes first)."""
    agent.watcher.publish(
        agent.topics.speak, json.dumps({"id": request_id, "text": "Hi."}).encode()
    )
    done = stamp(agent.watcher.wait_event(request_id, "finished"))

    def after() -> list[dict[str, Any]]:
        shown = [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
        return [s for s in shown if stamp(s) >= done and s["queue_depth"] == 0]

    wait_until(lambda: bool(after()), what="a state after the message")
    return after()[-1]


def stamp(message: dict[str, Any]) -> datetime:
    """The agent's time of an event or a state (its `ts`)."""
    return datetime.fromisoformat(str(message["ts"]).replace("Z", "+00:00"))


def sha256(path: Path) -> str:
    """The file's sha256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_killed_at(agent: RunningAgent, step: str) -> None:
    """Wait for the fault hook to kill the engine at `step` (an update's download,
    verification, install and health check come first: 3 minutes allowed, for a machine running
    other tests too), then stop the node at once: the sounder would start another engine with
    the same hook after its backoff, and that engine would be killed again where the update
    resumes (a pending switch is confirmed at each start). The test starts the node again
    without the hook, as the old test had systemd restart the killed agent."""
    ends = agent.process.wait_engine_ends(1, timeout=180.0)
    agent.process.signal(signal.SIGTERM)
    assert ends[0][1] == "killed by SIGKILL", ends
    # once: the node stopped before another engine got there
    assert agent.process.output().count(f"Fault injection: killed at {step}") == 1


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
    wait_killed_at(agent, step)

    again = start_agent(tiny_voice, node_id=node, sections=sections)
    state = speaks(again, "after-restart")
    assert state["model_sha256"] in {factory, new}, state
    if step == "rollback":
        # The killed `back` may be delivered again (its acknowledgement may not have left): the
        # broker sends it at the session's resumption, before anything published now, and it
        # may still be running. Whether it was is only known once `back-again` is answered;
        # each rollback that runs goes to the other slot (a check of the state before it raced
        # with the redelivery: both ran, and the node was back on release 1).
        again.watcher.publish(again.topics.ota, b'{"id": "back-again", "rollback": true}')
        answered = update_state(again, "back-again")
        redelivered = bool(_finals(again.watcher, "back"))
        if answered == "busy":  # `back` ran meanwhile, `back-again` did not
            assert update_state(again, "back") == "rolled_back"
            expected = (factory, 0)
        else:
            assert answered == "rolled_back"
            expected = (new, 1) if redelivered else (factory, 0)
    else:
        offer(again, item, server, "again")
        result = settled(again, "again", "first")
        finals = [*_finals(again.watcher, "again"), *_finals(again.watcher, "first")]
        told = [(f.get("id"), f.get("state"), f.get("reason"), f.get("detail")) for f in finals]
        assert result in {"installed", "already_installed"}, told
        expected = (new, 1)
    state = speaks(again, "after-update")
    assert (state["model_sha256"], state["model_release"]) == expected


@pytest.mark.allow_error_logs(r"Release \d+ cannot be used \(damaged\)")
def test_a_damaged_model_the_agent_was_switching_to_is_left_at_the_next_start(
    start_agent: StartAgent, server: ReleaseServer, key: Ed25519PrivateKey, tiny_voice: Path
) -> None:
    """Installed, then killed before any start confirmed it; the slot's file is then damaged (a
    bad card sector). The next start sees the digest no longer matches, starts on the old model
    at once (no crash loop), and reports `rolled_back`, `damaged`, under the offer's id."""
    item = make_release(server.directory, key, 1)
    node, sections = "damaged", ota_section(key, max_start_attempts=3)
    agent = start_agent(tiny_voice, node_id=node, sections=sections, env={FAULT_ENV: "commit"})
    body = item.offer(f"{server.url}{item.directory.name}/", id="first")
    agent.watcher.publish("voice/all/ota", json.dumps(body).encode())  # the fleet topic
    wait_killed_at(agent, "commit")
    slot_model = next((agent.capture.parent / "storage" / "ota" / node / "slots").rglob("*.onnx"))
    slot_model.write_bytes(b"damaged")
    back = start_agent(tiny_voice, node_id=node, sections=sections)
    # the `installed` reached before the kill may come first (from the journal's outbox)
    wait_until(
        lambda: "rolled_back" in [f["state"] for f in _finals(back.watcher, "first")],
        what="rolled_back reported under the offer's id",
    )
    last = _finals(back.watcher, "first")[-1]
    assert (last["state"], last["reason"]) == ("rolled_back", "damaged")
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


def voice_at(directory: Path, rate: int) -> Path:
    """The tiny voice declared at another sample rate (a device that runs at that rate)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = write_tiny_voice(directory, "tiny16k.onnx")
    config = Path(f"{model}.json")
    body = json.loads(config.read_text())
    body["audio"]["sample_rate"] = rate
    config.write_text(json.dumps(body))
    return model


def run_tool(broker: Broker, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator's tool as an operator runs it, to its end."""
    return subprocess.run(
        tool(broker, command, *args), check=False, capture_output=True, text=True, timeout=600
    )


def test_wave_rollout_over_twenty_agents(
    start_agent: StartAgent,
    broker: Broker,
    server: ReleaseServer,
    key: Ed25519PrivateKey,
    tiny_voice: Path,
) -> None:
    """20 agents; n00 and n01 run at 16 kHz. Release 1 (22.05 kHz) goes to n02-n19 in waves of
    4, 6 and 8: each wave ends before the next is offered. Release 2 (22.05 kHz, healthy) goes
    to all 20 in waves of 4 and 16: the health check of n00 and n01 refuses its sample rate (a
    reason that no CPU load changes), 2 of 4 > 25 %, the rollout halts, n02 and n03 (which
    installed it) are rolled back, and n04-n19 are never offered it."""
    nodes = [f"n{i:02d}" for i in range(20)]
    tmp_path = server.directory.parent
    slow_rate = voice_at(tmp_path / "voice16k", 16000)
    agents = {
        node: start_agent(
            slow_rate if node in {"n00", "n01"} else tiny_voice,
            node_id=node,
            sections=ota_section(key),
            wait=False,
        )
        for node in nodes
    }
    # 40 processes starting at once (each node's sounder, then its engine, whose session must
    # exist before the node says online) on a machine running other tests: minutes, not one
    wait_until(
        lambda: all(online(a) or not a.process.alive() for a in agents.values()),
        600,
        "the 20 nodes online",
    )
    assert all(a.process.alive() for a in agents.values())
    good = make_release(server.directory, key, 1)
    newer = make_release(server.directory, key, 2, gain=0.007)
    first_state, second_state = tmp_path / "r1.json", tmp_path / "r2.json"
    common = ["--soak", "0", "--node-timeout", "300", "--error-threshold", "0.25"]
    first = run_tool(
        broker,
        "rollout",
        str(good.directory / "manifest.json"),
        "--base-url",
        f"{server.url}{good.directory.name}/",
        "--nodes",
        ",".join(nodes[2:]),
        "--waves",
        "4,10,all",
        "--state-file",
        str(first_state),
        *common,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    plan = rollout_state.load(first_state)
    assert [w.nodes for w in plan.waves] == [nodes[2:6], nodes[6:12], nodes[12:]]
    assert {plan.nodes[n].state for n in nodes[2:]} == {"installed"}
    for done, following in itertools.pairwise(plan.waves):
        finished = max(_event_time(agents[n], "installed") for n in done.nodes)
        begun = min(_event_time(agents[n], "verifying") for n in following.nodes)
        assert finished < begun, (done.index, following.index)

    second = run_tool(
        broker,
        "rollout",
        str(newer.directory / "manifest.json"),
        "--base-url",
        f"{server.url}{newer.directory.name}/",
        "--nodes",
        ",".join(nodes),
        "--waves",
        "4,all",
        "--rollback-on-halt",
        "--state-file",
        str(second_state),
        *common,
    )
    assert second.returncode == 1, second.stdout + second.stderr
    halted = rollout_state.load(second_state)
    assert halted.status == "halted"
    assert [w.outcome for w in halted.waves] == ["halted", None]
    outcome = {n: (halted.nodes[n].state, halted.nodes[n].reason) for n in nodes[:4]}
    assert outcome == {
        "n00": ("failed", "health_check"),
        "n01": ("failed", "health_check"),
        "n02": ("installed", None),
        "n03": ("installed", None),
    }
    assert "sample rate" in str(halted.nodes["n00"].detail)
    assert [n for n in nodes if halted.nodes[n].rollback == "rolled_back"] == ["n02", "n03"]
    for node in nodes[4:]:
        assert not agents[node].watcher.events(halted.waves[1].offer_id), node
    for node in nodes:
        state = speaks(agents[node], f"check-{node}")
        expected = (sha256(slow_rate), 0) if node in {"n00", "n01"} else (sha256(good.model), 1)
        assert (state["model_sha256"], state["model_release"]) == expected, node
    assert "halted at wave 1" in second.stdout
    for agent in agents.values():  # all stop at once; the fixture then waits for each
        os.kill(agent.process.pid, signal.SIGTERM)


def test_inventory_of_real_agents_shows_a_killed_one_offline(
    start_agent: StartAgent, broker: Broker, key: Ed25519PrivateKey, tiny_voice: Path
) -> None:
    """Three agents; one is killed (its Last Will says offline): `status` lists all three, the
    killed one offline, each with what its retained state says (None for a field it does not
    publish, `?` in the table)."""
    agents = {
        node: start_agent(tiny_voice, node_id=node, sections=ota_section(key))
        for node in ("inv-a", "inv-b", "inv-c")
    }
    states = {node: speaks(agent, f"hello-{node}") for node, agent in agents.items()}
    agents["inv-b"].process.signal(signal.SIGKILL)
    agents["inv-b"].watcher.wait_payload("voice/inv-b/status", b"offline")
    shown = run_tool(broker, "status", "--json")
    assert shown.returncode == 0, shown.stderr
    nodes = {n["node"]: n for n in json.loads(shown.stdout)["nodes"]}
    assert sorted(nodes) == ["inv-a", "inv-b", "inv-c"]
    assert {n: v["presence"] for n, v in nodes.items()} == {
        "inv-a": "online",
        "inv-b": "offline",
        "inv-c": "online",
    }
    for node, view in nodes.items():
        published = states[node]
        for name in ("model", "model_version", "model_sha256", "model_release", "audio"):
            assert view[name] == published[name], (node, name)
        for name in ("device_class", "agent_version", "last_update"):  # the lead's new fields
            assert view[name] == published.get(name), (node, name)
        assert view["model_sha256"] == sha256(tiny_voice)
    table = run_tool(broker, "status")
    assert table.returncode == 0, table.stderr
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith("inv-b"))
    assert row[1] == "offline"
    assert "3 nodes: 2 online, 1 offline" in table.stdout
    if "device_class" not in states["inv-b"]:
        assert "?" in row


def online(agent: RunningAgent) -> bool:
    """The node's retained status says online (its last word on the topic)."""
    said = [m.payload for m in agent.watcher.snapshot() if m.topic == agent.topics.status]
    return said[-1:] == [b"online"]


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


def test_a_revocation_published_by_the_tool_reaches_running_and_restarted_nodes(
    start_agent: StartAgent,
    tiny_voice: Path,
    key: Ed25519PrivateKey,
    broker: Broker,
    tmp_path: Path,
) -> None:
    """`python -m ota revoke` signs a revocation and publishes it retained: a running node
    verifies and keeps it (`noted`: nothing installed to leave); a node that restarts reads the
    retained one again without reporting it twice, and its state still shows the result as the
    last update; a second `keygen` never overwrites a key."""
    keys = tmp_path / "keys"

    def keygen() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "ota", "keygen", str(keys)]
        return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)

    assert keygen().returncode == 0
    again = keygen()
    assert again.returncode != 0
    assert "never overwritten" in again.stderr
    signing = keys / "release.key"
    agent = start_agent(voice=tiny_voice, sections=ota_section(release.load_private_key(signing)))
    done = run_tool(broker, "revoke", "--key", str(signing), "--min-release", "3")
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: any(
            e["event"] == "update" and e.get("state") == "noted" for e in agent.watcher.events()
        ),
        what="the revocation noted",
    )
    reported = [e for e in agent.watcher.events() if e["event"] == "update"]
    agent.process.signal(signal.SIGTERM)
    agent.watcher.clear()
    agent.process.start()
    agent.wait_online()
    state = speaks(agent, "on")
    noted = next(e for e in reported if e.get("state") == "noted")
    # the last result outlives the restart (state.json), with the time it was reached
    assert state["last_update"] == {
        "id": noted["id"],
        "state": "noted",
        "reason": None,
        "release": 0,
        "ts": state["last_update"]["ts"],
    }, state["last_update"]
    assert abs((stamp(state["last_update"]) - stamp(noted)).total_seconds()) < 5
    # not news again: no new report (events are at least once: one whose acknowledgement had
    # not reached the stopping engine is sent again from its outbox, the same event, its `ts`)
    after = [e for e in agent.watcher.events() if e["event"] == "update"]
    assert all(e in reported for e in after), (after, reported)
