"""A publisher in the Sparkplug namespace and on STATE topics, through a real Mosquitto and the
SCADA stand-in (harness/scada.py): a command of 32 writes is one request, a flood of them holds
no critical back, a forged STATE neither kills the node nor keeps it unborn. Each case ends with
the node speaking a control message.

docs/security.md, "A publisher in the Sparkplug namespace and on STATE topics"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Broker, PulseNullSink, wait_until
from harness.scada import ScadaHost, metric
from tests.conftest import StartAgent
from tests.test_sparkplug_scada import GROUP, HOST, born, of, sparkplug

pytestmark = [pytest.mark.plant, pytest.mark.broker]

DCMDS = 100
WRITES = 32


@pytest.fixture
def host(broker: Broker, tmp_path: Path) -> Iterator[ScadaHost]:
    scada = ScadaHost(broker.host, broker.port, HOST, log=tmp_path / "scada.log")
    scada.start()
    yield scada
    if scada.alive():
        scada.stop()


def test_a_flood_of_32_write_commands_is_one_request_each_and_a_critical_overtakes_it(
    start_agent: StartAgent, host: ScadaHost, pulse: PulseNullSink, tiny_voice: Path
) -> None:
    """The issue's amplification: DCMDs of 32 Speak writes each were 32 speaks, and a flood of
    them put thousands of requests ahead of an alarm. Now a command is one request (its first
    Speak), its other writes refused in one answer; and a `critical` published after the flood
    is spoken before the flood's alarms that were still waiting."""
    agent = start_agent(voice=tiny_voice, paced=pulse, sections=sparkplug())
    node = agent.topics.node_id
    born(host, agent)
    for n in range(DCMDS):
        writes = [metric("Speak", "String", f"Pump {n} tripped, write {w}.") for w in range(WRITES)]
        host.dcmd(GROUP, node, "speaker", writes, datatypes=False)

    def spb(kind: str) -> list[dict[str, Any]]:
        return [
            e
            for e in agent.watcher.events()
            if e["event"] == kind and str(e["id"]).startswith("spb-")
        ]

    wait_until(lambda: bool(spb("started")), what="the flood playing")
    before = {e["id"] for e in spb("accepted")}
    critical = {"id": "fire", "text": "Fire in hall two.", "priority": "critical"}
    agent.watcher.publish(agent.topics.speak, json.dumps(critical).encode())
    agent.watcher.wait_event("fire", "finished")
    events = agent.watcher.events()
    fire = next(n for n, e in enumerate(events) if e["id"] == "fire" and e["event"] == "started")
    earlier = {e["id"] for e in events[:fire] if e["event"] == "started"}
    assert before - earlier, "no request of the flood that waited was overtaken"

    def answered() -> int:  # one by one, then the flood's summary
        refusals = [e for e in spb("rejected") if "Speak: written 31 more times" in e["detail"]]
        held = [e for e in agent.watcher.events() if e["event"] == "suppressed"]
        return len(refusals) + sum(int(e["reasons"].get("invalid_field", 0)) for e in held)

    wait_until(lambda: answered() == DCMDS, timeout=300, what="one answer per command")
    agent.watcher.publish(agent.topics.stop, b'{"clear": true}')
    requests = {e["id"] for e in spb("accepted")} | {
        e["id"] for e in spb("rejected") if e.get("reason") == "queue_full"
    }
    assert len(requests) <= DCMDS  # one request per command (before: 32 each)
    print(f"{len(requests)} requests, {len(before - earlier)} overtaken by the critical")
    assert len(spb("accepted")) >= 1
    agent.watcher.publish(agent.topics.speak, b'{"id": "control", "text": "All clear."}')
    agent.watcher.wait_event("control", "finished")


def test_a_forged_state_stamped_far_ahead_neither_kills_the_node_nor_keeps_it_unborn(
    start_agent: StartAgent, host: ScadaHost, tiny_voice: Path
) -> None:
    """The issue's case: one STATE `offline` stamped 10^15 on the primary host's topic gave an
    NDEATH, and the host's genuine `online` after it no birth until a restart. Now it is
    ignored (one warning): the session stays (a rebirth asked after it keeps the bdSeq, no
    NDEATH); the host's genuine offline and online still move the node."""
    agent = start_agent(voice=tiny_voice, sections=sparkplug())
    node = agent.topics.node_id
    first, _ = born(host, agent)
    since = host.mark()
    host.state(False, timestamp=10**15)  # retained: every new session of the node reads it too
    host.rebirth(GROUP, node)  # answered after the forged STATE (same session, in order)
    again, _ = born(host, agent, since)
    assert again["bdSeq"] == first["bdSeq"]
    assert of(host, agent, "NDEATH", since) == []
    wait_until(lambda: "is implausible" in agent.process.output(), what="the warning")
    since = host.mark()
    host.state(False)  # genuine: the node leaves
    host.wait_for(lambda m: m["type"] == "NDEATH" and m["edge"] == node, "NDEATH", since=since)
    host.state(True)
    born(host, agent, since)
    agent.watcher.publish(agent.topics.speak, b'{"id": "control", "text": "Hello."}')
    agent.watcher.wait_event("control", "finished")
