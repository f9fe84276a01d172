"""The Hermes protocol as Rhasspy speaks it: rhasspy-hermes 0.6.2's own message classes, sent by
the paho it pins (`harness/rhasspy.py`), to the real agent through a real Mosquitto, and every
reply parsed by the library's class for its topic. The behaviour expected is Rhasspy 2.5's: its
TTS service (rhasspy-tts-cli-hermes) and audio server (rhasspy-speakers-cli-hermes)."""

from __future__ import annotations

import io
import signal
import uuid
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pytest
import soundfile

from harness import (
    AgentProcess,
    Broker,
    PulseNullSink,
    Watcher,
    agent_config,
    read_pcm,
    wait_until,
    write_config,
)
from harness.rhasspy import Published, Reply, RhasspyClient, ensure_venv

pytestmark = [pytest.mark.broker, pytest.mark.clients]

SITE: Final = "kitchen"
"""The agent's Hermes site id."""
OTHER_SITE: Final = "garage"
"""A site id that is not the agent's."""
RATE: Final = 22050
"""The agent's output rate: the tiny voice's (Hz)."""
TONE_HZ: Final = 440.0
"""The test tone's frequency (Hz)."""
LEVEL: Final = 0.5
"""The test tone's amplitude (fraction of full scale)."""
MAX_TEXT: Final = 60
"""`speak.max_text_chars` of the shared agent (characters)."""
MARKER_SECONDS: Final = 0.1
"""Length of the barrier's WAV (seconds)."""
EDGE: Final = 0.01
"""Audio left out of tone fits at either end, for resampler transients (seconds)."""

# The topics a Rhasspy TTS service and audio server answer on.
SAY_FINISHED: Final = "hermes/tts/sayFinished"
TTS_ERROR: Final = "hermes/error/tts"
PLAY_FINISHED: Final = f"hermes/audioServer/{SITE}/playFinished"
PLAY_ERROR: Final = "hermes/error/audioServer/play"
VOICES: Final = "rhasspy/tts/voices"

SHORT_TEXT: Final = "The kettle is on."
LONG_TEXT: Final = (
    "The washing machine has finished its cycle, the laundry can go out now. "
    "The front door is still open, and it is getting cold in the hall. "
    "Dinner will be ready in ten minutes."
)


# ---- audio -----------------------------------------------------------------------------------


def tone(seconds: float, rate: int, channels: int = 1) -> npt.NDArray[np.float64]:
    """The test tone, `channels` identical columns, as floats in [-1, 1]."""
    t = np.arange(round(seconds * rate)) / rate
    column = LEVEL * np.sin(2 * np.pi * TONE_HZ * t)
    return np.repeat(column[:, None], channels, axis=1)


def pcm_wav(audio: npt.NDArray[np.float64], rate: int, width: int) -> bytes:
    """Integer PCM WAV (format 1) with the stdlib: 8-bit unsigned, 16/24/32-bit signed."""
    if width == 1:
        data = (np.round(audio * 127) + 128).astype(np.uint8).tobytes()
    elif width == 3:
        wide = np.round(audio * (2**23 - 1)).astype("<i4")
        data = wide.reshape(-1, 1).view(np.uint8)[:, :3].tobytes()  # the low 3 bytes (LE)
    else:
        dtype = {2: "<i2", 4: "<i4"}[width]
        data = np.round(audio * (2 ** (8 * width - 1) - 1)).astype(dtype).tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(audio.shape[1])
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(data)
    return out.getvalue()


def sound_file(audio: npt.NDArray[np.float64], rate: int, form: str, subtype: str | None) -> bytes:
    """A file libsndfile writes: float or WAVE_FORMAT_EXTENSIBLE WAV, MP3, Ogg, FLAC."""
    out = io.BytesIO()
    soundfile.write(out, audio, rate, format=form, subtype=subtype)
    return out.getvalue()


