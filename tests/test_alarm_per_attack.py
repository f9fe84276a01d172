"""Issue 33's cases one by one, each through its real edge (`harness/attacks.py`: the `wyoming`
library's clients, a Sparkplug host, paho floods through a real Mosquitto, sounds from a web
server), with the node playing through ALSA's `pulse` device to a PulseAudio null sink (paced in
real time) whose monitor is recorded: what a listener hears.

Under each attack alone a `critical` is published on the node's own speak topic. Judged, with
generous deadlines and no latency asserted:

- the alarm is not lost: `accepted`, `started`, `finished`, while the attack still runs;
- it is heard: its chime is found in the recording after its publication;
- `started` says what a listener hears (the issue: under a Wyoming attack `started` came 1.3 s
  before the first sample reached the sound server): the event does not arrive before the
  chime's first sample is heard, less `STARTED_SLACK` (the sound server's own buffer);
- then the attack stops, the queue is cleared, and a control message is spoken and heard, the
  node alive.

`test_alarm_under_fire.py` fires every attack at once (`make test-slow`); `make bench` measures
the delays (bench/ALARMS.md)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import AgentProcess, Watcher, wait_until
from harness.attacks import (
    ONSET_SAMPLES,
    RATE,
    FiringRange,
    alarm_chime,
    attacker_client,
    first_heard,
)
from tests.hostile import flood_speak

pytestmark = [pytest.mark.broker]

DEADLINE = 240.0
"""How long an alarm under attack may take to end (generous: behaviour, not speed)."""
RETRY_S = 20.0
"""A control message not answered within this is sent again (see `speaks_on`)."""
ATTACK_WARM_S = 4.0
"""The attack under way before the alarm is published."""
STARTED_SLACK = 0.5
"""How much earlier than the first sample heard `started` may arrive: the pulse plugin's and
the sound server's buffers (tens of milliseconds; the issue's fault was 1.3 s)."""

BURST = 19_200
"""The issue's plain flood: 19,200 QoS 0 speaks (an alarm 26 s late before)."""
FAST = (
    "wyoming pathological texts",
    "wyoming long texts",
    "QoS 1 flood",
    "sparkplug amplification",
    "media decoding",
)
"""Under a minute each here (13-18 s of attack and alarm on a loaded machine): `make test`."""
ENDS = frozenset({"finished", "failed", "rejected", "stopped", "expired", "acknowledged"})
# Not here: "QoS 0 flood" (`harness.attacks.DRIVERS`), a QoS 0 flood at full rate for as long
# as the alarm takes: it held the alarm back 109-138 s in two runs, and the node spoke a control
# message only minutes after the flood (its backlog at the broker answered first). `make bench`
# measures it (bench/ALARMS.md); docs/security.md, "Not defended". The issue's own burst of
# 19,200 is the slow test at the end.


def events_of(watcher: Watcher, request_id: str) -> list[tuple[float, dict[str, Any]]]:
    """The events of one request with their arrival times (time.time()), in order; only
    payloads naming it are parsed (a flood's answers are many)."""
    needle = json.dumps(request_id).encode()
    found = []
    for message in watcher.snapshot():
        if message.topic.endswith("/events") and needle in message.payload:
            event = message.json()
            if event.get("id") == request_id:
                found.append((message.at, event))
    return found


def wait_end(watcher: Watcher, request_id: str, timeout: float) -> str:
    """Wait for the request's last event (`ENDS`); its name."""

    def ended() -> list[str]:
        return [e["event"] for _, e in events_of(watcher, request_id) if e["event"] in ENDS]

    wait_until(lambda: bool(ended()), timeout, f"the end of {request_id}")
    return ended()[0]


@pytest.fixture
def firing_range(tmp_path: Path, tiny_voice: Path) -> Iterator[FiringRange]:
    fire = FiringRange(tmp_path, voice=tiny_voice, node_id=f"one{uuid.uuid4().hex[:6]}").start()
    try:
        yield fire
    finally:
        fire.close()


def ready(fire: FiringRange) -> AgentProcess:
    """The node started with every edge open, its voice warm."""
    assert fire.watcher is not None
    agent = fire.start_agent(fire.config(hostile=False))
    warm = f"warm-{uuid.uuid4().hex[:6]}"
    fire.watcher.publish(
        fire.target.speak_topic, json.dumps({"id": warm, "text": "Ready."}).encode()
    )
    assert wait_end(fire.watcher, warm, 300) == "finished"
    return agent


def alarm_body() -> tuple[str, bytes]:
    fire_id = f"fire-{uuid.uuid4().hex[:6]}"
    body = {"id": fire_id, "text": "Fire in hall two.", "priority": "critical"}
    return fire_id, json.dumps(body).encode()


