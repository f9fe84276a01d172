"""The SCADA stand-in on its own (`harness/scada.py`), before it judges the agent: a Sparkplug B
3.0 primary host application built on pysparkplug, against a real Mosquitto, with pysparkplug's
own EdgeNode and Device (in the stand-in's venv) on the other side.

Its STATE birth and death certificates are read from the broker with the project's paho 2
client; the edge node's births, a DCMD echoed back as DDATA (by name and by alias), an NCMD as
NDATA, and the NDEATH the broker sends as the edge's will when it is SIGKILLed, are read as the
host decoded them. Bytes that do not decode are reported, and the host carries on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Broker, Watcher, publish, wait_until
from harness.scada import Decoded, ScadaHost, StandinEdge, install, metric, values

pytestmark = [pytest.mark.plant, pytest.mark.broker]

GROUP = "plant"
DEVICE = "voice"


@pytest.fixture(scope="session")
def scada_venv() -> Path:
    """The stand-in's venv, built once per machine (cached under .cache/scada-venv/)."""
    return install()


@pytest.fixture
def host(broker: Broker, tmp_path: Path, scada_venv: Path) -> Iterator[ScadaHost]:
    """A started host application on the test's broker, stopped gracefully after the test."""
    scada = ScadaHost(
        broker.host, broker.port, f"scada{uuid.uuid4().hex[:6]}", log=tmp_path / "h.log"
    )
    scada.start()
    yield scada
    scada.stop()


StartEdge = Callable[..., StandinEdge]


@pytest.fixture
def start_edge(broker: Broker, tmp_path: Path, scada_venv: Path) -> Iterator[StartEdge]:
    """Start pysparkplug edge nodes on the test's broker; killed after the test."""
    started: list[StandinEdge] = []

    def start(edge: str, **options: Any) -> StandinEdge:
        log = tmp_path / f"edge-{edge}.log"
        node = StandinEdge(broker.host, broker.port, GROUP, edge, DEVICE, log=log, **options)
        started.append(node.start())
        return node

    yield start
    for node in started:
        node.kill()


def retained_state(broker: Broker, host_id: str) -> tuple[dict[str, Any], bool]:
    """The STATE message the broker keeps for a host id, read by a new paho 2 client: its JSON
    payload and the retain flag it came with."""
    watcher = Watcher(broker, f"spBv1.0/STATE/{host_id}")
    try:
        wait_until(lambda: bool(watcher.snapshot()), what=f"the retained STATE of {host_id}")
        first = watcher.snapshot()[0]
        return first.json(), first.retain
    finally:
        watcher.close()


def of(kind: str, edge: str | None = None, device: str | None = None) -> Callable[[Decoded], bool]:
    """A predicate: a decoded message of that type (and edge node, device)."""
    return lambda m: (
        m["type"] == kind
        and (edge is None or m["edge"] == edge)
        and (device is None or m["device"] == device)
    )


def by_name(message: Decoded) -> dict[str, dict[str, Any]]:
    """A decoded message's metrics by (resolved) name."""
    return {m["name"]: m for m in message["metrics"]}


# ---------------------------------------------------------------------------------------------
# STATE
# ---------------------------------------------------------------------------------------------


def test_state_birth_is_retained_and_repeats_the_will_timestamp(
    broker: Broker, host: ScadaHost
) -> None:
    (birth,) = host.birth_timestamps()
    payload, retained = retained_state(broker, host.host_id)
    assert retained
    assert payload == {"online": True, "timestamp": birth}
    own = host.wait_online()  # the host reads its own birth back, at QoS 1
    assert own["qos"] == 1
    assert own["decoded"]
    assert own["type"] == "STATE"
    assert own["host_id"] == host.host_id

    assert host.stop() == 0
    payload, retained = retained_state(broker, host.host_id)
    assert retained
    assert payload["online"] is False
    assert payload["timestamp"] >= birth


def test_will_publishes_state_offline_when_the_host_is_killed(
    broker: Broker, host: ScadaHost
) -> None:
    (birth,) = host.birth_timestamps()
    host.kill()
    assert not host.alive()

    def offline() -> bool:
        return retained_state(broker, host.host_id)[0]["online"] is False

    wait_until(offline, what="the will's STATE offline")
    payload, retained = retained_state(broker, host.host_id)
    assert retained
    assert payload == {"online": False, "timestamp": birth}  # the will, timestamped at connect