def tone_fit(samples: npt.NDArray[np.int16]) -> tuple[float, float]:
    """The amplitude (of full scale) of the sine at TONE_HZ that best fits the samples (less
    EDGE at either end), and the RMS of what is left over relative to that sine's RMS."""
    edge = round(EDGE * RATE)
    x = samples[edge : len(samples) - edge].astype(np.float64) / 32768
    t = np.arange(len(x)) / RATE
    basis = np.column_stack(
        [np.sin(2 * np.pi * TONE_HZ * t), np.cos(2 * np.pi * TONE_HZ * t), np.ones_like(t)]
    )
    coef = np.linalg.lstsq(basis, x, rcond=None)[0]
    amplitude = float(np.hypot(coef[0], coef[1]))
    left = x - basis @ coef
    return amplitude, float(np.sqrt(np.mean(left**2)) / max(amplitude / np.sqrt(2), 1e-9))


def rms(samples: npt.NDArray[np.int16]) -> float:
    """RMS level (of full scale)."""
    return float(np.sqrt(np.mean((samples.astype(np.float64) / 32768) ** 2)))


MARKER_WAV: Final = pcm_wav(tone(MARKER_SECONDS, RATE), RATE, 2)
MARKER_SAMPLES: Final = round(MARKER_SECONDS * RATE)


# ---- the agent, Rhasspy, and what is between them ------------------------------------------


@dataclass
class Node:
    """A running agent with Hermes on for SITE, and where its audio goes."""

    process: AgentProcess
    capture: Path
    status: Watcher
    log_checked: int = 0
    """How much of its log was checked for errors (characters)."""

    def samples(self) -> npt.NDArray[np.int16]:
        """Everything played so far."""
        return read_pcm(self.capture) if self.capture.exists() else np.zeros(0, np.int16)

    def check_log(self) -> None:
        """An agent that logged an error failed, even if it carried on (checked per test)."""
        log = self.process.output()
        new, self.log_checked = log[self.log_checked :], len(log)
        errors = [line for line in new.splitlines() if " ERROR " in line]
        assert not errors, errors


def start_node(
    broker: Broker,
    workdir: Path,
    voice: Path,
    paced: PulseNullSink | None = None,
    **sections: dict[str, Any],
) -> Node:
    """Start the agent (audio to a raw capture file, paced in real time with `paced`) and wait
    until it is online."""
    node_id = f"r{uuid.uuid4().hex[:8]}"
    capture = workdir / f"{node_id}.raw"
    device = "paced_capture" if paced else f"file:FILE={capture},FORMAT=raw"
    hermes = {"enabled": True, "site_id": SITE}
    config = agent_config(
        broker, workdir, node_id, voice=voice, device=device, hermes=hermes, **sections
    )
    path = write_config(workdir / f"{node_id}.yaml", config)
    status = Watcher(broker, f"voice/{node_id}/status")
    process = AgentProcess(path, workdir / f"{node_id}.log", paced.env(capture) if paced else None)
    process.start()

    def online() -> bool:
        seen = [m.payload for m in status.snapshot()]
        return bool(seen) and seen[-1] == b"online"

    wait_until(lambda: online() or not process.alive(), what="the agent online")
    assert process.alive(), process.output()
    return Node(process, capture, status)


def stop_node(node: Node) -> None:
    """Stop it, and check what it logged since the last check."""
    if node.process.alive():
        node.process.signal(signal.SIGTERM)
    node.status.close()
    node.check_log()


@dataclass
class Rig:
    """A Rhasspy client and an agent on one broker."""

    node: Node
    client: RhasspyClient

    def mark(self) -> int:
        """The number of samples played so far (to read what plays next)."""
        return len(self.node.samples())

    def played_since(self, mark: int) -> npt.NDArray[np.int16]:
        """The samples played after `mark`."""
        return self.node.samples()[mark:]

    def say(self, **fields: Any) -> Published:
        """`TtsSay(**fields)` (siteId SITE unless given) as the library makes it."""
        return self.client.send("TtsSay", **({"site_id": SITE} | fields))

    def play(self, request_id: str, wav: bytes, site_id: str = SITE) -> Published:
        """`AudioPlayBytes` of `wav` to site_id with request_id."""
        return self.client.play_bytes(site_id, request_id, wav)

    def barrier(self) -> None:
        """Play the marker WAV and wait for its playFinished: all sent before was handled."""
        marker = f"marker-{uuid.uuid4().hex[:8]}"
        self.play(marker, MARKER_WAV)
        self.client.wait_for(lambda r: r.topic == PLAY_FINISHED and _field(r, "id") == marker)


def _field(reply: Reply, key: str) -> Any:
    """A field of a reply as the library parsed it (None when it could not)."""
    return None if reply.message is None else reply.message.get(key)


