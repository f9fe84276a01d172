"""Announcements that behave, end to end: the real agent, Mosquitto and, where timing matters,
ALSA's `pulse` device on a PulseAudio null sink, so playback is paced as on real hardware."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime

import numpy as np
import pytest

from agent.formats.chimes import BUILTIN, render_notes
from harness import PulseNullSink, read_pcm, wait_until
from tests.conftest import RunningAgent, StartAgent

pytestmark = [pytest.mark.broker, pytest.mark.voice]

RATE = 22050
LONG_CHAT = (
    "Here is a long story for the afternoon, told slowly and with many details, so that it "
    "keeps playing for a good while. The weather was mild, the trees were green, and the "
    "river ran quietly past the old mill, where two cats slept in the sun all day long. "
    "Later the wind turned, the clouds came in from the west, and the first drops of rain "
    "fell on the roofs of the village, one after another, until the streets were shining."
)


def speak(agent: RunningAgent, **payload: object) -> float:
    """Publish a JSON speak message from the test's paho client; returns the send time."""
    return agent.watcher.publish(agent.topics.speak, json.dumps(payload).encode())


def captured_seconds(agent: RunningAgent) -> float:
    """Audio that went through the paced device so far (the capture file's length)."""
    size = agent.capture.stat().st_size if agent.capture.exists() else 0
    return size / 2 / RATE


def event_time(event: dict[str, object]) -> float:
    """The agent's wall-clock time of an event (its `ts`)."""
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


def find(haystack: np.ndarray, needle: np.ndarray) -> int:
    """Index of the first exact occurrence of needle's first 200 samples."""
    probe = needle[np.flatnonzero(needle)[0] :][:200]
    windows = np.lib.stride_tricks.sliding_window_view(haystack, len(probe))
    hits = np.flatnonzero((windows == probe).all(axis=1))
    assert len(hits), "not found in the capture"
    return int(hits[0]) - int(np.flatnonzero(needle)[0])


@pytest.fixture
def paced(start_agent: StartAgent, pulse: PulseNullSink) -> RunningAgent:
    return start_agent(paced=pulse)


