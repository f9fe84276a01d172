"""A real three-node RabbitMQ 3.10 cluster with its MQTT plugin (harness/rabbitmq.py): what the
agent can count on there, and what it cannot. Each fact asserted here is one the agent's docs
cite; a RabbitMQ upgrade that changes one fails its test."""

from __future__ import annotations

import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from harness import wait_until
from harness.rabbitmq import RabbitCluster, RabbitNode

pytestmark = [pytest.mark.plant, pytest.mark.xdist_group("rabbitmq")]

QUIET = 3.0
"""Seconds a test waits to see that nothing arrives (a delivery on loopback takes milliseconds)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """Three clustered nodes for the module; a test that stops one starts it again."""
    with RabbitCluster(tmp_path_factory.mktemp("rabbitmq")) as running:
        yield running


class Client:
    """A paho MQTT 3.1.1 client (the only version RabbitMQ 3.10 speaks) that records what it
    sees: CONNACKs (session present, return code), disconnects and messages."""

    def __init__(self, node: RabbitNode, client_id: str = "", clean: bool = True) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.connacks: list[tuple[bool, int]] = []
        self.disconnects: list[int] = []
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv311,
            clean_session=clean,
        )
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = lambda _c, _u, msg: self.messages.append(msg)
        self._client.on_subscribe = lambda *_args: self._subscribed.set()
        self._client.reconnect_delay_set(5, 10)  # no reconnect storm after a refusal
        self._client.connect(node.host, node.mqtt_port, keepalive=30)
        self._client.loop_start()
        wait_until(lambda: bool(self.connacks), 30, f"CONNACK from {node.name}")

    def _on_connect(self, _c: mqtt.Client, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        self.connacks.append((bool(flags.session_present), int(reason.value)))

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self.disconnects.append(int(reason.value))

    @property
    def session_present(self) -> bool:
        """The first CONNACK's session-present flag."""
        return self.connacks[0][0]

    def subscribe(self, topic: str, wait: bool = True) -> None:
        """Subscribe at QoS 1 (and wait for the SUBACK)."""
        self._subscribed.clear()
        self._client.subscribe(topic, 1)
        if wait:
            assert self._subscribed.wait(30), "no SUBACK"

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Publish at QoS 1 and wait for the PUBACK."""
        self._client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(30)

    def payloads(self) -> list[bytes]:
        """The payloads received so far."""
        return [bytes(m.payload) for m in self.messages]

    def close(self) -> None:
        """Disconnect (a DISCONNECT packet: no will)."""
        self._client.disconnect()
        self._client.loop_stop()


def connect_with_will(node: RabbitNode, client_id: str, topic: str) -> socket.socket:
    """A raw MQTT 3.1.1 client with a QoS 1 will on `topic` (payload b"gone"), connected: the
    test then ends its connection in whichever way it studies."""
    will, payload = topic.encode(), b"gone"
    flags = 0x02 | 0x04 | 0x08  # clean session, will, will QoS 1
    header = b"\x00\x04MQTT\x04" + bytes([flags]) + struct.pack("!H", 60)
    body = b"".join(struct.pack("!H", len(f)) + f for f in (client_id.encode(), will, payload))
    sock = socket.create_connection((node.host, node.mqtt_port), timeout=30)
    sock.sendall(bytes([0x10, len(header) + len(body)]) + header + body)
    assert sock.recv(4) == b"\x20\x02\x00\x00", "no CONNACK accepting it"
    return sock


def test_the_cluster_runs_three_nodes(cluster: RabbitCluster) -> None:
    """Three disc nodes, all running, no partition, no alarm, as node 3 sees it."""
    names = {n.name for n in cluster.nodes}
    assert len(names) == 3
    status = cluster.cluster_status(cluster.nodes[2])
    assert set(status["running_nodes"]) == names
    assert set(status["disk_nodes"]) == names
    assert status["partitions"] == {}
    assert status["alarms"] == []
    for node in cluster.nodes:
        mqtt_listeners = [x for x in status["listeners"][node.name] if x["protocol"] == "mqtt"]
        assert [x["port"] for x in mqtt_listeners] == [node.mqtt_port]


def test_a_qos1_message_published_on_node_1_reaches_a_subscriber_on_node_3(
    cluster: RabbitCluster,
) -> None:
    topic = f"voice/{secrets.token_hex(4)}/speak"
    subscriber = Client(cluster.nodes[2])
    publisher = Client(cluster.nodes[0])
    try:
        subscriber.subscribe(topic)
        publisher.publish(topic, b"The front door is open.")
        wait_until(lambda: bool(subscriber.messages), 30, "the message on node 3")
        (message,) = subscriber.messages
        assert (message.topic, message.payload, message.qos) == (
            topic,
            b"The front door is open.",
            1,
        )
    finally:
        subscriber.close()
        publisher.close()


def test_an_mqtt5_connect_is_dropped_without_a_connack(cluster: RabbitCluster) -> None:
    """RabbitMQ 3.10's frame parser cannot read a 5.0 CONNECT (the properties after the keep
    alive): it logs "MQTT cannot parse a frame" and closes the socket. No CONNACK, so no return
    code 1 (unacceptable protocol version): paho 2.x never calls on_connect, calls on_disconnect
    with reason code 128 (Unspecified error, not from a DISCONNECT packet), and loop() returns
    MQTT_ERR_CONN_LOST. A client falls back to 3.1.1 on a connection lost before any CONNACK."""
    node = cluster.nodes[0]
    seen: list[tuple[str, Any]] = []
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="va-v5", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.on_connect = lambda _c, _u, _f, reason, _p: seen.append(("connect", reason))
    client.on_disconnect = lambda _c, _u, flags, reason, _p: seen.append(
        ("disconnect", (flags.is_disconnect_packet_from_server, reason.value, reason.getName()))
    )
    assert client.connect(node.host, node.mqtt_port) == MQTTErrorCode.MQTT_ERR_SUCCESS
    deadline = time.monotonic() + 30
    result = MQTTErrorCode.MQTT_ERR_SUCCESS
    while result == MQTTErrorCode.MQTT_ERR_SUCCESS and time.monotonic() < deadline:
        result = client.loop(0.1)
    assert result == MQTTErrorCode.MQTT_ERR_CONN_LOST
    assert seen == [("disconnect", (False, 128, "Unspecified error"))]

    # the same on the wire: a minimal 5.0 CONNECT (empty properties) gets end of stream
    header = b"\x00\x04MQTT\x05\x02" + struct.pack("!H", 60) + b"\x00"
    body = struct.pack("!H", 5) + b"va-v5"
    with socket.create_connection((node.host, node.mqtt_port), timeout=30) as sock:
        sock.sendall(bytes([0x10, len(header) + len(body)]) + header + body)
        assert sock.recv(16) == b""


def test_retained_messages_are_kept_per_node_and_found_by_exact_topic_only(
    cluster: RabbitCluster,
) -> None:
    """Each node keeps its own retained messages (a DETS file per vhost, not replicated): a
    subscriber gets one only on the node it was published to, and only with the exact topic as
    its filter (no lookup for wildcard filters). Publishing again on another node makes a second,
    separate retained message there."""
    base = f"voice/{secrets.token_hex(4)}"
    topic = f"{base}/status"
    first, second, third = cluster.nodes
    publisher = Client(first)
    try:
        publisher.publish(topic, b"online", retain=True)
    finally:
        publisher.close()

    def retained(node: RabbitNode, subscription: str) -> list[bytes]:
        subscriber = Client(node)
        try:
            subscriber.subscribe(subscription)
            time.sleep(QUIET)  # a retained message comes right after the SUBACK, if at all
            assert all(m.retain for m in subscriber.messages)
            return subscriber.payloads()
        finally:
            subscriber.close()

    with ThreadPoolExecutor(4) as pool:
        found = pool.map(
            retained, [first, first, second, third], [topic, f"{base}/#", topic, topic]
        )
        assert list(found) == [[b"online"], [], [], []]

    other = Client(third)
    try:
        other.publish(topic, b"offline", retain=True)
    finally:
        other.close()
    assert retained(third, topic) == [b"offline"]
    assert retained(first, topic) == [b"online"]


def test_a_persistent_session_lives_in_a_queue_on_the_node_it_subscribed_on(
    cluster: RabbitCluster,
) -> None:
    """clean_session=False with a QoS 1 subscription: a durable classic queue on the node where
    the client subscribed (its home node). While that node runs, the session can be resumed
    from any node. While it is stopped, a reconnect elsewhere gets session present = 0 and
    nothing; subscribing again there makes the node close the connection (queue.declare:
    home node down), and QoS 1 messages published meanwhile are acknowledged to the publisher and
    lost. When the home node is back, the session is present again with what was queued before
    it stopped. A retained message survives the node's graceful restart."""
    first, second, third = cluster.nodes
    client_id, topic = f"va-{secrets.token_hex(4)}", f"voice/{secrets.token_hex(4)}/speak"
    kept = f"voice/{secrets.token_hex(4)}/status"
    publisher = Client(first)
    try:
        session = Client(second, client_id, clean=False)
        session.subscribe(topic)
        session.close()
        retainer = Client(second)
        retainer.publish(kept, b"retained on node 2", retain=True)
        retainer.close()
        publisher.publish(topic, b"m1")

        session = Client(third, client_id, clean=False)  # home node running: resumed elsewhere
        wait_until(lambda: bool(session.messages), 30, "m1 from the session's queue")
        assert session.session_present
        assert session.payloads() == [b"m1"]
        session.close()
        publisher.publish(topic, b"m2")  # queued on node 2

        second.stop()
        session = Client(third, client_id, clean=False)
        time.sleep(QUIET)
        assert not session.session_present
        assert session.messages == []
        publisher.publish(topic, b"m3")  # PUBACKed, routed to a queue that is down: lost
        session.subscribe(topic, wait=False)
        wait_until(lambda: bool(session.disconnects), 30, "the node closing the connection")
        session.close()
    finally:
        if not second.alive():
            second.start()
        cluster.wait_ready()
        publisher.close()

    session = Client(third, client_id, clean=False)
    try:
        wait_until(lambda: bool(session.messages), 30, "m2 after node 2 returned")
        time.sleep(QUIET)
        assert session.session_present
        assert session.payloads() == [b"m2"]
    finally:
        session.close()
    watcher = Client(second)
    try:
        watcher.subscribe(kept)
        wait_until(lambda: bool(watcher.messages), 30, "the retained message after the restart")
        assert watcher.payloads() == [b"retained on node 2"]
    finally:
        watcher.close()


