"""The MQTT edge's callbacks and its ring of servers on their own (the network paths are tested
against Mosquitto: tests/test_failover.py and the agent's tests), and its reading held back
while its consumer has no room, against Mosquitto."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from agent.core.messages import Delivery
from agent.link.mqtt.link import MqttLink
from agent.link.mqtt.servers import UNSUPPORTED_PROTOCOL, Ring, Step, delay, refusal
from agent.settings.declarations import MqttConfig, MqttProtocol, MqttServer
from harness import TIMEOUT, Broker, Watcher, wait_until


def link() -> MqttLink:
    return MqttLink(
        MqttConfig(), "voice-agent-test", "voice/test/status", {"voice/test/speak": _drop}
    )


def _drop(topic: str, payload: bytes, mid: object) -> bool:
    del topic, payload, mid
    return True


@pytest.mark.allow_error_logs("broker refused a subscription: Not authorized")
def test_a_refused_subscription_is_reported_and_sends_the_link_through_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    under_test = link()
    granted = ReasonCode(PacketTypes.SUBACK, "Granted QoS 1")
    refused = ReasonCode(PacketTypes.SUBACK, "Not authorized")
    with caplog.at_level(logging.ERROR):
        under_test._on_subscribe(under_test._client, None, 1, [granted, refused], None)
    assert under_test.last_error == "broker refused a subscription: Not authorized"
    assert "reconnecting later" in caplog.text


def test_granted_subscriptions_change_nothing() -> None:
    under_test = link()
    granted = ReasonCode(PacketTypes.SUBACK, "Granted QoS 1")
    under_test._on_subscribe(under_test._client, None, 1, [granted, granted], None)
    assert under_test.last_error is None


# ---- the ring of servers ------------------------------------------------------------------

A, B, C = MqttServer("a"), MqttServer("b"), MqttServer("c")


def test_each_failure_moves_to_the_next_server_and_a_full_round_backs_off() -> None:
    ring = Ring((A, B, C), "auto")
    steps = []
    for _ in range(6):
        steps.append((ring.current.host, ring.failed(maybe_not_v5=False)))
    assert steps == [
        ("a", Step.NEXT),
        ("b", Step.NEXT),
        ("c", Step.ROUND),
        ("a", Step.NEXT),
        ("b", Step.NEXT),
        ("c", Step.ROUND),
    ]
    assert ring.rounds == 2
    assert not ring.connected()
    assert (ring.current.host, ring.rounds) == ("a", 0)


def test_a_lost_connection_starts_a_round_on_the_next_server() -> None:
    ring = Ring((A, B), "auto")
    ring.lost()
    assert ring.current.host == "b"
    assert ring.failed(maybe_not_v5=False) is Step.NEXT  # a: the rest of this round
    assert ring.failed(maybe_not_v5=False) is Step.ROUND


def test_a_single_server_backs_off_after_each_failure() -> None:
    ring = Ring((A,), "auto")
    assert [ring.failed(maybe_not_v5=False) for _ in range(3)] == [Step.ROUND] * 3
    assert ring.rounds == 3
    ring.lost()
    assert (ring.current.host, ring.rounds) == ("a", 0)


def test_auto_retries_a_server_with_311_and_remembers_it_once_that_connects() -> None:
    ring = Ring((A, B), "auto")
    assert ring.version == "5"
    assert ring.failed(maybe_not_v5=True, refused_version=True) is Step.SAME
    assert (ring.current.host, ring.version) == ("a", "3.1.1")
    assert ring.connected()  # learned: a speaks 3.1.1 only
    ring.lost()
    assert (ring.current.host, ring.version) == ("b", "5")
    assert ring.failed(maybe_not_v5=False) is Step.NEXT
    assert (ring.current.host, ring.version) == ("a", "3.1.1")
    assert ring.failed(maybe_not_v5=True) is Step.ROUND  # already 3.1.1: on to the next


def test_a_server_that_took_mqtt5_is_not_downgraded_by_an_early_close() -> None:
    """A full inbox once had the link reconnect, and the broker's early close of that
    connection looked like a refusal of MQTT 5: the link spoke 3.1.1 for good. A server that
    took MQTT 5 is tried with 3.1.1 only after an explicit refusal of the version."""
    ring = Ring((A,), "auto")
    assert not ring.connected()  # took MQTT 5
    ring.lost()
    assert ring.failed(maybe_not_v5=True) is Step.ROUND  # closed before its CONNACK
    assert str(ring.version) == "5"
    assert not ring.connected()
    assert ring.failed(maybe_not_v5=True, refused_version=True) is Step.SAME  # "unsupported"
    assert ring.version == "3.1.1"


def test_an_early_close_at_a_first_connect_is_retried_with_311_but_not_remembered() -> None:
    """A new process's first CONNECT closed before its CONNACK (the broker restarting, or a
    broker that drops MQTT 5 silently): 3.1.1 is tried at once, and the next connection
    offers MQTT 5 again (only an explicit refusal of the version is remembered)."""
    ring = Ring((A,), "auto")
    assert ring.failed(maybe_not_v5=True) is Step.SAME
    assert ring.version == "3.1.1"
    assert not ring.connected()  # nothing learned for good
    ring.lost()
    assert str(ring.version) == "5"


def test_a_311_retry_that_fails_too_forgets_the_guess() -> None:
    ring = Ring((A, B), "auto")
    assert ring.failed(maybe_not_v5=True) is Step.SAME
    assert ring.failed(maybe_not_v5=False) is Step.NEXT
    assert ring.failed(maybe_not_v5=False) is Step.ROUND
    assert (ring.current.host, ring.version) == ("a", "5")


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_fixed_version_never_falls_back(protocol: MqttProtocol) -> None:
    ring = Ring((A, B), protocol)
    assert ring.failed(maybe_not_v5=True) is Step.NEXT
    assert ring.version == protocol


def test_a_ring_that_follows_a_leader_goes_there_first_and_back_there_from_elsewhere() -> None:
    """The engine's ring follows the sounder's server (issue 33): its first attempt, and the
    next after a failure or a loss elsewhere, go to the leader; a failure or a loss on the
    leader's server goes round as usual (the leader most likely goes the same way)."""
    ring = Ring((A, B, C), "auto")
    assert ring.follow("nowhere:1883") is None
    assert ring.leader is None
    assert ring.follow(C.address) == 2
    ring.start_at_leader()
    assert ring.current.host == "c"
    assert ring.failed(maybe_not_v5=False) is Step.NEXT  # c, the leader's, failed: round
    assert ring.current.host == "a"
    assert ring.failed(maybe_not_v5=False) is Step.NEXT  # a failed: back to the leader's
    assert ring.current.host == "c"
    assert not ring.connected()
    ring.lost()  # lost on the leader's server: on round the ring
    assert ring.current.host == "a"
    assert ring.follow(B.address) == 1
    ring.lost()  # lost elsewhere: to the leader's
    assert ring.current.host == "b"
    unled = Ring((A, B, C), "auto")
    unled.start_at_leader()
    assert unled.current.host == "a"