def judge(
    fire: FiringRange, agent: AgentProcess, what: str, fire_id: str, published: float
) -> None:
    """The alarm ended `finished` (its three events), heard, `started` true to the sound; then
    a control message spoken and heard, the node alive."""
    watcher = fire.watcher
    assert watcher is not None
    events = events_of(watcher, fire_id)
    assert [e["event"] for _, e in events] == ["accepted", "started", "finished"]
    offset = time.time() - time.perf_counter()
    started_at = next(at - offset for at, e in events if e["event"] == "started")
    chime = alarm_chime("critical")
    wait_until(
        lambda: first_heard(fire.recording, chime[:ONSET_SAMPLES], published) is not None,
        30,
        "the alarm's chime in the recording",
    )
    heard = first_heard(fire.recording, chime[:ONSET_SAMPLES], published)
    assert heard is not None
    heard_at = heard[0]
    print(
        f"{what}: publish -> started {started_at - published:.3f} s, "
        f"-> first sample heard {heard_at - published:.3f} s"
    )
    assert heard_at >= published  # the recording never places a sound early
    assert started_at >= heard_at - STARTED_SLACK, (
        f"`started` arrived {heard_at - started_at:.2f} s before the first sample was heard"
    )

    watcher.publish(f"voice/{fire.node_id}/stop", b'{"clear": true}')
    speaks_on(fire)
    assert agent.alive()


def speaks_on(fire: FiringRange) -> None:
    """A control message spoken and heard. Sent again every `RETRY_S` until one is: a flood's
    backlog still fills the speak topics' room for a while after the attack, and what finds it
    full is answered `queue_full`, in the flood's summary (`suppressed`), not one by one."""
    watcher = fire.watcher
    assert watcher is not None
    began = time.monotonic()
    while True:
        control = f"control-{uuid.uuid4().hex[:6]}"
        sent = time.perf_counter()
        body = json.dumps({"id": control, "text": "All clear."}).encode()
        watcher.publish(fire.target.speak_topic, body)
        try:
            ended = wait_end(watcher, control, RETRY_S)
        except AssertionError:
            assert time.monotonic() - began < DEADLINE, "no control message spoken"
            continue
        if ended == "finished":
            break
        assert time.monotonic() - began < DEADLINE, f"the control message ended {ended}"
    print(f"control spoken {time.monotonic() - began:.1f} s after the attack")
    time.sleep(0.5)  # its last samples reach the sound server
    after = fire.recording.samples(fire.recording.index_at(sent))
    assert len(after) > RATE // 4
    assert np.abs(after.astype(np.int32)).max() > 1000, "the control message was not heard"


@pytest.mark.parametrize("attack", FAST)
def test_under_each_attack_an_alarm_is_heard_when_started_says_and_the_node_speaks_on(
    firing_range: FiringRange, attack: str
) -> None:
    fire = firing_range
    assert fire.watcher is not None
    agent = ready(fire)
    salvo = fire.salvo([attack]).start()
    try:
        time.sleep(ATTACK_WARM_S)
        fire_id, body = alarm_body()
        published = time.perf_counter()
        fire.watcher.publish(fire.target.speak_topic, body)
        ended = wait_end(fire.watcher, fire_id, DEADLINE)  # the attack still runs
        assert ended == "finished", events_of(fire.watcher, fire_id)
        assert agent.alive()
    finally:
        report = salvo.stop()
    print(attack, json.dumps(report, default=str)[:600])
    judge(fire, agent, attack, fire_id, published)


@pytest.mark.slow  # 19,200 speaks answered before the control message: minutes here
def test_an_alarm_after_the_issues_burst_of_qos0_speaks_is_heard_and_the_node_speaks_on(
    firing_range: FiringRange,
) -> None:
    """The issue's plain flood as it was tried: one burst of 19,200 QoS 0 speaks on the node's
    own topic, then a `critical` from the same client (so the broker has every speak of the
    burst before it)."""
    fire = firing_range
    assert fire.watcher is not None
    agent = ready(fire)
    client = attacker_client(fire.target, "burst")
    try:
        for number in range(BURST):
            while client.publish(fire.target.speak_topic, flood_speak(number), qos=0).rc:
                time.sleep(0.001)  # paho's own queue full: the burst goes out as fast as it can
        fire_id, body = alarm_body()
        published = time.perf_counter()
        client.publish(fire.target.speak_topic, body, qos=1).wait_for_publish(60)
        ended = wait_end(fire.watcher, fire_id, DEADLINE)
        assert ended == "finished", events_of(fire.watcher, fire_id)
    finally:
        client.loop_stop()
        client.disconnect()
    judge(fire, agent, f"after a burst of {BURST} QoS 0 speaks", fire_id, published)