def test_the_will_is_published_when_the_connection_dies_not_when_its_node_does(
    cluster: RabbitCluster,
) -> None:
    """A client's connection reset (TCP RST, no DISCONNECT): its node publishes the will, and a
    subscriber on another node gets it. Its node killed (SIGKILL of the Erlang VM), or stopped
    gracefully: no will, then or after the node is back (no other node has the connection)."""
    first, second, third = cluster.nodes
    base = f"voice/{secrets.token_hex(4)}"
    watcher = Client(first)
    try:
        watcher.subscribe(f"{base}/#")
        sock = connect_with_will(second, f"va-{secrets.token_hex(4)}", f"{base}/reset")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST
        wait_until(lambda: bool(watcher.messages), 30, "the will after a reset")
        assert [(m.topic, m.payload) for m in watcher.messages] == [(f"{base}/reset", b"gone")]

        on_killed = connect_with_will(second, f"va-{secrets.token_hex(4)}", f"{base}/killed")
        on_stopped = connect_with_will(third, f"va-{secrets.token_hex(4)}", f"{base}/stopped")
        second.kill()
        third.stop()
        time.sleep(2 * QUIET)
        on_killed.close()
        on_stopped.close()
    finally:
        for node in (second, third):
            if not node.alive():
                node.start()
        cluster.wait_ready()
    time.sleep(QUIET)
    watcher.close()
    assert [m.topic for m in watcher.messages] == [f"{base}/reset"]
    assert cluster.running_nodes() == {n.name for n in cluster.nodes}


def test_the_workdir_holds_each_node_apart(cluster: RabbitCluster) -> None:
    """Each node has its own data and logs under the cluster's folder, and one shared cookie."""
    cookie = cluster.home / ".erlang.cookie"
    assert cookie.stat().st_mode & 0o777 == 0o400
    for node in cluster.nodes:
        assert Path(node.env["RABBITMQ_MNESIA_BASE"]).is_relative_to(cluster.workdir)
        assert (node.log_dir / f"{node.name}.log").exists()