def test_the_delays_short_in_a_round_then_growing_per_round() -> None:
    for _ in range(200):
        assert delay(Step.SAME, 0, 0.5, 60) == 0
        assert 0 <= delay(Step.NEXT, 0, 0.5, 60) <= 0.5
        assert 0.5 <= delay(Step.ROUND, 1, 0.5, 60) <= 1.0
        assert 0.5 <= delay(Step.ROUND, 4, 0.5, 60) <= 4.5
        assert 0.5 <= delay(Step.ROUND, 40, 0.5, 60) <= 60.5
    assert max(delay(Step.ROUND, 4, 0.5, 60) for _ in range(200)) > 2.0


def test_a_311_refusal_names_its_return_code() -> None:
    reason = ReasonCode(PacketTypes.CONNACK, "Not authorized")
    assert refusal(reason, "3.1.1") == "Not authorized (MQTT 3.1.1 return code 5)"
    assert refusal(reason, "5") == "Not authorized"
    unsupported = ReasonCode(PacketTypes.CONNACK, "Unsupported protocol version")
    assert unsupported.value == UNSUPPORTED_PROTOCOL


def test_an_acknowledgement_of_an_earlier_connection_is_not_sent() -> None:
    under_test = link()
    stale = Delivery(7, 1, False, "f")
    under_test.ack(stale)  # never received on this connection: nothing to acknowledge
    other = Delivery(7, 1, False, "g")  # another message, same packet id
    under_test._publishes.received(other)
    under_test.ack(stale)
    assert under_test._publishes.take(other)  # the other one still waits for its own ack


def test_the_link_reports_its_first_server_and_version_before_connecting() -> None:
    config = MqttConfig(hosts=(MqttServer("a", 1884), MqttServer("b")), protocol="3.1.1")
    under_test = MqttLink(config, "id", "voice/t/status", {"voice/t/speak": _drop})
    assert (under_test.server, under_test.protocol) == ("a:1884", "3.1.1")


@pytest.mark.broker
def test_a_consumer_without_room_holds_the_next_packet_back_and_nothing_is_refused(
    broker: Broker,
) -> None:
    """A broker that sends more than the consumer has room for (here a Receive Maximum of 1000
    against room for 8; Mosquitto resuming a session after its restart sends all it queued,
    whatever the window): with `room`, the link reads no further packet while the consumer is
    full, the broker keeps the rest, and every message is handed over once, none refused."""
    room = 8
    waiting: queue.Queue[Delivery] = queue.Queue(room)
    handed: list[bytes] = []
    refused: list[bytes] = []
    consuming = threading.Event()
    config = MqttConfig(host=broker.host, port=broker.port, receive_maximum=1000)

    def handle(_topic: str, payload: bytes, delivery: Delivery) -> bool:
        try:
            waiting.put_nowait(delivery)
        except queue.Full:
            refused.append(payload)  # the inbox's answer: `queue_full`, acknowledged
            return False
        handed.append(payload)
        return True

    status, speak = "voice/room/status", "voice/room/speak"
    subject = MqttLink(
        config, "voice-agent-room", status, {speak: handle}, room=lambda: not waiting.full()
    )
    watcher = Watcher(broker, status)
    stop = threading.Event()

    def consume() -> None:  # the app's loop: slower than the network
        consuming.wait()
        while not stop.is_set():
            with contextlib.suppress(queue.Empty):
                subject.ack(waiting.get(timeout=0.1))
                time.sleep(0.002)

    consumer = threading.Thread(target=consume)
    consumer.start()
    subject.start()
    try:
        watcher.wait_payload(status, b"online")  # subscribed
        sent = [f"m{n:03d}".encode() for n in range(300)]
        for payload in sent:
            watcher.publish(speak, payload)
        wait_until(lambda: len(handed) >= room, what="the consumer's room filled")
        consuming.set()
        wait_until(lambda: len(handed) + len(refused) >= len(sent), what="every message")
        assert refused == []
        assert sorted(handed) == sent
    finally:
        stop.set()
        consuming.set()
        consumer.join(TIMEOUT)
        subject.stop()
        watcher.close()