def about_say(say_id: object) -> Callable[[Reply], bool]:
    """sayFinished and TTS errors about the say with this id (an error names it as context)."""

    def match(reply: Reply) -> bool:
        if reply.topic == SAY_FINISHED:
            return bool(_field(reply, "id") == say_id)
        return reply.topic == TTS_ERROR and _field(reply, "context") in (say_id, str(say_id))

    return match


def any_say_reply(reply: Reply) -> bool:
    """Whether a reply is a sayFinished or a TTS error, whatever its id."""
    return reply.topic in (SAY_FINISHED, TTS_ERROR)


def about_play(request_id: str) -> Callable[[Reply], bool]:
    """playFinished and play errors about one playBytes request id."""

    def match(reply: Reply) -> bool:
        if reply.topic == PLAY_FINISHED:
            return bool(_field(reply, "id") == request_id)
        return reply.topic == PLAY_ERROR and bool(_field(reply, "context") == request_id)

    return match


def parsed(replies: list[Reply]) -> list[Reply]:
    """The replies, each checked to be one the library could parse."""
    for reply in replies:
        assert reply.error is None, f"rhasspy-hermes cannot parse {reply}"
    return replies


@pytest.fixture(scope="session")
def rhasspy_python() -> Path:
    """The python of the rhasspy-hermes venv (built on first use)."""
    return ensure_venv().python


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One Mosquitto for the tests that share an agent."""
    broker = Broker(tmp_path_factory.mktemp("hermes-broker"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def shared_node(
    shared_broker: Broker, tmp_path_factory: pytest.TempPathFactory, tiny_voice: Path
) -> Iterator[Node]:
    """One agent for the tests that change no state of it (each reads only what it played)."""
    workdir = tmp_path_factory.mktemp("hermes-agent")
    node = start_node(shared_broker, workdir, tiny_voice, speak={"max_text_chars": MAX_TEXT})
    yield node
    stop_node(node)


@pytest.fixture
def shared(shared_broker: Broker, shared_node: Node, rhasspy_python: Path) -> Iterator[Rig]:
    """The shared agent and a fresh Rhasspy client."""
    shared_node.check_log()  # what came before is not this test's
    client = RhasspyClient(shared_broker, rhasspy_python)
    yield Rig(shared_node, client)
    client.close()
    shared_node.check_log()


@pytest.fixture
def fresh(tmp_path: Path, tiny_voice: Path, rhasspy_python: Path) -> Iterator[Rig]:
    """An agent of its own (for tests that change its volume or mute it) and a client."""
    broker = Broker(tmp_path / "broker")
    broker.start()
    node = start_node(broker, tmp_path, tiny_voice)
    client = RhasspyClient(broker, rhasspy_python)
    yield Rig(node, client)
    client.close()
    stop_node(node)
    broker.stop()


@pytest.fixture(scope="module")
def paced_sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulseNullSink]:
    """A PulseAudio null sink: playback takes real time."""
    sink = PulseNullSink(tmp_path_factory.mktemp("hermes-pulse"))
    sink.start()
    yield sink
    sink.stop()


@pytest.fixture(scope="module")
def paced_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A Mosquitto of its own for the real-time agent (same site id as the shared one)."""
    broker = Broker(tmp_path_factory.mktemp("hermes-paced-broker"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def paced_node(
    paced_broker: Broker,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_voice: Path,
    paced_sink: PulseNullSink,
) -> Iterator[Node]:
    """An agent that plays in real time (for what must wait until the audio ended)."""
    workdir = tmp_path_factory.mktemp("hermes-paced")
    node = start_node(paced_broker, workdir, tiny_voice, paced=paced_sink)
    yield node
    stop_node(node)


@pytest.fixture
def paced(paced_broker: Broker, paced_node: Node, rhasspy_python: Path) -> Iterator[Rig]:
    """The real-time agent and a fresh Rhasspy client."""
    paced_node.check_log()
    client = RhasspyClient(paced_broker, rhasspy_python)
    yield Rig(paced_node, client)
    client.close()
    paced_node.check_log()


# ---- say -------------------------------------------------------------------------------------

SAYS: Final[dict[str, tuple[dict[str, Any], dict[str, Any]]]] = {
    # TtsSay as the library makes it: volume and sessionId null.
    "library": ({"id": "lib-1"}, {"volume": None, "sessionId": None}),
    # As Rhasspy 2.5.11's dialogue manager sends it.
    "rhasspy-2.5.11": ({"id": "b5f6c1e2", "session_id": "", "volume": 1.0}, {"sessionId": ""}),
    # Node-RED flows set what they like: an integer id comes back as is.
    "integer-id": ({"id": 7, "session_id": "s-7", "volume": 1.0}, {"id": 7}),
    "no-id": ({"volume": 1.0}, {"id": None}),
}


@pytest.mark.parametrize("form", SAYS)
def test_a_say_is_spoken_and_answered_once_with_its_ids(shared: Rig, form: str) -> None:
    fields, sent_as = SAYS[form]
    mark = shared.mark()
    sent = shared.say(text=SHORT_TEXT, **fields)
    assert sent.payload is not None
    assert sent.payload.items() >= sent_as.items(), sent.payload  # what the library sent
    first = parsed(shared.client.wait_for(any_say_reply))[0]  # the only say in flight
    spoken = shared.played_since(mark)  # a reply is due only after the last sample
    assert first.topic == SAY_FINISHED, first
    expected = {"siteId": SITE, "id": sent.payload["id"], "sessionId": sent.payload["sessionId"]}
    assert first.message == expected
    assert type(first.payload["id"]) is type(sent.payload["id"])  # 7 stays 7, not "7"
    assert len(spoken) > 0.3 * RATE
    assert np.abs(spoken).max() > 100
    shared.barrier()
    assert shared.client.replies(any_say_reply) == [first]
    assert len(shared.played_since(mark)) == len(spoken) + MARKER_SAMPLES


FAILING_SAYS: Final[dict[str, dict[str, Any]]] = {
    "empty-text": {"text": "", "volume": 1.0},
    "blank-text": {"text": "   ", "volume": 1.0},
    "text-too-long": {"text": "The kettle is on. " * 10, "volume": 1.0},
    "volume-above-1": {"text": SHORT_TEXT, "volume": 3.0},
    "negative-volume": {"text": SHORT_TEXT, "volume": -0.5},
    "text-not-a-string": {"text": 5, "volume": 1.0},
}
"""Says Rhasspy's TTS would fail on (volume 1.0 as Rhasspy sends it, unless that is the fault)."""


@pytest.mark.parametrize("case", FAILING_SAYS)
def test_a_failed_say_gets_an_error_and_still_one_say_finished(shared: Rig, case: str) -> None:
    say_id = f"bad-{uuid.uuid4().hex[:8]}"
    mark = shared.mark()
    shared.say(id=say_id, session_id="s-bad", **FAILING_SAYS[case])
    shared.barrier()  # rejected at once, so answered before the marker played
    replies = parsed(shared.client.replies(about_say(say_id)))
    assert [r.topic for r in replies] == [TTS_ERROR, SAY_FINISHED], replies  # as Rhasspy's TTS
    error, finished = replies
    assert error.message is not None
    assert error.message["siteId"] == SITE
    assert error.message["sessionId"] == "s-bad"
    assert isinstance(error.message["error"], str)
    assert error.message["error"]
    assert finished.message == {"siteId": SITE, "id": say_id, "sessionId": "s-bad"}
    assert len(shared.played_since(mark)) == MARKER_SAMPLES  # nothing but the marker


def test_messages_for_another_site_get_no_reply_and_play_nothing(shared: Rig) -> None:
    mark = shared.mark()
    shared.say(site_id=OTHER_SITE, text=SHORT_TEXT, id="x-say", session_id="x")
    shared.say(site_id=OTHER_SITE, text="", id="x-bad")  # not even an error for another site
    shared.play("x-play", pcm_wav(tone(0.3, RATE), RATE, 2), site_id=OTHER_SITE)
    shared.client.send("GetVoices", id="x-voices", site_id=OTHER_SITE)
    shared.barrier()
    others = parsed(shared.client.replies(lambda r: not r.topic.endswith("/playFinished")))
    assert others == []
    finished = shared.client.replies(lambda r: r.topic.endswith("/playFinished"))
    assert len(finished) == 1  # the marker's only
    assert len(shared.played_since(mark)) == MARKER_SAMPLES


def test_the_same_say_id_twice_is_spoken_and_answered_twice(shared: Rig) -> None:
    say_id = f"dup-{uuid.uuid4().hex[:8]}"
    mark = shared.mark()
    shared.say(text=SHORT_TEXT, id=say_id, session_id="one", volume=1.0)
    shared.client.wait_for(about_say(say_id))
    once = len(shared.played_since(mark))
    shared.say(text=SHORT_TEXT, id=say_id, session_id="two", volume=1.0)
    replies = parsed(shared.client.wait_for(about_say(say_id), count=2))
    assert [(r.topic, _field(r, "sessionId")) for r in replies] == [
        (SAY_FINISHED, "one"),
        (SAY_FINISHED, "two"),
    ]
    assert once > 0
    assert len(shared.played_since(mark)) == 2 * once  # a correlation id, not a dedupe key


def test_the_same_play_request_id_twice_plays_twice(shared: Rig) -> None:
    request_id = f"doorbell-{uuid.uuid4().hex[:8]}"
    wav = pcm_wav(tone(0.4, 16000), 16000, 2)
    mark = shared.mark()
    shared.play(request_id, wav)  # Node-RED publishes the same doorbell each time
    shared.play(request_id, wav)
    replies = parsed(shared.client.wait_for(about_play(request_id), count=2))
    assert [r.topic for r in replies] == [PLAY_FINISHED, PLAY_FINISHED], replies
    played = shared.played_since(mark)
    assert len(played) == pytest.approx(2 * 0.4 * RATE, abs=4)
    for half in (played[: len(played) // 2], played[len(played) // 2 :]):
        amplitude, _left = tone_fit(half)
        assert amplitude == pytest.approx(LEVEL, rel=0.03)


# ---- playBytes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sound:
    """A file to play: how to make it, and how exactly it must come out."""

    rate: int
    channels: int
    make: Callable[[npt.NDArray[np.float64], int], bytes]
    seconds: float = 0.4
    length_tolerance: int = 2
    """Samples (at RATE) the played length may differ by."""
    level_tolerance: float = 0.03
    """Relative error of the played tone's amplitude."""
    residual: float = 0.03
    """Largest RMS of what is not the tone, relative to the tone's RMS."""
    edge: float = 0.0
    """Seconds at either end left out of the level check (codec onsets)."""


def _pcm(width: int) -> Callable[[npt.NDArray[np.float64], int], bytes]:
    return lambda audio, rate: pcm_wav(audio, rate, width)


def _lib(form: str, subtype: str | None) -> Callable[[npt.NDArray[np.float64], int], bytes]:
    return lambda audio, rate: sound_file(audio, rate, form, subtype)


WAVS: Final = {
    "u8-mono-8000": Sound(8000, 1, _pcm(1)),
    "u8-stereo-16000": Sound(16000, 2, _pcm(1)),
    "s16-mono-16000": Sound(16000, 1, _pcm(2)),
    "s16-mono-22050": Sound(22050, 1, _pcm(2)),
    "s16-stereo-44100": Sound(44100, 2, _pcm(2)),
    "s24-mono-48000": Sound(48000, 1, _pcm(3)),
    "s24-stereo-22050": Sound(22050, 2, _pcm(3)),
    "s32-mono-44100": Sound(44100, 1, _pcm(4)),
    "s32-stereo-11025": Sound(11025, 2, _pcm(4)),
    "f32-mono-16000": Sound(16000, 1, _lib("WAV", "FLOAT")),
    "f32-stereo-48000": Sound(48000, 2, _lib("WAV", "FLOAT")),
    "extensible-s16-mono-22050": Sound(22050, 1, _lib("WAVEX", "PCM_16")),
    "extensible-s16-stereo-32000": Sound(32000, 2, _lib("WAVEX", "PCM_16")),
}
"""Every kind of WAV Rhasspy's audio server plays (aplay, or soundfile for float/extensible)."""

COMPRESSED: Final = {
    "mp3-stereo-44100": Sound(
        44100, 2, _lib("MP3", None), 1.0, round(0.05 * RATE), 0.1, 0.15, 0.06
    ),
    "ogg-vorbis-mono-48000": Sound(
        48000, 1, _lib("OGG", "VORBIS"), 1.0, round(0.01 * RATE), 0.1, 0.15, 0.06
    ),
    "flac-mono-16000": Sound(16000, 1, _lib("FLAC", "PCM_16"), 1.0),
}
"""Compressed audio, which Rhasspy's audio server converts (soundfile, then audioread)."""


def check_played(rig: Rig, sound: Sound) -> None:
    """playBytes of the sound: one playFinished (id = request id), after all of it played;
    the right length and the tone at the right level and pitch."""
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    payload = sound.make(tone(sound.seconds, sound.rate, sound.channels), sound.rate)
    mark = rig.mark()
    rig.play(request_id, payload)
    first = parsed(rig.client.wait_for(about_play(request_id)))[0]
    played = rig.played_since(mark)
    assert first.topic == PLAY_FINISHED, first
    assert _field(first, "id") == request_id
    assert len(played) == pytest.approx(sound.seconds * RATE, abs=sound.length_tolerance)
    edge = round(sound.edge * RATE)
    amplitude, left = tone_fit(played[edge : len(played) - edge])
    assert amplitude == pytest.approx(LEVEL, rel=sound.level_tolerance)
    assert left < sound.residual
    rig.barrier()
    assert rig.client.replies(about_play(request_id)) == [first]


@pytest.mark.parametrize("kind", WAVS)
def test_play_bytes_plays_every_wav_rhasspy_plays(shared: Rig, kind: str) -> None:
    check_played(shared, WAVS[kind])


@pytest.mark.parametrize("kind", COMPRESSED)
def test_play_bytes_plays_compressed_audio(shared: Rig, kind: str) -> None:
    check_played(shared, COMPRESSED[kind])


def test_play_finished_names_the_request_as_session_as_rhasspy_does(shared: Rig) -> None:
    """rhasspy-hermes reads a playBytes' session id from its topic (the request id), and
    Rhasspy's audio server answers with it."""
    request_id = f"sess-{uuid.uuid4().hex[:8]}"
    shared.play(request_id, MARKER_WAV)
    finished = parsed(shared.client.wait_for(about_play(request_id)))[0]
    assert finished.message == {"id": request_id, "sessionId": request_id}


def test_an_invalid_wav_gets_an_error_and_still_one_play_finished(shared: Rig) -> None:
    request_id = f"bad-{uuid.uuid4().hex[:8]}"
    mark = shared.mark()
    shared.play(request_id, b"RIFF\x10\x00\x00\x00WAVEnot really a wave")
    shared.barrier()
    replies = parsed(shared.client.replies(about_play(request_id)))
    assert [r.topic for r in replies] == [PLAY_ERROR, PLAY_FINISHED], replies
    assert _field(replies[0], "siteId") == SITE
    assert _field(replies[1], "id") == request_id
    assert len(shared.played_since(mark)) == MARKER_SAMPLES


def test_play_finished_comes_after_the_audio_really_ended(paced: Rig) -> None:
    request_id = f"long-{uuid.uuid4().hex[:8]}"
    sent = paced.play(request_id, pcm_wav(tone(1.5, 16000), 16000, 2))
    finished = parsed(paced.client.wait_for(about_play(request_id)))[0]
    assert finished.topic == PLAY_FINISHED, finished
    assert finished.at - sent.at >= 1.5 - 0.02  # played in real time: not before it could end


# ---- say, timing -----------------------------------------------------------------------------


def test_say_finished_comes_after_the_last_sample_played(paced: Rig) -> None:
    say_id = f"timed-{uuid.uuid4().hex[:8]}"
    mark = paced.mark()
    sent = paced.say(text=LONG_TEXT, id=say_id, session_id="", volume=1.0)
    finished = parsed(paced.client.wait_for(about_say(say_id)))[0]
    seconds = len(paced.played_since(mark)) / RATE
    assert finished.topic == SAY_FINISHED, finished
    assert seconds > 2.0
    assert finished.at - sent.at >= seconds - 0.02  # not before the audio could have ended


def test_a_second_say_with_the_same_id_while_the_first_plays_keeps_both_replies(
    paced: Rig,
) -> None:
    say_id = f"same-{uuid.uuid4().hex[:8]}"
    mark = paced.mark()
    paced.say(text=LONG_TEXT, id=say_id, session_id="first", volume=1.0)
    wait_until(lambda: len(paced.played_since(mark)) > 0, what="the first say playing")
    second = paced.say(text=SHORT_TEXT, id=say_id, session_id="second", volume=1.0)
    replies = parsed(paced.client.wait_for(about_say(say_id), count=2))
    assert [(r.topic, _field(r, "sessionId")) for r in replies] == [
        (SAY_FINISHED, "first"),
        (SAY_FINISHED, "second"),
    ]
    assert second.at < replies[0].at, "the first say ended before the second was sent"


# ---- audio server state: toggle, volume --------------------------------------------------------


def test_toggle_off_silences_say_and_play_bytes_until_toggle_on(fresh: Rig) -> None:
    fresh.client.send("AudioToggleOff", site_id=SITE)
    fresh.say(text=SHORT_TEXT, id="muted-say", session_id="m", volume=1.0)
    fresh.play("muted-play", pcm_wav(tone(0.3, RATE), RATE, 2))
    said = parsed(fresh.client.wait_for(about_say("muted-say")))
    played = parsed(fresh.client.wait_for(about_play("muted-play")))
    assert [r.topic for r in said + played] == [SAY_FINISHED, PLAY_FINISHED]
    assert not np.any(fresh.node.samples())  # answered as finished, nothing heard
    fresh.client.send("AudioToggleOn", site_id=SITE)
    mark = fresh.mark()
    fresh.play("unmuted-play", pcm_wav(tone(0.3, RATE), RATE, 2))
    fresh.client.wait_for(about_play("unmuted-play"))
    played_again = fresh.played_since(mark)
    assert len(played_again) == round(0.3 * RATE)
    assert tone_fit(played_again)[0] == pytest.approx(LEVEL, rel=0.03)


def test_set_volume_scales_later_audio(fresh: Rig) -> None:
    wav = pcm_wav(tone(0.5, 16000), 16000, 2)

    def level_of(request: Callable[[], Published], about: Callable[[Reply], bool]) -> float:
        mark = fresh.mark()
        request()
        reply = parsed(fresh.client.wait_for(about))[0]
        assert reply.topic in (PLAY_FINISHED, SAY_FINISHED), reply
        return rms(fresh.played_since(mark))

    def play(request_id: str) -> float:
        return level_of(lambda: fresh.play(request_id, wav), about_play(request_id))

    def say(say_id: str) -> float:
        said = about_say(say_id)
        return level_of(lambda: fresh.say(text=SHORT_TEXT, id=say_id, volume=1.0), said)

    full_play, full_say = play("full"), say("full")
    fresh.client.send("AudioSetVolume", volume=0.5, site_id=SITE)
    assert play("half") == pytest.approx(0.5 * full_play, rel=0.03)
    assert say("half") == pytest.approx(0.5 * full_say, rel=0.03)
    fresh.client.send("AudioSetVolume", volume=1.0, site_id=SITE)
    assert play("again") == pytest.approx(full_play, rel=0.03)


def test_toggle_and_volume_for_another_site_change_nothing(fresh: Rig) -> None:
    fresh.client.send("AudioToggleOff", site_id=OTHER_SITE)
    fresh.client.send("AudioSetVolume", volume=0.1, site_id=OTHER_SITE)
    fresh.play("still-loud", pcm_wav(tone(0.4, RATE), RATE, 2))
    finished = parsed(fresh.client.wait_for(about_play("still-loud")))[0]
    assert finished.topic == PLAY_FINISHED
    amplitude, _left = tone_fit(fresh.node.samples())
    assert amplitude == pytest.approx(LEVEL, rel=0.03)


# ---- voices ------------------------------------------------------------------------------------


def test_get_voices_lists_the_voices(shared: Rig) -> None:
    shared.client.send("GetVoices", id="v-1", site_id=SITE)
    shared.client.send("GetVoices", site_id=SITE)  # no id: answered with none
    answers = parsed(shared.client.wait_for(lambda r: r.topic == VOICES, count=2))
    assert [_field(r, "id") for r in answers] == ["v-1", None]
    for answer in answers:
        assert answer.type == "Voices"
        assert answer.message is not None
        assert answer.message["siteId"] == SITE
        voices = answer.message["voices"]
        assert "default" in [voice["voiceId"] for voice in voices]
        assert all(isinstance(voice["description"], str) for voice in voices)