def test_state_can_be_published_again(broker: Broker, host: ScadaHost) -> None:
    sent = host.state(online=False)
    assert retained_state(broker, host.host_id) == (
        {"online": False, "timestamp": sent["timestamp"]},
        True,
    )
    own = host.wait_for(lambda m: m["type"] == "STATE" and m.get("online") is False, "offline")
    assert own["timestamp"] == sent["timestamp"]

    sent = host.state(online=True, timestamp=sent["timestamp"] + 1)
    assert retained_state(broker, host.host_id) == (
        {"online": True, "timestamp": sent["timestamp"]},
        True,
    )


def test_host_reconnects_and_is_born_again_after_a_broker_restart(
    broker: Broker, host: ScadaHost
) -> None:
    (first,) = host.birth_timestamps()
    broker.stop()
    broker.start()
    host.wait_online(births=2)
    second = host.birth_timestamps()[-1]
    assert second > first  # a new will before the reconnect, and the birth repeats it
    assert [e["kind"] for e in host.connections()][:3] == ["connected", "disconnected", "connected"]
    wait_until(
        lambda: retained_state(broker, host.host_id)[0] == {"online": True, "timestamp": second},
        what="the new birth retained",
    )


# ---------------------------------------------------------------------------------------------
# An edge node: births, commands, death
# ---------------------------------------------------------------------------------------------


