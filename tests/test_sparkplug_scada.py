"""The node as a Sparkplug B edge node, through a real Mosquitto, commanded by a SCADA stand-in
built on another implementation (pysparkplug, from the Tahu proto, in a venv of its own:
harness/scada.py): births, data by exception, commands and their refusals, rebirth, the primary
host's STATE, and the NDEATH after a SIGKILL. `seq` is checked over every message of each
session. The payload-level checks without a broker: tests/test_sparkplug.py."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.formats.chimes import BUILTIN, render_notes
from agent.protocol.sparkplug import DEVICE_METRICS, NODE_METRICS
from harness import Broker, PulseNullSink, read_pcm, wait_until
from harness.scada import ScadaHost, metric, values
from tests.conftest import RunningAgent, StartAgent

pytestmark = [pytest.mark.plant, pytest.mark.broker, pytest.mark.voice]

GROUP, DEVICE, HOST = "plant", "speaker", "scada-1"
RATE = 22050
KEEPALIVE = 5
LONG_CHAT = (
    "Here is a long story for the afternoon, told slowly and with many details, so that it "
    "keeps playing for a good while. The weather was mild, the trees were green, and the "
    "river ran quietly past the old mill, where two cats slept in the sun all day long."
)
Decoded = dict[str, Any]


@pytest.fixture
def host(broker: Broker, tmp_path: Path) -> Iterator[ScadaHost]:
    """The primary host application, online on the test's broker."""
    scada = ScadaHost(broker.host, broker.port, HOST, log=tmp_path / "scada.log")
    scada.start()
    yield scada
    if scada.alive():
        scada.stop()


def sparkplug(**extra: Any) -> dict[str, dict[str, Any]]:
    values = {"enabled": True, "group_id": GROUP, "primary_host_id": HOST, "keepalive": KEEPALIVE}
    return {"sparkplug": values | extra}


def of(scada: ScadaHost, agent: RunningAgent, kind: str, since: int = 0) -> list[Decoded]:
    return scada.messages(kind, group=GROUP, edge=agent.topics.node_id, since=since)


def born(scada: ScadaHost, agent: RunningAgent, since: int = 0) -> tuple[Decoded, Decoded]:
    """The next NBIRTH and the DBIRTH after it."""
    node = agent.topics.node_id
    nbirth = scada.wait_for(
        lambda m: m["type"] == "NBIRTH" and m["edge"] == node, f"NBIRTH of {node}", since=since
    )
    after = scada.messages().index(nbirth)
    dbirth = scada.wait_for(
        lambda m: m["type"] == "DBIRTH" and m["edge"] == node, f"DBIRTH of {node}", since=after
    )
    return nbirth, dbirth


def ddata(scada: ScadaHost, agent: RunningAgent, name: str, value: Any, since: int) -> Decoded:
    """The first DDATA from `since` on that sets metric `name` to `value`."""
    return scada.wait_for(
        lambda m: (
            m["type"] == "DDATA"
            and m["edge"] == agent.topics.node_id
            and values(m).get(name) == value
        ),
        f"DDATA {name} = {value!r}",
        since=since,
    )


def assert_seq_continuous(scada: ScadaHost, agent: RunningAgent) -> None:
    """Within each session (from one NBIRTH to the next), every NBIRTH is seq 0 and each
    message after it the one before's seq + 1 (mod 256): none skipped, none repeated. Every
    message of the node is well formed as Sparkplug 3.0 says: births, data and deaths at QoS 0
    and not retained (the NDEATH Will at QoS 1), each with a UTC timestamp of when it was sent
    (within a minute of its arrival here)."""
    expected = None
    for message in scada.messages(group=GROUP, edge=agent.topics.node_id):
        kind = message["type"]
        if kind in {"DCMD", "NCMD"}:
            continue
        assert message["decoded"], message
        assert message["retain"] is False, message
        assert message["qos"] == (1 if kind == "NDEATH" else 0), message
        if kind != "NDEATH":  # the Will's timestamp is the CONNECT's
            assert abs(message["timestamp"] / 1000 - message["received"]) < 60, message
        if kind == "NDEATH":
            expected = None
            continue
        if kind == "NBIRTH":
            assert message["seq"] == 0, message
            expected = 1
            continue
        assert expected is not None, f"{kind} before any NBIRTH"
        assert message["seq"] == expected, (kind, message["seq"], expected)
        expected = (expected + 1) % 256