def test_an_alarm_preempts_a_long_chat_with_a_fade(paced: RunningAgent) -> None:
    """Behaviour: the chat is cut, faded, dropped; the alarm's chime and words follow. How fast
    is `make bench`'s to measure (preemption latency), not this test's."""
    agent = paced
    speak(agent, id="chat", text=LONG_CHAT, priority="chat")
    agent.watcher.wait_event("chat", "started")
    # The premise: the chat is playing. Wait until a second of it went through the device.
    wait_until(lambda: captured_seconds(agent) >= 1.0, what="a second of the chat played")
    sent = speak(agent, id="fire", text="Fire alarm in hall two.", priority="alarm")
    started = agent.watcher.wait_event("fire", "started")
    agent.watcher.wait_event("fire", "finished")
    print(f"preemption: alarm handed to ALSA {(event_time(started) - sent) * 1000:.1f} ms after")

    assert [e["event"] for e in agent.watcher.events("chat")] == [
        "accepted",
        "started",
        "preempted",
    ]  # chat is dropped when preempted (documented policy)
    assert [e["event"] for e in agent.watcher.events("fire")] == [
        "accepted",
        "started",
        "finished",
    ]
    assert all(e["priority"] == "chat" for e in agent.watcher.events("chat"))

    played = read_pcm(agent.capture)
    chime = np.frombuffer(
        render_notes(BUILTIN["alarm"], RATE), "<i2"
    )  # alarm plays at full volume (1.0)
    cut = find(played, chime)
    assert cut >= RATE  # the chat played a while (a second before the alarm was sent)
    # the half second before the cut (the cut may fall in a pause between words: CI saw a
    # quiet 90 ms there, at most 759)
    before = played[cut - RATE // 2 : cut - RATE // 100].astype(np.int32)
    join = played[cut - RATE // 200 : cut + 1].astype(np.int32)  # the last 5 ms, into the chime
    assert np.abs(before).max() > 1000  # there was speech before the cut
    assert abs(int(played[cut - 1])) <= 50  # faded to silence before the chime
    # "no click": a hard cut would step by the speech's amplitude (thousands here); across the
    # faded join no step exceeds 1.5x the speech's own largest step just before it
    threshold = 1.5 * np.abs(np.diff(before)).max()
    assert np.abs(np.diff(join)).max() <= threshold, (np.abs(np.diff(join)).max(), threshold)
    speech = played[cut + len(chime) :].astype(np.float64)
    assert len(speech) > 0.8 * RATE  # the alarm's words follow its chime
    assert 10 * np.log10(np.mean((speech / 32768) ** 2)) > -40


def test_stop_fades_out_and_clear_empties_the_queue(paced: RunningAgent) -> None:
    """Behaviour: what plays fades out, what waits is dropped, nothing plays after. How fast
    is `make bench`'s to measure."""
    agent = paced
    speak(agent, id="story", text=LONG_CHAT)
    speak(agent, id="next", text="This one waits.")
    agent.watcher.wait_event("story", "started")
    wait_until(lambda: captured_seconds(agent) >= 1.0, what="a second of the story played")
    sent = agent.watcher.publish(agent.topics.stop, b'{"clear": true}')
    stopped = agent.watcher.wait_event("story", "stopped")
    print(f"stop: cut decided {(event_time(stopped) - sent) * 1000:.1f} ms after publication")
    cleared = agent.watcher.wait_event("next", "stopped")
    assert cleared["cleared"] is True
    time.sleep(0.5)
    size = agent.capture.stat().st_size
    time.sleep(0.5)
    assert agent.capture.stat().st_size == size  # nothing else plays
    agent.process.signal(signal.SIGTERM)  # closes the PCM: ALSA's file plugin writes its rest
    played = read_pcm(agent.capture)
    assert abs(int(played[-1])) <= 50  # faded to silence, not cut off
    assert np.abs(played[-RATE // 2 :]).max() > 500  # it was speaking (or between two words)


def test_ttl_dedupe_and_queue_full_behind_a_playing_announcement(
    start_agent: StartAgent, pulse: PulseNullSink
) -> None:
    agent = start_agent(paced=pulse, queue_size=2)
    speak(agent, id="playing", text=LONG_CHAT, priority="info")
    agent.watcher.wait_event("playing", "started")
    speak(agent, id="t1", text="Temperature twenty.", dedupe_key="temperature")
    speak(agent, id="t2", text="Temperature twenty one.", dedupe_key="temperature")
    speak(agent, id="brief", text="Only briefly relevant.", ttl=2.0)  # the queue is now full
    speak(agent, id="late", text="One too many.", priority="chat")  # the lowest: refused

    expired = agent.watcher.wait_event("brief", "expired")
    assert expired["priority"] == "info"
    assert agent.watcher.wait_event("t1", "coalesced")["into"] == "t2"
    full = agent.watcher.wait_event("late", "rejected")
    assert full["reason"] == "queue_full"
    agent.watcher.publish(agent.topics.stop, b"")
    agent.watcher.wait_event("t2", "finished")
    assert [e["event"] for e in agent.watcher.events("t1")] == ["accepted", "coalesced"]


def test_ack_ends_a_repeating_alarm(start_agent: StartAgent) -> None:
    agent = start_agent()
    speak(agent, id="r", text="Pump failure.", priority="alarm", repeat=0, repeat_interval=0.3)

    def finished() -> int:
        return [e["event"] for e in agent.watcher.events("r")].count("finished")

    wait_until(lambda: finished() >= 2, what="two plays")
    agent.watcher.publish(agent.topics.ack, b'{"id": "r"}')
    agent.watcher.wait_event("r", "acknowledged")
    plays = finished()
    time.sleep(1.2)
    assert finished() == plays  # no more plays after the ack
    repeats = [e for e in agent.watcher.events("r") if e["event"] == "finished"]
    assert all(e["repeats_left"] == "until_acknowledged" for e in repeats)
    assert [e["play"] for e in repeats] == list(range(1, plays + 1))


def test_volume_topic_sets_the_global_volume_and_the_state_says_so(
    start_agent: StartAgent,
) -> None:
    agent = start_agent()
    text = f"Volume check {time.time_ns() % 100000}."
    speak(agent, id="loud", text=text)
    agent.watcher.wait_event("loud", "finished")
    loud = read_pcm(agent.capture)
    agent.watcher.publish(agent.topics.volume, b"0.5")

    def state() -> dict[str, object]:
        mine = [m for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
        return mine[-1].json() if mine else {}

    wait_until(lambda: state().get("volume") == 0.5, what="state with volume 0.5")
    assert state()["audio"] == "available"
    speak(agent, id="quiet", text=text)
    agent.watcher.wait_event("quiet", "finished")
    quiet = read_pcm(agent.capture)[len(loud) :]
    assert np.array_equal(quiet, np.round(loud.astype(np.float32) * 0.5).astype(np.int16))

    agent.watcher.publish(agent.topics.volume, b"loud")
    bad = next(e for e in _wait_all(agent, "rejected") if e.get("field") == "volume")
    assert bad["reason"] == "invalid_field"


def _wait_all(agent: RunningAgent, event: str) -> list[dict[str, object]]:
    wait_until(lambda: any(e["event"] == event for e in agent.watcher.events()), what=event)
    return [e for e in agent.watcher.events() if e["event"] == event]


def test_the_alarm_floor_holds_against_a_low_global_volume(start_agent: StartAgent) -> None:
    agent = start_agent(audio={"volume": 0.1, "alarm_volume_floor": 0.6})
    agent.wait_voice_ready()  # the alarm's words at once: no generic phrase before them
    speak(agent, id="a", text="Evacuate.", priority="alarm", chime=False, volume=0.2)
    agent.watcher.wait_event("a", "finished")
    floored = read_pcm(agent.capture)
    speak(agent, id="i", text="Evacuate.", priority="info", volume=1.0)
    agent.watcher.wait_event("i", "finished")  # cached: the same samples at 0.1
    low = read_pcm(agent.capture)[len(floored) :]
    ratio = np.abs(floored.astype(np.float64)).sum() / np.abs(low.astype(np.float64)).sum()
    assert ratio == pytest.approx(6.0, rel=0.02)
