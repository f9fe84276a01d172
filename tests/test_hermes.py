"""The Hermes protocol end to end: Rhasspy-style say and playBytes through a real Mosquitto."""

from __future__ import annotations

import io
import json
import sys
import time
import wave
from collections.abc import Callable

import numpy as np
import pytest

from agent.core.messages import Rejection
from agent.protocol import hermes
from agent.protocol.payloads import SpeakLimits
from harness import Broker, Watcher, read_pcm, wait_until
from tests.conftest import RunningAgent, StartAgent

pytestmark = pytest.mark.broker

RATE = 22050
SITE = "kitchen"


def wav_bytes(seconds: float, rate: int, channels: int = 1, frequency: float = 440.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    tone = (np.sin(2 * np.pi * frequency * t) * 8000).astype("<i2")
    frames = np.repeat(tone, channels)
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(frames.tobytes())
    return out.getvalue()


@pytest.fixture
def agent(start_agent: StartAgent) -> RunningAgent:
    return start_agent(sections={"hermes": {"enabled": True, "site_id": SITE}})


@pytest.fixture
def rhasspy(broker: Broker) -> Watcher:
    return Watcher(broker, "hermes/#", "rhasspy/#")


def replies(watcher: Watcher, topic: str) -> list[dict[str, object]]:
    return [m.json() for m in watcher.snapshot() if m.topic == topic]


def hermes_ids(agent: RunningAgent) -> set[str]:
    """The agent's own ids of the Hermes says it took."""
    return {str(e["id"]) for e in agent.watcher.events() if str(e["id"]).startswith("hermes-")}


def test_say_is_spoken_and_answered_after_the_audio_ended(
    agent: RunningAgent, rhasspy: Watcher
) -> None:
    say = {"text": "Hello from Rhasspy.", "siteId": SITE, "id": "r1", "sessionId": "s1"}
    rhasspy.publish(hermes.SAY, json.dumps(say).encode())
    wait_until(lambda: bool(replies(rhasspy, hermes.SAY_FINISHED)), what="sayFinished")
    (done,) = replies(rhasspy, hermes.SAY_FINISHED)
    assert done == {"siteId": SITE, "id": "r1", "sessionId": "s1"}
    wait_until(lambda: bool(hermes_ids(agent)), what="the say's events")
    (request_id,) = hermes_ids(agent)  # its own id: Hermes ids correlate, they do not dedupe
    finished = agent.watcher.wait_event(request_id, "finished")
    said = next(m for m in rhasspy.snapshot() if m.topic == hermes.SAY_FINISHED)
    played = next(
        m
        for m in agent.watcher.snapshot()
        if m.topic.endswith("/events") and b'"finished"' in m.payload
    )
    assert said.at >= played.at - 0.05  # answered once the last sample was played
    assert finished["audio_seconds"] > 0.5
    seconds = float(str(finished["audio_seconds"]))
    assert len(read_pcm(agent.capture)) == pytest.approx(seconds * RATE, abs=RATE / 1000)


def test_play_bytes_plays_the_wav_resampled_and_answers(
    agent: RunningAgent, rhasspy: Watcher
) -> None:
    rhasspy.publish(f"hermes/audioServer/{SITE}/playBytes/req-7", wav_bytes(0.5, 16000, 2))
    topic = f"hermes/audioServer/{SITE}/playFinished"
    wait_until(lambda: bool(replies(rhasspy, topic)), what="playFinished")
    assert replies(rhasspy, topic) == [{"id": "req-7", "sessionId": "req-7", "siteId": SITE}]
    played = read_pcm(agent.capture)
    assert len(played) == round(0.5 * RATE)
    spectrum = np.abs(np.fft.rfft(played.astype(np.float64)))
    assert abs(np.argmax(spectrum) * RATE / len(played) - 440) < 4


def test_an_invalid_wav_is_an_error_and_still_finishes(
    agent: RunningAgent, rhasspy: Watcher
) -> None:
    rhasspy.publish(f"hermes/audioServer/{SITE}/playBytes/bad-1", b"RIFF not really a wave")
    wait_until(lambda: bool(replies(rhasspy, hermes.PLAY_ERROR)), what="the error")
    (error,) = replies(rhasspy, hermes.PLAY_ERROR)
    assert error["siteId"] == SITE
    assert error["context"] == "bad-1"
    assert error["error"] == "unsupported_audio"
    finished = f"hermes/audioServer/{SITE}/playFinished"
    wait_until(lambda: bool(replies(rhasspy, finished)), what="playFinished")


def test_messages_for_other_sites_are_ignored(agent: RunningAgent, rhasspy: Watcher) -> None:
    other = {"text": "Not for you.", "siteId": "garage", "id": "x1"}
    rhasspy.publish(hermes.SAY, json.dumps(other).encode())
    rhasspy.publish("hermes/audioServer/garage/playBytes/x2", wav_bytes(0.2, RATE))
    rhasspy.publish(hermes.SAY, json.dumps({"text": "Marker.", "siteId": SITE, "id": "m"}).encode())
    wait_until(lambda: bool(replies(rhasspy, hermes.SAY_FINISHED)), what="the marker's reply")
    time.sleep(0.3)
    assert len(hermes_ids(agent)) == 1  # only the marker was served
    assert [r["id"] for r in replies(rhasspy, hermes.SAY_FINISHED)] == ["m"]


def test_toggle_off_mutes_hermes_playback_and_toggle_on_restores_it(
    agent: RunningAgent, rhasspy: Watcher
) -> None:
    rhasspy.publish(hermes.TOGGLE_OFF, json.dumps({"siteId": SITE}).encode())
    wait_until(lambda: _state(agent).get("hermes_audio") == "off", what="muted state")
    rhasspy.publish(f"hermes/audioServer/{SITE}/playBytes/q1", wav_bytes(0.3, RATE))
    finished = f"hermes/audioServer/{SITE}/playFinished"
    wait_until(lambda: bool(replies(rhasspy, finished)), what="playFinished while muted")
    assert not agent.capture.exists() or len(read_pcm(agent.capture)) == 0
    rhasspy.publish(hermes.TOGGLE_ON, json.dumps({"siteId": SITE}).encode())
    wait_until(lambda: _state(agent).get("hermes_audio") == "on", what="unmuted state")
    rhasspy.publish(f"hermes/audioServer/{SITE}/playBytes/q2", wav_bytes(0.3, RATE))
    wait_until(lambda: len(replies(rhasspy, finished)) == 2, what="second playFinished")
    assert len(read_pcm(agent.capture)) == round(0.3 * RATE)


def _state(agent: RunningAgent) -> dict[str, object]:
    states = [m.json() for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
    return states[-1] if states else {}


def test_get_voices_is_answered(agent: RunningAgent, rhasspy: Watcher) -> None:
    rhasspy.publish(hermes.GET_VOICES, json.dumps({"id": "v1", "siteId": SITE}).encode())
    wait_until(lambda: bool(replies(rhasspy, hermes.VOICES)), what="voices")
    (answer,) = replies(rhasspy, hermes.VOICES)
    assert answer["id"] == "v1"
    assert answer["siteId"] == SITE
    assert answer["voices"] == [
        {"voiceId": "default", "description": "Joe (English, United States, medium)"}
    ]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"text": "Hi", "siteId": "other"}', None),
        (b'{"text": 5, "siteId": "kitchen", "id": "a"}', "invalid_field"),
        (b'{"text": "Hi", "siteId": "kitchen", "volume": 3}', "invalid_field"),
        (b"not json", None),  # no siteId: the default site's (this one is kitchen)
        (b'{"text": "  ", "siteId": "kitchen"}', "empty_text"),
    ],
)
def test_say_parsing(payload: bytes, expected: str | None) -> None:
    """A say for this site always comes with its reply context, even when it cannot be served:
    Rhasspy waits for the answer."""
    parsed = hermes.parse_say(payload, SITE, SpeakLimits(4096, 100), lambda: "g")
    if expected is None:
        assert parsed is None
    else:
        assert parsed is not None
        rejection, context = parsed
        assert isinstance(rejection, Rejection)
        assert rejection.reason == expected
        assert context.site_id == SITE