def test_the_births_describe_the_node_and_its_speaker(
    start_agent: StartAgent, host: ScadaHost, broker: Broker
) -> None:
    """NBIRTH: seq 0, bdSeq, the node controls; DBIRTH: every metric of the README's table with
    its alias, type and properties, the values the state shows; one DDATA later uses aliases
    only."""
    agent = start_agent(sections=sparkplug())
    nbirth, dbirth = born(host, agent)
    assert nbirth["seq"] == 0
    assert nbirth["bdSeq"] == 0  # a node's first session (storage is fresh)
    assert {m["name"] for m in nbirth["metrics"]} == {m.name for m in NODE_METRICS}
    assert dbirth["seq"] == 1
    by_name = {m["name"]: m for m in dbirth["metrics"]}
    assert list(by_name) == [m.name for m in DEVICE_METRICS]
    for declared in DEVICE_METRICS:
        seen = by_name[declared.name]
        assert (seen["alias"], seen["datatype_id"]) == (declared.alias, declared.datatype)
        assert seen["timestamp"] > 0
    assert by_name["Audio available"]["value"] is True
    assert by_name["Priority"]["value"] == "alarm"
    assert by_name["Volume"]["properties"]["engUnit"]["value"] == "ratio"
    assert by_name["Speak"]["properties"]["writable"]["value"] is True
    since = host.mark()
    agent.watcher.publish(agent.topics.volume, b"0.5")
    changed = ddata(host, agent, "Volume", 0.5, since)
    assert all(m["wire_name"] is None for m in changed["metrics"])  # aliases only
    address = f"{broker.host}:{broker.port}"

    def shown() -> list[dict[str, Any]]:
        return [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]

    wait_until(lambda: any(s["volume"] == 0.5 for s in shown()), what="the state after it")
    state = next(s for s in shown() if s["volume"] == 0.5)
    assert state["mqtt"] == {"server": address, "protocol": "5"}
    assert state["sparkplug"] == {"server": address}
    assert_seq_continuous(host, agent)


def test_a_critical_speak_preempts_chat_and_is_heard(
    start_agent: StartAgent, host: ScadaHost, pulse: PulseNullSink
) -> None:
    """A DCMD `Priority` = critical and `Speak`: the chat playing is preempted, the critical
    chime and the words are heard; `Speaking` and the events follow; a `Stop` ends it."""
    agent = start_agent(paced=pulse, sections=sparkplug())
    born(host, agent)
    agent.watcher.publish(
        agent.topics.speak,
        json.dumps({"id": "chat", "text": LONG_CHAT, "priority": "chat"}).encode(),
    )
    agent.watcher.wait_event("chat", "started")
    wait_until(lambda: agent.capture.stat().st_size > 2 * RATE, what="a second of the chat")
    since = host.mark()
    host.dcmd(
        GROUP,
        agent.topics.node_id,
        DEVICE,
        [metric("Priority", "String", "critical"), metric("Speak", "String", "Fire in hall two.")],
    )
    echoed = ddata(host, agent, "Speak", "Fire in hall two.", since)
    assert values(echoed)["Priority"] == "critical"
    agent.watcher.wait_event("chat", "preempted")

    def fire() -> list[dict[str, Any]]:
        return [e for e in agent.watcher.events() if str(e["id"]).startswith("spb-")]

    wait_until(lambda: any(e["event"] == "finished" for e in fire()), what="the Speak finished")
    assert [e["event"] for e in fire()] == ["accepted", "started", "finished"]
    assert {e["priority"] for e in fire()} == {"critical"}
    ddata(host, agent, "Speaking", False, since)
    played = read_pcm(agent.capture)
    chime = np.frombuffer(render_notes(BUILTIN["alert"], RATE), "<i2")
    probe = chime[np.flatnonzero(chime)[0] :][:200]
    windows = np.lib.stride_tricks.sliding_window_view(played, len(probe))
    assert (windows == probe).all(axis=1).any(), "the critical chime was not heard"
    # Stop: a chat started again is stopped by the host
    agent.watcher.publish(
        agent.topics.speak,
        json.dumps({"id": "chat2", "text": LONG_CHAT, "priority": "chat"}).encode(),
    )
    agent.watcher.wait_event("chat2", "started")
    host.dcmd(GROUP, agent.topics.node_id, DEVICE, [metric("Stop", "Boolean", True)])
    agent.watcher.wait_event("chat2", "stopped")
    assert_seq_continuous(host, agent)


