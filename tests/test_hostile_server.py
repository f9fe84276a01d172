"""A hostile or compromised server in the ring (`mqtt.hosts`), through the real edge: the agent's
link and its Sparkplug session (paho, their sockets, the agent as a process) against a TCP
server that answers CONNACK and then misbehaves (tests/hostile_server.py: the attacker), with a
real Mosquitto as the next server. After each case the node speaks a control message (or its
link hands one over) in the same process.

docs/security.md, "A hostile or compromised server in the ring".
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.messages import Delivery
from agent.link.mqtt.link import MqttLink
from agent.link.sparkplug.session import BdSeq, SparkplugLink
from agent.protocol.sparkplug import SparkplugTopics
from agent.protocol.sparkplug_schema import Payload
from agent.settings.declarations import ConfigError, MqttConfig, MqttServer, SparkplugConfig
from agent.settings.loading import from_mapping
from harness import AgentProcess, Broker, Watcher, agent_config, publish, wait_until, write_config
from tests.conftest import StartAgent
from tests.hostile import server_behaviours
from tests.hostile_server import Connect, Connection, HostileServer, varint
from tests.hostile_server import publish as hostile_publish

pytestmark = pytest.mark.broker

NODE = "ringed"
SPEAK = f"voice/{NODE}/speak"
STATUS = f"voice/{NODE}/status"
LIMIT = 4096
"""`mqtt.max_packet_bytes` of the in-process links (small: the generated sizes pass it)."""


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int) -> None:
    """VmHWM = VmRSS from now (the kernel's clear_refs), for the process and its children."""
    for each in tree(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            Path(f"/proc/{each}/clear_refs").write_text("5", encoding="ascii")


def tree(pid: int) -> list[int]:
    """The process and its descendants (the sounder, its engine, the decoder child)."""
    found, todo = [], [pid]
    while todo:
        each = todo.pop()
        found.append(each)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # one that just ended
            for task in Path(f"/proc/{each}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def peak_kib(pid: int) -> int:
    """The sum of the peak resident sets of the process and its descendants (KiB)."""
    total = 0
    for each in tree(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += status_kib(each, "VmHWM")
    return total


def stream(conn: Connection, first: int, length: int) -> int:
    """Announce a packet of `length` bytes and send its body as fast as the node takes it;
    the bytes it took."""
    if not conn.send(bytes([first]) + varint(length)):
        return 0
    sent, chunk = 0, b"\0" * (1 << 20)
    while sent < length and conn.send(chunk[: length - sent]):
        sent += len(chunk)
    return sent


# ---- the link in-process: any behaviour after CONNACK ------------------------------------


class Probe:
    def __init__(self) -> None:
        self.link: MqttLink | None = None
        self.payloads: list[bytes] = []
        self.lock = threading.Lock()

    def handle(self, _topic: str, payload: bytes, delivery: Delivery) -> bool:
        with self.lock:
            self.payloads.append(payload)
        assert self.link is not None
        self.link.ack(delivery)
        return True


@pytest.fixture(scope="module")
def real_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    server = Broker(tmp_path_factory.mktemp("real"))
    server.start()
    yield server
    server.stop()


@settings(max_examples=16, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    behaviour=server_behaviours(LIMIT, [SPEAK, STATUS, "voice/other/speak"]),
    protocol=st.sampled_from(["auto", "3.1.1"]),
)
def test_whatever_a_server_sends_after_connack_the_link_moves_on_and_serves(
    real_broker: Broker, behaviour: list[bytes], protocol: Any
) -> None:
    """Oversized announcements, five-byte lengths, garbage, unasked acknowledgements, commands
    on any topic, packets cut short, then the connection closed: the link holds no packet over
    its bound, raises nothing, goes to the next server and hands over the next message there."""

    def script(conn: Connection) -> None:
        for chunk in behaviour:
            if not conn.send(chunk):
                return

    hostile = HostileServer(script)
    probe = Probe()
    config = MqttConfig(
        hosts=(
            MqttServer(hostile.host, hostile.port),
            MqttServer(real_broker.host, real_broker.port),
        ),
        protocol=protocol,
        reconnect_min=0.05,
        reconnect_max=1.0,
        max_packet_bytes=LIMIT,
    )
    client_id = f"voice-agent-{uuid.uuid4().hex[:8]}"
    link = MqttLink(config, client_id, STATUS, {SPEAK: probe.handle})
    probe.link = link
    address = f"{real_broker.host}:{real_broker.port}"
    link.start()
    try:
        wait_until(lambda: link.connected.is_set() and link.server == address, what="the broker")
        control = f"control {uuid.uuid4().hex}".encode()
        publish(real_broker, SPEAK, control)
        wait_until(lambda: control in probe.payloads, what="the control message")
        assert not link.failed.is_set()
        assert hostile.connects, "the hostile server was never tried"
    finally:
        link.stop()
        hostile.stop()
    assert not hostile.errors


# ---- the agent: a 64 MB PUBLISH from a server in the ring ---------------------------------


def test_a_64_mb_publish_from_a_server_in_the_ring_is_refused_unread(
    start_agent: StartAgent, broker: Broker, tiny_voice: Path
) -> None:
    """The issue's case: a server of `mqtt.hosts` sends a 64 MB PUBLISH after CONNACK, ignoring
    the Maximum Packet Size it was told. The link refuses it from its header (one log line),
    its memory does not grow with it, and the node speaks on through the next server."""
    armed, attacked = threading.Event(), threading.Event()
    taken: list[int] = []

    def script(conn: Connection) -> None:
        taken.append(stream(conn, 0x32, 64 * 1024 * 1024))
        attacked.set()

    def refuse(_connect: Connect) -> bool:  # all but the first visit once armed
        if not armed.is_set() or attacked.is_set():
            return True
        armed.clear()
        return False

    hostile = HostileServer(script, refuse=refuse)
    try:
        hosts = [hostile.entry, {"host": broker.host, "port": broker.port}]
        mqtt = {"hosts": hosts, "host": "127.0.0.1", "port": 1883}
        agent = start_agent(voice=tiny_voice, node_id=NODE, sections={"mqtt": mqtt})
        agent.watcher.publish(agent.topics.speak, b'{"id": "warm", "text": "Warm up."}')
        agent.watcher.wait_event("warm", "finished")
        pid = agent.process.pid
        reset_peak(pid)
        before = peak_kib(pid)
        armed.set()
        broker.stop(signal.SIGKILL)  # the link goes round the ring: to the hostile server
        wait_until(attacked.is_set, what="the attack")
        broker.start()
        watcher = Watcher(broker, f"voice/{NODE}/#")  # the first one's session went with it
        try:
            watcher.wait_payload(STATUS, b"online")
            line = "announced a packet of 67108869 bytes"
            wait_until(lambda: line in agent.process.output(), what="the refusal's log line")
            grown_mb = (peak_kib(pid) - before) / 1024
            print(f"peak +{grown_mb:.1f} MB; the server got {taken[0] / 2**20:.1f} MiB in")
            log = agent.process.output()
            assert log.count(line) == 1, log[-3000:]
            assert "read whole" not in log
            assert grown_mb < 24, grown_mb  # before: +193 MB
            watcher.publish(SPEAK, b'{"id": "after", "text": "All clear."}')
            watcher.wait_event("after", "finished")
        finally:
            watcher.close()
    finally:
        hostile.stop()


# ---- credentials: each server its own -----------------------------------------------------


def test_a_server_in_the_ring_never_receives_another_servers_credentials(
    tmp_path: Path, tiny_voice: Path
) -> None:
    """The issue's case: `mqtt.hosts` = [a hostile server, the real broker]. The hostile server
    (tried first) receives no user name and no password; the real broker gets its own and lets
    the node in; the node speaks."""
    broker = Broker(tmp_path / "secured")
    broker.require_login({NODE: "s3cret-of-the-broker", "watcher": "w"})
    broker.start()
    secret = tmp_path / "broker.password"
    secret.write_text("s3cret-of-the-broker\n")
    secret.chmod(0o600)
    hostile = HostileServer(lambda _conn: None, refuse=lambda _c: True)
    real = {"host": broker.host, "port": broker.port, "username": NODE}
    real["password_file"] = str(secret)
    mqtt = {"hosts": [hostile.entry, real], "reconnect_min": 0.1, "reconnect_max": 1.0}
    config = agent_config(None, tmp_path, NODE, voice=tiny_voice, mqtt=mqtt)
    agent = AgentProcess(write_config(tmp_path / "a.yaml", config), tmp_path / "a.log")
    watcher = Watcher(broker, f"voice/{NODE}/#", username="watcher", password="w")
    agent.start()
    try:
        watcher.wait_payload(STATUS, b"online")
        assert hostile.connects, "the hostile server was never tried"
        assert all(c.username is None and c.password is None for c in hostile.connects)
        watcher.publish(SPEAK, b'{"id": "control", "text": "Hello."}')
        watcher.wait_event("control", "finished")
    finally:
        agent.signal(signal.SIGTERM)
        watcher.close()
        hostile.stop()
        broker.stop()
    assert "s3cret" not in agent.output()


@pytest.mark.parametrize(
    ("host", "tls", "allowed", "refused"),
    [
        ("broker.plant.lan", False, False, True),
        ("broker.plant.lan", True, False, False),
        ("broker.plant.lan", False, True, False),
        ("127.0.0.1", False, False, False),
        ("localhost", False, False, False),
        ("::1", False, False, False),
        ("10.0.0.7", False, False, True),
    ],
)
def test_a_password_goes_only_over_tls_unless_the_owner_says_so(
    tmp_path: Path, host: str, tls: bool, allowed: bool, refused: bool
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    entry: dict[str, Any] = {"host": host, "username": "n", "password_file": str(secret)}
    entry |= {"tls": {"enabled": tls}, "allow_plaintext_password": allowed}
    for raw in ({"mqtt": {"hosts": [entry]}}, {"mqtt": entry}):
        if refused:
            with pytest.raises(ConfigError, match=r"would go to .* in clear"):
                from_mapping(raw, environ={})
        else:
            from_mapping(raw, environ={})


def test_credentials_at_the_top_with_a_ring_are_refused_naming_the_keys(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    raw = {"mqtt": {"hosts": [{"host": "a"}], "username": "n", "password_file": str(secret)}}
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw, environ={})
    assert "mqtt.username: set, but mqtt.hosts lists the servers" in str(caught.value)
    assert "mqtt.password_file: set, but mqtt.hosts lists the servers" in str(caught.value)


# ---- the Sparkplug session: a 50 MB DCMD --------------------------------------------------


def test_a_50_mb_dcmd_is_refused_unread_and_the_session_goes_on(
    start_agent: StartAgent, broker: Broker, tiny_voice: Path
) -> None:
    """The issue's case on the Sparkplug session (MQTT 3.1.1, no packet bound before): a server
    in the ring sends a 50 MB DCMD. The session throws its payload away unread (memory does not
    grow with it), answers it as the too large command it is (`Last error`, a `rejected` event
    on the agent's topic), and the node speaks on. The agent's own link is refused by that
    server and goes to the real broker."""
    go = threading.Event()
    taken: list[int] = []

    def script(conn: Connection) -> None:
        conn.ack_subscriptions()
        go.wait(60)
        topic = f"spBv1.0/plant/DCMD/{NODE}/speaker".encode()
        length = 50 * 1024 * 1024
        header = len(topic).to_bytes(2, "big") + topic + b"\x00\x01"
        conn.send(bytes([0x32]) + varint(length) + header)
        sent, chunk = len(header), b"\0" * (1 << 20)
        while sent < length and conn.send(chunk[: length - sent]):
            sent += len(chunk)
        taken.append(sent)
        speak = Payload(timestamp=1)  # then a good command: the framing goes on
        speak.metrics.add(name="Speak", datatype=12, string_value="After the big one.")
        conn.send(bytes([0x30]) + varint(len(header) - 2 + speak.ByteSize()) + header[:-2])
        conn.send(speak.SerializeToString())
        conn.serve()

    def spb(connect: Connect) -> bool:
        return "-spb-" in connect.client_id

    hostile = HostileServer(script, refuse=lambda c: not spb(c))
    try:
        hosts = [hostile.entry, {"host": broker.host, "port": broker.port}]
        sections = {
            "mqtt": {"hosts": hosts, "host": "127.0.0.1", "port": 1883},
            "sparkplug": {"enabled": True, "group_id": "plant"},
        }
        agent = start_agent(voice=tiny_voice, node_id=NODE, sections=sections)
        wait_until(lambda: any(spb(c) for c in hostile.connects), what="the Sparkplug session")
        agent.watcher.publish(agent.topics.speak, b'{"id": "warm", "text": "Warm up."}')
        agent.watcher.wait_event("warm", "finished")
        pid = agent.process.pid
        reset_peak(pid)
        before = peak_kib(pid)
        go.set()

        def refused() -> list[dict[str, Any]]:
            return [
                e
                for e in agent.watcher.events()
                if e["event"] == "rejected" and e.get("source") == "sparkplug"
            ]

        wait_until(lambda: bool(refused()), what="the DCMD answered")
        grown_mb = (peak_kib(pid) - before) / 1024
        print(f"peak +{grown_mb:.1f} MB; {taken} bytes sent; {refused()[0]['detail']}")
        assert "larger than allowed: unread" in refused()[0]["detail"]
        assert grown_mb < 24, grown_mb  # before: +145 to +156 MB
        wait_until(
            lambda: any(
                e["event"] == "finished" and e.get("source") == "sparkplug"
                for e in agent.watcher.events()
            ),
            what="the good command after it spoken",
        )
        print(f"{taken[0] / 2**20:.0f} MiB sent and thrown away")
        assert [c for c in hostile.connects if spb(c)][1:] == []  # the session was kept
        agent.watcher.publish(agent.topics.speak, b'{"id": "after", "text": "All clear."}')
        agent.watcher.wait_event("after", "finished")
    finally:
        go.set()
        hostile.stop()


# ---- leaving a server never blocks the loop -------------------------------------------------


def test_leaving_a_server_that_withholds_its_acknowledgement_never_waits_on_the_caller(
    real_broker: Broker,
) -> None:
    """`next_server` (called on the loop's thread for NCMD Next Server or the primary host
    going offline) waited up to 2 s for the broker's PUBACK of the NDEATH. Now it only asks:
    the session's own thread sends the NDEATH (after the call returned), waits for the
    acknowledgement a server may withhold, disconnects, and goes to the next server."""
    arrived: list[float] = []
    topics = SparkplugTopics("plant", NODE, "speaker")

    def script(conn: Connection) -> None:
        conn.ack_subscriptions()
        while (got := conn.read_packet(timeout=60)) is not None:  # never a PUBACK
            kind, body = got
            if kind == 3 and topics.ndeath.encode() in body[:200]:
                arrived.append(time.monotonic())

    hostile = HostileServer(script)
    events: list[object] = []
    config = MqttConfig(
        hosts=(
            MqttServer(hostile.host, hostile.port),
            MqttServer(real_broker.host, real_broker.port),
        ),
        reconnect_min=0.05,
        reconnect_max=1.0,
    )
    link = SparkplugLink(
        config,
        SparkplugConfig(enabled=True, group_id="plant"),
        topics,
        f"voice-agent-{NODE}-spb",
        bd_seq=BdSeq(None),
        on_event=events.append,
    )
    link.start()
    try:
        wait_until(lambda: link.server == hostile.entry_address, what="the session there")
        link.next_server()
        returned = time.monotonic()
        wait_until(lambda: bool(arrived), what="the NDEATH")
        assert arrived[0] > returned  # sent by the session's thread, after the call returned
        address = f"{real_broker.host}:{real_broker.port}"
        wait_until(lambda: link.server == address, what="the next server")
        assert [type(e).__name__ for e in events] == [
            "SparkplugConnected",
            "SparkplugLost",
            "SparkplugConnected",
        ]
    finally:
        link.stop()
        hostile.stop()


def test_a_next_server_command_from_a_server_that_never_acknowledges_leaves_it_and_speaks_on(
    start_agent: StartAgent, broker: Broker, tiny_voice: Path
) -> None:
    """Issue 34's goodbye through the agent: the server the Sparkplug session is on sends NCMD
    `Next Server` itself and then acknowledges nothing (the NDEATH's PUBACK withheld, no
    PINGRESP). The node says its NDEATH there, leaves it, is born on the next server of the ring
    and speaks a control message; its own session (on the real broker) was never held."""
    node = f"{NODE}bye"
    ndeath = threading.Event()
    ncmd = Payload(timestamp=1)
    ncmd.metrics.add(name="Node Control/Next Server", datatype=11, boolean_value=True)

    def script(conn: Connection) -> None:
        conn.ack_subscriptions()
        while (got := conn.read_packet(timeout=60)) is not None:  # until the NBIRTH
            if got[0] == 3 and b"NBIRTH" in got[1][:200]:
                break
        conn.send(hostile_publish(f"spBv1.0/plant/NCMD/{node}", ncmd.SerializeToString()))
        while (got := conn.read_packet(timeout=60)) is not None:  # never a PUBACK
            if got[0] == 3 and b"NDEATH" in got[1][:200]:
                ndeath.set()

    def spb(connect: Connect) -> bool:
        return "-spb-" in connect.client_id

    hostile = HostileServer(script, refuse=lambda c: not spb(c))
    births = Watcher(broker, f"spBv1.0/plant/NBIRTH/{node}")
    try:
        hosts = [hostile.entry, {"host": broker.host, "port": broker.port}]
        sections = {
            "mqtt": {"hosts": hosts, "host": "127.0.0.1", "port": 1883},
            "sparkplug": {"enabled": True, "group_id": "plant"},
        }
        agent = start_agent(voice=tiny_voice, node_id=node, sections=sections)
        wait_until(ndeath.is_set, what="the NDEATH on the server that asked")
        wait_until(lambda: bool(births.snapshot()), what="the NBIRTH on the next server")
        agent.watcher.publish(agent.topics.speak, b'{"id": "control", "text": "Hello."}')
        agent.watcher.wait_event("control", "finished")
        assert agent.process.alive()
        assert len([c for c in hostile.connects if spb(c)]) == 1  # left, not gone back
    finally:
        births.close()
        hostile.stop()