def test_a_say_that_is_no_json_is_answered_on_the_default_site() -> None:
    parsed = hermes.parse_say(b"not json", "default", SpeakLimits(4096, 100), lambda: "g")
    assert parsed is not None
    rejection, context = parsed
    assert isinstance(rejection, Rejection)
    assert (rejection.reason, context.id) == ("invalid_json", None)


def _at_depth(frames: int, call: Callable[[], object]) -> object:
    """`call()` made `frames` Python frames further down the stack."""
    return call() if frames == 0 else _at_depth(frames - 1, call)


def test_a_say_too_deep_to_read_is_judged_the_same_at_any_stack_depth() -> None:
    """A say nested past the JSON bound whose last `siteId` names another site: whether Python's
    decoder ran out of stack depended on the caller's, so the agent judged it another site's
    (ignored) while the hostile flood's oracle, deeper in pytest, read it as ours (owed an
    answer): found by `make test-slow` in CI. Nothing of a too-deep payload is read now."""
    nested = '{"a":' * 600 + "1" + "}" * 600
    payload = f'{{"siteId": "default", "volume": {nested}, "siteId": "kitchen"}}'.encode()
    limits = SpeakLimits(65536, 100)
    shallow = hermes.parse_say(payload, "default", limits, lambda: "0" * 32)
    deep = _at_depth(
        sys.getrecursionlimit() - 400,
        lambda: hermes.parse_say(payload, "default", limits, lambda: "0" * 32),
    )
    assert shallow is not None
    assert deep is not None
    assert isinstance(deep, tuple)
    (rejection, context), (deep_rejection, deep_context) = shallow, deep
    assert isinstance(rejection, Rejection)
    assert isinstance(deep_rejection, Rejection)
    assert (rejection.reason, context) == (deep_rejection.reason, deep_context)  # ours, refused