def test_acknowledge_ends_an_alarms_repeats(start_agent: StartAgent, host: ScadaHost) -> None:
    """An alarm repeating until acknowledged shows `Alarm repeating`; the host's `Acknowledge`
    ends it (its `acknowledged` event) and the metric goes back to false."""
    agent = start_agent(sections=sparkplug())
    born(host, agent)
    since = host.mark()
    alarm = {"id": "gas", "text": "Gas leak.", "priority": "alarm", "repeat": 0}
    agent.watcher.publish(agent.topics.speak, json.dumps(alarm | {"repeat_interval": 2}).encode())
    agent.watcher.wait_event("gas", "finished")
    ddata(host, agent, "Alarm repeating", True, since)
    since = host.mark()
    host.dcmd(GROUP, agent.topics.node_id, DEVICE, [metric("Acknowledge", "Boolean", True)])
    agent.watcher.wait_event("gas", "acknowledged")
    ddata(host, agent, "Alarm repeating", False, since)
    assert_seq_continuous(host, agent)


def test_a_command_that_cannot_be_carried_out_is_answered_in_last_error(
    start_agent: StartAgent, host: ScadaHost
) -> None:
    """An unknown metric, a wrong type, a class that does not exist, a text the speak rules
    refuse: each leaves the metric as it was, says why in `Last error` and in a `rejected`
    event; the session stays (no new birth, no death); a good Speak after them is spoken;
    a Speak without datatypes (as Sparkplug 3.0 recommends for commands) too."""
    agent = start_agent(sections=sparkplug(), max_text_chars=40)
    node = agent.topics.node_id
    born(host, agent)
    cases = [
        ([metric("Bogus", "String", "x")], "Bogus: unknown metric"),
        ([metric("Speak", "Boolean", True)], "Speak: expected String"),
        ([metric("Priority", "String", "loud")], "Priority: expected one of"),
        ([metric("Speaking", "Boolean", True)], "Speaking: not writable"),
    ]

    def says(reason: str) -> Callable[[Decoded], bool]:
        return lambda m: (
            m["type"] == "DDATA" and str(values(m).get("Last error")).startswith(reason)
        )

    for metrics, reason in cases:
        since = host.mark()
        host.dcmd(GROUP, node, DEVICE, metrics)
        host.wait_for(says(reason), f"Last error {reason}", since=since)

    def rejected() -> list[dict[str, Any]]:
        return [e for e in agent.watcher.events() if e["event"] == "rejected"]

    wait_until(lambda: len(rejected()) >= len(cases), what="a rejected event per refusal")
    assert len(rejected()) == len(cases), rejected()
    assert all(e.get("source") == "sparkplug" for e in rejected())
    since = host.mark()
    host.dcmd(GROUP, node, DEVICE, [metric("Speak", "String", "x" * 200)])  # over 40 characters
    wait_until(
        lambda: any(
            e["event"] == "rejected" and e.get("reason") == "text_too_long"
            for e in agent.watcher.events()
        ),
        what="the long Speak rejected by the speak rules",
    )
    host.wait_for(
        lambda m: m["type"] == "DDATA" and "text_too_long" in str(values(m).get("Last error", "")),
        "Last error text_too_long",
        since=since,
    )
    host.dcmd(GROUP, node, DEVICE, [metric("Speak", "String", "All clear.")], datatypes=False)
    wait_until(
        lambda: any(
            e["event"] == "finished" and str(e["id"]).startswith("spb-")
            for e in agent.watcher.events()
        ),
        what="the good Speak finished",
    )
    assert [m["type"] for m in of(host, agent, "NBIRTH")] == ["NBIRTH"]
    assert of(host, agent, "NDEATH") == []
    assert_seq_continuous(host, agent)


