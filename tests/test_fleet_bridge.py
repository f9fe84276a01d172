"""Two Mosquittos bridged (`topic voice/# both 1`): agents and simulated nodes on the site broker,
the operator's tool on the central one. Speak, state and a rollout work across the bridge; with
the bridge cut, the tool reports the bridge down and the nodes stale without hanging, and a
rollout started meanwhile finishes once the bridge is back (its offers and the nodes' answers
were queued by the brokers)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness import TIMEOUT, Broker, Watcher, wait_until
from harness.fleet_sim import Behaviour, NodeSpec, SimFleet, fleet_broker, tool
from ota import release, rollout_state
from tests.conftest import StartAgent
from tests.release_server import ReleaseServer
from tests.test_faults import PartitionProxy
from tests.test_ota import make_release

pytestmark = [pytest.mark.broker, pytest.mark.fleet]

BRIDGE_ID = "central-bridge"


@dataclass
class Bridged:
    """The site broker (the test's `broker`), the central one, and the network between."""

    site: Broker
    central: Broker
    link: PartitionProxy


@pytest.fixture
def bridged(broker: Broker, tmp_path: Path) -> Iterator[Bridged]:
    """The operator's broker, bridged to the site broker through a proxy the test can cut."""
    link = PartitionProxy(broker.port)
    bridge = [
        "connection site-a",
        f"address 127.0.0.1:{link.port}",
        "topic voice/# both 1",
        "cleansession false",
        f"remote_clientid {BRIDGE_ID}",
        "local_clientid bridge-site-a",
        "notifications true",
        "restart_timeout 1 2",
        "keepalive_interval 5",
    ]
    central = fleet_broker(tmp_path / "central", bridge)
    central.start()
    yield Bridged(broker, central, link)
    central.stop()
    link.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReleaseServer]:
    """The release server (HTTP on loopback, not through the bridge)."""
    started = ReleaseServer(tmp_path / "releases").start()
    yield started
    started.stop()


def status(central: Broker, *args: str) -> dict[str, Any]:
    """`python -m ota status --json` on the central broker, as JSON."""
    shown = subprocess.run(
        tool(central, "status", "--json", *args),
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert shown.returncode == 0, shown.stderr
    document: dict[str, Any] = json.loads(shown.stdout)
    return document


def presences(document: dict[str, Any]) -> dict[str, str]:
    """Node -> presence."""
    return {n["node"]: n["presence"] for n in document["nodes"]}


def test_speak_state_and_rollouts_across_a_bridge_and_its_outage(
    bridged: Bridged, server: ReleaseServer, start_agent: StartAgent, tiny_voice: Path
) -> None:
    broker, central, link = bridged.site, bridged.central, bridged.link
    key = Ed25519PrivateKey.generate()
    sections = {
        "ota": {
            "trusted_keys": [release.public_text(key)],
            "hosts": ["127.0.0.1:*"],  # the release server
            "health_timeout": 60,
        },
        "state": {"interval": 1},
    }
    agents = {n: start_agent(tiny_voice, node_id=n, sections=sections) for n in ("site1", "site2")}
    how = Behaviour(state_interval=1, trusted_keys=(release.public_text(key),))
    specs = [NodeSpec(f"simsite{i}") for i in range(3)]
    sim = SimFleet(broker.host, broker.port, specs, how).start()
    operator = Watcher(central, "voice/+/events", f"$SYS/broker/connection/{BRIDGE_ID}/state")
    try:
        sim.wait_ready(TIMEOUT)
        nodes = sorted([*agents, *sim.nodes])
        wait_until(
            lambda: presences(status(central)) == dict.fromkeys(nodes, "online"),
            what="the site's nodes on the central broker",
        )

        speak = {"id": "over-the-bridge", "text": "Hello from the central broker."}
        operator.publish("voice/site1/speak", json.dumps(speak).encode())
        assert operator.wait_event("over-the-bridge", "finished")["node"] == "site1"

        first = make_release(server.directory, key, 1)
        state_file = central.workdir / "r1.json"
        rollout = [str(first.directory / "manifest.json"), "--nodes", ",".join(nodes)]
        rollout += ["--base-url", f"{server.url}{first.directory.name}/", "--soak", "0"]
        done = subprocess.run(
            tool(central, "rollout", *rollout, "--waves", "2,all", "--state-file", str(state_file)),
            check=False,
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 3,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        wait_until(
            lambda: (
                {n["node"]: n["model_release"] for n in status(central)["nodes"]}
                == dict.fromkeys(nodes, 1)
            ),
            what="release 1 in the state the central broker holds",
        )

        link.cut()
        operator.wait_payload(f"$SYS/broker/connection/{BRIDGE_ID}/state", b"0")
        once = status(central)  # returns at once: the retained view, and the bridge down
        assert once["bridges"][BRIDGE_ID]["state"] == "down"
        watching = subprocess.Popen(
            tool(central, "status", "--json", "--watch", "--interval", "0.5", "--stale-after", "3"),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert watching.stdout is not None
            for line in watching.stdout:  # nothing heard from the site: stale within seconds
                if set(presences(json.loads(line)).values()) == {"stale"}:
                    break
        finally:
            watching.kill()
            watching.wait(TIMEOUT)

        second = make_release(server.directory, key, 2, gain=0.007)
        later = central.workdir / "r2.json"
        rollout = [str(second.directory / "manifest.json"), "--nodes", ",".join(nodes)]
        rollout += ["--base-url", f"{server.url}{second.directory.name}/", "--soak", "0"]
        rollout += ["--waves", "all", "--node-timeout", "300", "--state-file", str(later)]
        running = subprocess.Popen(tool(central, "rollout", *rollout), stdout=subprocess.PIPE)
        try:
            wait_until(
                lambda: (
                    later.is_file() and rollout_state.load(later).waves[0].offered_at is not None
                ),
                what="offers published on the central broker",
            )
            offer_id = rollout_state.load(later).waves[0].offer_id
            assert all(offer_id not in sim.offers(n) for n in sim.nodes)  # cut off
            link.heal()
            assert running.wait(TIMEOUT * 3) == 0
        finally:
            if running.poll() is None:
                running.kill()
            running.wait(TIMEOUT)
        plan = rollout_state.load(later)
        assert {plan.nodes[n].state for n in nodes} == {"installed"}
        for node in sim.nodes:
            assert sim.offers(node).count(offer_id) == 1
        for agent in agents.values():
            verifying = [e for e in agent.watcher.events(offer_id) if e.get("state") == "verifying"]
            assert len(verifying) == 1
        assert operator.wait_payload(f"$SYS/broker/connection/{BRIDGE_ID}/state", b"1")
    finally:
        operator.close()
        sim.stop()