def test_edge_births_commands_echoed_and_death_by_will(
    host: ScadaHost, start_edge: StartEdge
) -> None:
    edge = start_edge("kitchen", keepalive=5)

    nbirth = host.wait_for(of("NBIRTH", "kitchen"), "NBIRTH")
    assert nbirth["decoded"], nbirth
    assert nbirth["group"] == GROUP
    assert nbirth["seq"] == 0
    assert isinstance(nbirth["timestamp"], int)
    metrics = by_name(nbirth)
    assert metrics["bdSeq"]["datatype"] == "Int64"  # pysparkplug's choice
    assert nbirth["bdSeq"] == metrics["bdSeq"]["value"]
    rebirth = metrics["Node Control/Rebirth"]
    assert (rebirth["datatype"], rebirth["alias"], rebirth["value"]) == ("Boolean", 101, False)
    assert rebirth["wire_name"] == "Node Control/Rebirth"
    assert rebirth["wire_datatype"] == "Boolean"

    dbirth = host.wait_for(of("DBIRTH", "kitchen", DEVICE), "DBIRTH")
    assert dbirth["decoded"], dbirth
    assert dbirth["seq"] == 1
    assert values(dbirth) == {
        "Speak": "",
        "Priority": "normal",
        "Stop": False,
        "Acknowledge": False,
        "Volume": 0.5,
    }
    assert {m["name"]: (m["datatype"], m["alias"]) for m in dbirth["metrics"]} == {
        "Speak": ("String", 1),
        "Priority": ("String", 2),
        "Stop": ("Boolean", 3),
        "Acknowledge": ("Boolean", 4),
        "Volume": ("Float", 5),
    }

    # A DCMD by name: the host sees its own command, then the edge's DDATA echo
    mark = host.mark()
    command = [
        metric("Speak", "String", "Hello there."),
        metric("Priority", "String", "warning"),
        metric("Stop", "Boolean", True),
        metric("Volume", "Float", 0.25),
    ]
    sent = host.dcmd(GROUP, "kitchen", DEVICE, command)
    assert sent["topic"] == f"spBv1.0/{GROUP}/DCMD/kitchen/{DEVICE}"
    own = host.wait_for(of("DCMD", "kitchen", DEVICE), "our DCMD", since=mark)
    assert own["decoded"]
    assert own["qos"] == 0
    assert own["timestamp"] == sent["timestamp"]
    assert own["seq"] is None  # commands carry no seq
    echo = host.wait_for(of("DDATA", "kitchen", DEVICE), "the DDATA echo", since=mark)
    assert echo["decoded"], echo
    expected = {"Speak": "Hello there.", "Priority": "warning", "Stop": True, "Volume": 0.25}
    assert values(echo) == expected
    assert all(m["wire_name"] == m["name"] for m in echo["metrics"])
    assert echo["seq"] == 2

    # By alias: the edge answers by alias only, without datatypes; names and datatypes come
    # from the DBIRTH
    mark = host.mark()
    host.dcmd(GROUP, "kitchen", DEVICE, [metric(1, "String", "By alias."), metric(5, "Float", 1.5)])
    own = host.wait_for(of("DCMD", "kitchen", DEVICE), "our DCMD by alias", since=mark)
    assert [(m["name"], m["alias"], m["wire_name"]) for m in own["metrics"]] == [
        ("Speak", 1, None),
        ("Volume", 5, None),
    ]
    echo = host.wait_for(of("DDATA", "kitchen", DEVICE), "the echo by alias", since=mark)
    assert echo["decoded"], echo
    assert values(echo) == {"Speak": "By alias.", "Volume": 1.5}
    speak = by_name(echo)["Speak"]
    assert (speak["alias"], speak["wire_name"], speak["wire_datatype"]) == (1, None, None)
    assert speak["datatype"] == "String"
    assert echo["seq"] == 3

    # Without datatypes on the wire (Sparkplug 3.0: commands SHOULD NOT carry them): the host
    # reads its own command through the DBIRTH; pysparkplug's edge node, which never reads its
    # own birth, cannot (0.6.1), says so, and carries on
    mark = host.mark()
    host.dcmd(GROUP, "kitchen", DEVICE, [metric("Acknowledge", "Boolean", True)], datatypes=False)
    own = host.wait_for(of("DCMD", "kitchen", DEVICE), "our DCMD without datatypes", since=mark)
    acknowledge = by_name(own)["Acknowledge"]
    assert (acknowledge["datatype"], acknowledge["wire_datatype"]) == ("Boolean", None)
    assert acknowledge["value"] is True
    error = edge.wait_event(lambda e: e["kind"] == "edge_error", "the edge's refusal")
    assert "UNKNOWN not implemented" in error["error"]

    # An NCMD: echoed as NDATA
    mark = host.mark()
    host.rebirth(GROUP, "kitchen")
    ndata = host.wait_for(of("NDATA", "kitchen"), "the NDATA echo", since=mark)
    assert values(ndata) == {"Node Control/Rebirth": True}
    host.next_server(GROUP, "kitchen")
    ndata = host.wait_for(
        lambda m: of("NDATA", "kitchen")(m) and "Node Control/Next Server" in values(m),
        "the Next Server echo",
        since=mark,
    )
    assert values(ndata) == {"Node Control/Next Server": True}
    kinds = [(c["type"], [m["name"] or m["alias"] for m in c["metrics"]]) for c in edge.commands()]
    assert kinds[:2] == [("DCMD", ["Speak", "Priority", "Stop", "Volume"]), ("DCMD", [1, 5])]
    assert ("NCMD", ["Node Control/Rebirth"]) in kinds
    assert len(edge.errors()) == 1  # the command without datatypes, nothing else

    # SIGKILL: the broker sends the edge's will, the NDEATH with the NBIRTH's bdSeq
    mark = host.mark()
    edge.kill()
    ndeath = host.wait_for(of("NDEATH", "kitchen"), "NDEATH", since=mark)
    assert ndeath["decoded"], ndeath
    assert ndeath["bdSeq"] == nbirth["bdSeq"]
    assert by_name(ndeath)["bdSeq"]["datatype"] == "Int64"


def test_two_edge_nodes_are_told_apart(host: ScadaHost, start_edge: StartEdge) -> None:
    start_edge("hall")
    start_edge("yard")
    for edge in ("hall", "yard"):
        host.wait_for(of("DBIRTH", edge, DEVICE), f"the DBIRTH of {edge}")
    mark = host.mark()
    host.dcmd(GROUP, "yard", DEVICE, [metric("Speak", "String", "Yard only.")])
    echo = host.wait_for(of("DDATA", "yard", DEVICE), "the yard's echo", since=mark)
    assert values(echo) == {"Speak": "Yard only."}
    assert host.messages("DDATA", edge="hall") == []