def test_a_rebirth_and_a_death_keep_bd_seq_rules(
    start_agent: StartAgent, host: ScadaHost, broker: Broker
) -> None:
    """A rebirth: a new NBIRTH (seq 0, the same bdSeq) and DBIRTH, no new session. A SIGKILL:
    the NDEATH with that bdSeq within the keepalive. The restarted node: bdSeq + 1."""
    agent = start_agent(sections=sparkplug())
    node = agent.topics.node_id
    first, _ = born(host, agent)
    since = host.mark()
    host.rebirth(GROUP, node)
    again, dbirth = born(host, agent, since)
    assert (again["seq"], again["bdSeq"], dbirth["seq"]) == (0, first["bdSeq"], 1)
    assert_seq_continuous(host, agent)
    since = host.mark()
    agent.process.signal(signal.SIGKILL)
    death = host.wait_for(
        lambda m: m["type"] == "NDEATH" and m["edge"] == node,
        "NDEATH",
        timeout=KEEPALIVE * 1.5 + 30,
        since=since,
    )
    assert death["bdSeq"] == first["bdSeq"]
    assert death["seq"] is None
    # the same node again (same storage): the next session's number
    restarted = start_agent(node_id=node, sections=sparkplug())
    nbirth, _ = born(host, restarted, host.mark())
    assert nbirth["bdSeq"] == first["bdSeq"] + 1


def test_the_primary_host_going_offline_ends_the_session_until_it_is_back(
    start_agent: StartAgent, host: ScadaHost
) -> None:
    """STATE offline: the node publishes its NDEATH and leaves (here for the only server, so
    it comes back to it) and is born again only once the host says online."""
    agent = start_agent(sections=sparkplug())
    node = agent.topics.node_id
    first, _ = born(host, agent)
    since = host.mark()
    offline = host.state(False)
    death = host.wait_for(
        lambda m: m["type"] == "NDEATH" and m["edge"] == node, "NDEATH", since=since
    )
    assert death["bdSeq"] == first["bdSeq"]
    host.state(True, timestamp=offline["timestamp"] - 1)  # older than the offline: no birth
    newer = host.state(True)
    nbirth, _ = born(host, agent, since)
    states = [m for m in host.messages(since=since) if m["topic"] == host.state_topic]
    assert host.messages(since=since).index(nbirth) > host.messages(since=since).index(states[-1])
    assert states[-1]["timestamp"] == newer["timestamp"]
    assert nbirth["bdSeq"] != first["bdSeq"]  # a new session
    assert_seq_continuous(host, agent)


def test_a_graceful_stop_publishes_the_death(start_agent: StartAgent, host: ScadaHost) -> None:
    """SIGTERM: the node's own NDEATH before it disconnects, with its session's bdSeq."""
    agent = start_agent(sections=sparkplug())
    first, _ = born(host, agent)
    since = host.mark()
    assert agent.process.signal(signal.SIGTERM) == 0
    death = host.wait_for(
        lambda m: m["type"] == "NDEATH" and m["edge"] == agent.topics.node_id, "NDEATH", since=since
    )
    assert death["bdSeq"] == first["bdSeq"]


def test_next_server_and_a_lost_broker_move_the_node_between_two_brokers(
    start_agent: StartAgent, host: ScadaHost, broker: Broker, tmp_path: Path
) -> None:
    """Two independent Mosquittos in `mqtt.hosts`, the primary host on both. `Node Control/Next
    Server`: the NDEATH on the first, a new session (bdSeq + 1) born on the second once the
    host there is online. The second killed: the node comes back to the first and is born there
    again. `seq` is continuous within each session."""
    second = Broker(tmp_path / "second")
    second.start()
    there = ScadaHost(second.host, second.port, HOST, log=tmp_path / "scada-2.log")
    there.start()
    try:
        hosts = [
            {"host": broker.host, "port": broker.port},
            {"host": second.host, "port": second.port},
        ]
        listed = {"hosts": hosts, "host": "127.0.0.1", "port": 1883}  # the defaults: hosts rule
        agent = start_agent(sections={**sparkplug(), "mqtt": listed})
        node = agent.topics.node_id
        first, _ = born(host, agent)
        since = host.mark()
        host.next_server(GROUP, node)
        death = host.wait_for(
            lambda m: m["type"] == "NDEATH" and m["edge"] == node, "NDEATH", since=since
        )
        assert death["bdSeq"] == first["bdSeq"]
        moved, _ = born(there, agent)
        assert moved["bdSeq"] == (first["bdSeq"] + 1) % 256
        assert_seq_continuous(there, agent)
        since = host.mark()
        second.stop(signal.SIGKILL)
        back, _ = born(host, agent, since)
        assert back["bdSeq"] not in {first["bdSeq"], moved["bdSeq"]}
        assert_seq_continuous(host, agent)
    finally:
        if there.alive():
            there.kill()
        second.stop()
