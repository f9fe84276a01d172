"""End to end on real parts: Mosquitto, mosquitto_pub, the agent subprocess with the joe voice,
and ALSA's file PCM capturing exactly what was played."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from harness import Broker, Watcher, publish, read_pcm, speech_stats, wait_until
from tests.conftest import RunningAgent, StartAgent

pytestmark = [pytest.mark.broker, pytest.mark.voice]

RATE = 22050  # en_US-joe-medium


def assert_speech(
    agent: RunningAgent, finished: dict[str, object], low: float, high: float
) -> None:
    """The capture holds plausible speech of the length the `finished` event reports."""
    samples = read_pcm(agent.capture)
    stats = speech_stats(samples, RATE)
    assert low <= stats["seconds"] <= high, stats
    assert stats["seconds"] == pytest.approx(finished["audio_seconds"], abs=0.002)
    assert stats["rms_dbfs"] > -40, stats  # joe speaks at about -26 dBFS RMS
    assert stats["voiced_share"] > 0.5, stats


def test_json_speak_is_spoken_with_lifecycle_events(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent()
    payload = {"id": "door-1", "text": "The front door is open."}
    publish(broker, agent.topics.speak, json.dumps(payload).encode())

    finished = agent.watcher.wait_event("door-1", "finished")
    assert [e["event"] for e in agent.watcher.events("door-1")] == [
        "accepted",
        "started",
        "finished",
    ]
    assert all(
        e["node"] == agent.topics.node_id and e["ts"].endswith("Z") for e in agent.watcher.events()
    )
    assert_speech(agent, finished, 0.8, 3.0)


def test_plain_text_payload_gets_an_id_and_is_spoken(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent()
    publish(broker, agent.topics.speak, b"Pump three is running. Pressure is normal.")

    wait_until(lambda: any(e["event"] == "finished" for e in agent.watcher.events()))
    (finished,) = [e for e in agent.watcher.events() if e["event"] == "finished"]
    assert len(finished["id"]) == 32  # a generated uuid4 hex
    assert_speech(agent, finished, 1.5, 6.0)


def test_fleet_topic_reaches_the_node(start_agent: StartAgent, broker: Broker) -> None:
    agent = start_agent()
    publish(broker, agent.topics.speak_all, b'{"id": "all-1", "text": "Attention all stations."}')

    finished = agent.watcher.wait_event("all-1", "finished")
    assert_speech(agent, finished, 0.8, 4.0)


def test_unknown_fields_are_reported_in_accepted(start_agent: StartAgent, broker: Broker) -> None:
    agent = start_agent()
    publish(broker, agent.topics.speak, b'{"id": "u1", "text": "Hello.", "colour": "red"}')

    accepted = agent.watcher.wait_event("u1", "accepted")
    assert accepted["unknown_fields"] == ["colour"]
    agent.watcher.wait_event("u1", "finished")


def test_online_is_retained_and_sigkill_leaves_offline(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent()
    late = Watcher(broker, agent.topics.status)  # subscribes after start: sees the retained copy
    try:
        online = late.wait_payload(agent.topics.status, b"online")
        assert online.retain

        agent.process.signal(signal.SIGKILL)
        late.wait_payload(agent.topics.status, b"offline", timeout=10)  # the Last Will
    finally:
        late.close()
    again = Watcher(broker, agent.topics.status)
    try:
        assert again.wait_payload(agent.topics.status, b"offline").retain
    finally:
        again.close()


def test_clean_stop_publishes_offline(start_agent: StartAgent) -> None:
    agent = start_agent()
    assert agent.process.signal(signal.SIGTERM) == 0
    agent.watcher.wait_payload(agent.topics.status, b"offline", timeout=10)


@pytest.mark.parametrize(
    ("tier", "line"),
    [
        ("fp32", "Serving node"),  # the loader thread is loading and prewarming the voice
        ("auto", "prewarmed in"),  # it is measuring the voice's speed for its tier
    ],
)
def test_a_stop_while_a_voice_runs_on_the_loader_thread_is_clean(
    start_agent: StartAgent, tier: str, line: str
) -> None:
    """SIGTERM while ONNX Runtime works on the loader thread: the agent stops with 0 and says
    offline, never aborted by the runtime torn down under that thread (seen under QEMU, where
    the speed measurement takes minutes: exit -6, "terminate called without an active
    exception")."""
    agent = start_agent(sections={"tts": {"tier": tier}}, wait=False)
    wait_until(lambda: line in agent.process.output(), what=line)
    assert agent.process.signal(signal.SIGTERM) == 0, agent.process.output()
    assert "terminate called" not in agent.process.output()
    agent.watcher.wait_payload(agent.topics.status, b"offline", timeout=10)


def test_messages_published_while_killed_are_spoken_once_after_restart(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent()  # creates the persistent session and its subscriptions
    agent.process.signal(signal.SIGKILL)
    ids = [f"queued-{n}" for n in range(5)]
    for n, request_id in enumerate(ids):
        text = f"Message number {n + 1}."
        publish(broker, agent.topics.speak, json.dumps({"id": request_id, "text": text}).encode())

    agent.process.start()
    for request_id in ids:
        agent.watcher.wait_event(request_id, "finished")
    time.sleep(1.0)  # room for any duplicate to show up
    for request_id in ids:
        kinds = [e["event"] for e in agent.watcher.events(request_id)]
        assert kinds == ["accepted", "started", "finished"], (request_id, kinds)
    finished_order = [e["id"] for e in agent.watcher.events() if e["event"] == "finished"]
    assert finished_order == ids  # first in, first out


def test_bad_input_is_rejected_and_the_agent_keeps_serving(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent(max_payload_bytes=1024)
    bad = {
        "utf8": b"\xff\xfe not text \xc3\x28",
        "types": b'{"id": "types", "text": ["not", "a", "string"]}',
        "empty": b'{"id": "empty", "text": "   "}',
        "large": json.dumps({"id": "large", "text": "x" * 2000}).encode(),
        "json": b'{"id": "broken", "text": ',
    }
    for payload in bad.values():
        publish(broker, agent.topics.speak, payload)
    publish(broker, agent.topics.speak, b'{"id": "after", "text": "Still here."}')

    agent.watcher.wait_event("after", "finished")
    rejected = [e for e in agent.watcher.events() if e["event"] == "rejected"]
    reasons = sorted(e["reason"] for e in rejected)
    assert reasons == sorted(
        ["invalid_utf8", "invalid_field", "empty_text", "payload_too_large", "invalid_json"]
    )
    assert next(e for e in rejected if e["reason"] == "invalid_field")["field"] == "text"
    assert {e["id"] for e in rejected} >= {"types", "empty"}
    assert agent.process.alive()


def test_same_id_twice_is_spoken_once(start_agent: StartAgent, broker: Broker) -> None:
    agent = start_agent()
    payload = b'{"id": "twice", "text": "Only once."}'
    publish(broker, agent.topics.speak, payload)
    publish(broker, agent.topics.speak_all, payload)
    publish(broker, agent.topics.speak, b'{"id": "marker", "text": "Done."}')

    agent.watcher.wait_event("marker", "finished")
    kinds = [e["event"] for e in agent.watcher.events("twice")]
    assert kinds.count("finished") == 1
    assert kinds.count("rejected") == 1
    assert (
        next(e for e in agent.watcher.events("twice") if e["event"] == "rejected")["reason"]
        == "duplicate_id"
    )


def test_agent_reconnects_after_a_broker_restart(start_agent: StartAgent, broker: Broker) -> None:
    agent = start_agent()
    broker.stop()
    broker.start()  # same port, persisted session
    agent.watcher.close()
    agent.watcher = Watcher(broker, f"voice/{agent.topics.node_id}/#")
    # both sessions (the sounder's and the engine's) connected twice
    wait_until(lambda: agent.process.output().count("Connected to") == 4, what="a reconnect")
    assert "Reconnecting in" in agent.process.output()
    publish(broker, agent.topics.speak, b'{"id": "back", "text": "Connection restored."}')
    agent.watcher.wait_event("back", "finished")
    assert "Disconnected from the broker" in agent.process.output()


def test_a_retained_speak_message_is_not_replayed_at_connect(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent()
    args = ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-q", "1", "-r"]
    subprocess.run(
        [*args, "-t", agent.topics.speak, "-m", '{"id": "kept", "text": "Retained."}'],
        check=True,
    )
    agent.watcher.wait_event("kept", "finished")  # said once, when it was sent
    agent.process.signal(signal.SIGTERM)
    agent.process.start()
    agent.wait_online()
    publish(broker, agent.topics.speak, b'{"id": "later", "text": "Later."}')
    agent.watcher.wait_event("later", "finished")
    assert [e["event"] for e in agent.watcher.events("kept")].count("accepted") == 1


def test_two_agents_with_one_node_id_are_reported_without_a_reconnect_storm(
    start_agent: StartAgent,
) -> None:
    first = start_agent()
    second = start_agent(node_id=first.topics.node_id)
    time.sleep(10)
    connects = sum(a.process.output().count("Connected to") for a in (first, second))
    assert connects < 30, connects  # thousands without the growing reconnect pause
    logs = first.process.output() + second.process.output()
    assert "same node_id" in logs


def spoken(
    agent: RunningAgent, broker: Broker, payload: dict[str, object]
) -> tuple[dict[str, object], np.ndarray]:
    """Publish one JSON speak message; its finished event and exactly the samples it played."""
    before = len(read_pcm(agent.capture)) if agent.capture.exists() else 0
    publish(broker, agent.topics.speak, json.dumps(payload).encode())
    finished = agent.watcher.wait_event(str(payload["id"]), "finished")
    return finished, read_pcm(agent.capture)[before:]


def test_per_request_voice_rate_and_volume(
    start_agent: StartAgent, broker: Broker, tiny_voice: Path
) -> None:
    agent = start_agent(voices={"tiny": str(tiny_voice)})
    text = f"Gate {uuid.uuid4().int % 1000} is open."  # not in the session-wide cache yet
    normal, samples = spoken(agent, broker, {"id": "n", "text": text})
    assert normal["cached_sentences"] == 0

    fast, _ = spoken(agent, broker, {"id": "f", "text": text, "rate": 2.0})
    ratio = float(fast["audio_seconds"]) / float(normal["audio_seconds"])  # type: ignore[arg-type]
    assert 0.35 < ratio < 0.8, ratio  # durations are noisy (noise_w), but clearly shorter

    quiet, quiet_samples = spoken(agent, broker, {"id": "q", "text": text, "volume": 0.5})
    assert quiet["cached_sentences"] == 1  # same text and rate: from the cache, rescaled
    assert np.array_equal(quiet_samples, np.round(samples * np.float32(0.5)).astype(np.int16))

    _, tiny = spoken(agent, broker, {"id": "t", "text": text, "voice": "tiny"})
    spectrum = np.abs(np.fft.rfft(tiny.astype(np.float64)))
    peak_hz = np.argmax(spectrum) * RATE / len(tiny)
    assert abs(peak_hz - RATE * 4 / 256) < 5  # the tiny voice's tone, not joe's speech

    publish(broker, agent.topics.speak, b'{"id": "x", "text": "Hello.", "voice": "../../etc"}')
    rejected = agent.watcher.wait_event("x", "rejected")
    assert (rejected["reason"], rejected["field"]) == ("unknown_voice", "voice")