# ---------------------------------------------------------------------------------------------
# What does not decode, and what pysparkplug's classes do not make
# ---------------------------------------------------------------------------------------------


def test_undecodable_bytes_are_reported_and_the_host_carries_on(
    broker: Broker, host: ScadaHost
) -> None:
    garbage = b"\xff\x00not a protobuf"
    publish(broker, f"spBv1.0/{GROUP}/DDATA/nowhere/{DEVICE}", garbage)  # mosquitto_pub
    bad = host.wait_for(of("DDATA", "nowhere", DEVICE), "the garbage DDATA")
    assert not bad["decoded"]
    assert bad["length"] == len(garbage)
    assert bad["error"]
    assert bad["raw_hex"] == garbage.hex()

    publish(broker, "spBv1.0/STATE/someone-else", b"ONLINE")  # Sparkplug 2.2's STATE payload
    bad = host.wait_for(lambda m: m["host_id"] == "someone-else", "the old-style STATE")
    assert not bad["decoded"]
    assert bad["type"] == "STATE"

    publish(broker, f"spBv1.0/{GROUP}/NOPE/nowhere", b"\x08\x01")
    bad = host.wait_for(lambda m: m["topic"].endswith("/NOPE/nowhere"), "the unknown type")
    assert not bad["decoded"]
    assert bad["type"] is None

    no_timestamp = {"timestamp": None, "seq": 4, "metrics": [metric("Level", "Int32", -7)]}
    host.publish(f"spBv1.0/{GROUP}/NDATA/untimed", no_timestamp)
    bad = host.wait_for(of("NDATA", "untimed"), "the NDATA without timestamp")
    assert not bad["decoded"]
    assert "timestamp" in bad["error"]
    assert bad["protobuf"]["seq"] == "4"  # protobuf's JSON mapping writes uint64 as a string

    # Still decoding: a metric with properties (which pysparkplug's Metric has no field for)
    properties = {
        "engUnit": {"type": "String", "value": "dB"},
        "min": {"type": "Int32", "value": -60},
        "limits": {"type": "PropertySet", "value": {"high": {"type": "Double", "value": 0.5}}},
    }
    level = metric("Level", "Double", -3.5, properties=properties)
    host.publish(f"spBv1.0/{GROUP}/NDATA/props", {"seq": 0, "metrics": [level]})
    good = host.wait_for(of("NDATA", "props"), "the NDATA with properties")
    assert good["decoded"], good
    (reported,) = good["metrics"]
    assert (reported["name"], reported["datatype"], reported["value"]) == ("Level", "Double", -3.5)
    assert reported["properties"] == properties
    assert host.alive()


def test_retained_state_of_an_earlier_host_is_read_on_connect(
    broker: Broker, tmp_path: Path, scada_venv: Path
) -> None:
    first = ScadaHost(broker.host, broker.port, "primary", log=tmp_path / "first.log").start()
    first.kill()
    wait_until(lambda: retained_state(broker, "primary")[0]["online"] is False, what="the will")
    second = ScadaHost(broker.host, broker.port, "observer", log=tmp_path / "second.log")
    with second.start():
        seen = second.wait_for(
            lambda m: m["host_id"] == "primary" and m.get("online") is False, "the will retained"
        )
        assert seen["retain"]
        assert seen["timestamp"] == first.birth_timestamps()[0]
        assert json.loads(second.state(True)["payload"])["online"] is True


def test_host_logs_in_to_a_broker_that_requires_it(tmp_path: Path, scada_venv: Path) -> None:
    secure = Broker(tmp_path / "secure")
    secure.require_login({"scada": "s3cret"})
    secure.start()
    try:
        wrong = ScadaHost(
            secure.host, secure.port, "wrong", username="scada", password="nope", log=tmp_path / "w"
        )
        with wrong.start(wait=False):
            refused = wrong.wait_event(lambda e: e["kind"] == "connected", "the CONNACK")
            assert refused["rc"] == 5  # not authorised
        right = ScadaHost(
            secure.host,
            secure.port,
            "right",
            username="scada",
            password="s3cret",
            log=tmp_path / "r",
        )
        with right.start():
            assert right.wait_online()["decoded"]
    finally:
        secure.stop()
