"""Sounds in announcements, end to end: `sound` and `sound_after` by name (every format the agent
decodes) and by URL (a real HTTP server, also a hostile one), checked against the files decoded
without the agent's code, and every refusal and failure followed by an announcement that plays."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pytest

from agent.formats.chimes import BUILTIN, render_notes
from harness import free_port, read_pcm, wait_until
from tests.conftest import RunningAgent, StartAgent
from tests.media_files import (
    BY_NAME,
    OTHER_TONE,
    SPECS,
    TONE_HZ,
    MediaSpec,
    decode_reference,
    ideal_mono,
    write_all,
    write_garbage,
)
from tests.release_server import ReleaseServer
from tests.tiny_voice import speaker_frequency

pytestmark = [pytest.mark.broker]

RATE: Final = 22050
"""The device's rate: the tiny voice's (Hz)."""
MAX_MEDIA_BYTES: Final = 100_000
"""`audio.max_media_bytes` of the URL tests (bytes): small, so a big file is refused."""
STALL_TIMEOUT: Final = 1.0
"""`audio.media_stall_timeout_s` of the URL tests (seconds)."""
MIN_SNR_DB: Final = 40.0
"""Least signal-to-error ratio of a captured sound against the independent decode (dB). Both
decode with libsndfile and resample with libsoxr "HQ", so they differ by the agent's 16-bit
rounding (~90 dB here); a wrong rate, mix or gain, a sample of lag, or a resampler that lets
the 15 kHz overtone alias (linear interpolation: 14-17 dB) gives below 20 dB."""
MIN_IDEAL_SNR_DB: Final = 30.0
"""Least ratio of a losslessly coded sound against the ideal tone (dB): 8-bit, mu-law and
A-law samples give 37-38 dB, 16 bits and more ~70 dB."""
LEVEL_TOLERANCE_DB: Final = {False: 0.2, True: 1.0}
"""Largest difference of RMS level from the ideal tone (dB), lossless and lossy (measured:
lossy within 0.45 dB)."""
PITCH_TOLERANCE_HZ: Final = 2.0
"""Largest difference of the dominant frequency from the tone's (Hz)."""
MAX_LENGTH_ERROR: Final = 4
"""Largest difference in length from the independent decode (samples)."""
TEXT: Final = "The garage door is open."


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every test file, name -> path (the shape of `audio.media`)."""
    return write_all(tmp_path_factory.mktemp("media"))


@pytest.fixture
def server(tmp_path: Path, media: dict[str, Path]) -> Iterator[ReleaseServer]:
    """A real HTTP server with every test file, a garbage file and a big file."""
    root = tmp_path / "site"
    root.mkdir()
    for path in media.values():
        (root / path.name).write_bytes(path.read_bytes())
    write_garbage(root / "garbage.wav")
    assert media["wav_double"].stat().st_size > MAX_MEDIA_BYTES  # the big one
    started = ReleaseServer(root).start()
    yield started
    started.stop()


# ---- measuring the capture ----------------------------------------------------------------


def speak(agent: RunningAgent, **payload: object) -> None:
    """Publish a JSON speak message from the test's paho client."""
    agent.watcher.publish(agent.topics.speak, json.dumps(payload).encode())


def ended(agent: RunningAgent, request_id: str, expected: str) -> dict[str, Any]:
    """The request's last event, whichever it is, checked to be `expected` (an unexpected end
    fails at once, showing the event)."""
    event = agent.watcher.wait_end(request_id)
    assert event["event"] == expected, event
    return event


def captured(agent: RunningAgent) -> npt.NDArray[np.float64]:
    """Everything played so far, full scale 1."""
    if not agent.capture.exists():
        return np.zeros(0)
    return read_pcm(agent.capture).astype(np.float64) / 32768.0


def correlation(haystack: npt.NDArray[np.float64], needle: npt.NDArray[np.float64]) -> Any:
    """Cross-correlation at every lag from -(len(needle) - 1) to len(haystack) - 1 (index 0
    is the most negative lag), by FFT."""
    size = 1 << (len(haystack) + len(needle)).bit_length()
    spectrum = np.fft.rfft(haystack, size) * np.conj(np.fft.rfft(needle, size))
    circular = np.fft.irfft(spectrum, size)
    return np.concatenate([circular[size - len(needle) + 1 :], circular[: len(haystack)]])


def snr_db(got: npt.NDArray[np.float64], reference: npt.NDArray[np.float64]) -> float:
    """Signal-to-error ratio of `got` against `reference` over their common length (dB)."""
    length = min(len(got), len(reference))
    error = got[:length] - reference[:length]
    signal = float(np.sum(reference[:length] ** 2))
    return float(10 * np.log10(signal / max(float(np.sum(error**2)), 1e-20)))


def level_db(samples: npt.NDArray[np.float64]) -> float:
    """RMS level (dBFS)."""
    return float(10 * np.log10(np.mean(samples**2) + 1e-20))


def dominant_hz(samples: npt.NDArray[np.float64]) -> float:
    """The strongest frequency (Hz), to a quarter hertz (zero-padded to 4 s)."""
    size = max(4 * RATE, len(samples))
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples)), size))
    return float(np.argmax(spectrum)) * RATE / size


@dataclass(frozen=True)
class Found:
    """Where a sound was found in a capture, and how well it matched there."""

    start: int
    end: int
    snr: float


def find_sounds(
    played: npt.NDArray[np.float64], reference: npt.NDArray[np.float64], count: int
) -> list[Found]:
    """The `count` best places of `reference` in `played`, in order of time."""
    scores = correlation(played, reference)
    offset = len(reference) - 1
    found = []
    for _ in range(count):
        best = int(np.argmax(scores))
        start = best - offset
        found.append(Found(start, start + len(reference), snr_at(played, reference, start)))
        scores[max(best - len(reference), 0) : best + len(reference)] = -np.inf
    return sorted(found, key=lambda f: f.start)


def snr_at(
    played: npt.NDArray[np.float64], reference: npt.NDArray[np.float64], start: int
) -> float:
    """`snr_db` of the reference against what was played from `start` (zeros outside)."""
    padded = np.concatenate([np.zeros(len(reference)), played, np.zeros(len(reference))])
    begin = start + len(reference)
    return snr_db(padded[begin : begin + len(reference)], reference)


def check_plays_alone(
    played: npt.NDArray[np.float64], spec: MediaSpec, reference: npt.NDArray[np.float64]
) -> None:
    """A sound-only announcement's capture is the file, decoded and resampled: same length, no
    lag, the independent decode's samples, the tone's level and pitch."""
    (where,) = find_sounds(played, reference, 1)
    ideal = ideal_mono(spec, RATE)
    level, pitch = level_db(played), dominant_hz(played)
    ideal_snr = snr_db(played, ideal)
    print(
        f"{spec.name} ({spec.format}/{spec.subtype}, {spec.rate} Hz, {spec.channels} ch): "
        f"{len(played)} samples (reference {len(reference)}), lag {where.start}, "
        f"SNR {where.snr:.1f} dB against the independent decode, {ideal_snr:.1f} dB against "
        f"the ideal tone, level {level:.2f} dBFS (ideal {level_db(ideal):.2f}), "
        f"pitch {pitch:.2f} Hz"
    )
    assert abs(len(played) - len(reference)) <= MAX_LENGTH_ERROR
    assert abs(where.start) <= 1
    assert where.snr > MIN_SNR_DB
    assert abs(level - level_db(ideal)) <= LEVEL_TOLERANCE_DB[spec.lossy]
    assert abs(pitch - spec.hz) <= PITCH_TOLERANCE_HZ
    if not spec.lossy:
        assert ideal_snr > MIN_IDEAL_SNR_DB


def next_plays(agent: RunningAgent, request_id: str) -> None:
    """A plain text announcement after a refusal or a failure is spoken."""
    before = len(captured(agent))
    speak(agent, id=request_id, text=TEXT)
    finished = ended(agent, request_id, "finished")
    assert float(finished["audio_seconds"]) > 0.1
    assert len(captured(agent)) > before
    assert agent.process.alive()


# ---- by name ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [spec.name for spec in SPECS])
def test_each_format_plays_as_the_file_decoded_independently(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path], name: str
) -> None:
    spec = BY_NAME[name]
    agent = start_agent(voice=tiny_voice, audio={"media": {n: str(p) for n, p in media.items()}})
    speak(agent, id="s1", sound=name)  # no text: a sound-only announcement
    finished = ended(agent, "s1", "finished")
    played = captured(agent)
    reference = decode_reference(media[name], RATE)
    check_plays_alone(played, spec, reference)
    assert float(finished["audio_seconds"]) == pytest.approx(len(played) / RATE, abs=0.002)


def test_sound_before_and_sound_after_surround_the_speech(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path]
) -> None:
    """A 440 Hz FLAC before, the words, a 660 Hz MP3 after: each where it belongs."""
    bell_path, horn_path = media["flac_16"], media[OTHER_TONE.name]
    agent = start_agent(
        voice=tiny_voice, audio={"media": {"bell": str(bell_path), "horn": str(horn_path)}}
    )
    speak(agent, id="both", sound="bell", text=TEXT, sound_after="horn")
    ended(agent, "both", "finished")
    played = captured(agent)
    (first,) = find_sounds(played, decode_reference(bell_path, RATE), 1)
    (last,) = find_sounds(played, decode_reference(horn_path, RATE), 1)
    speech = played[first.end : last.start]
    pitches = [dominant_hz(played[f.start : f.end]) for f in (first, last) if f.start >= 0]
    pitch = dominant_hz(speech) if len(speech) else 0.0
    print(
        f"bell at {first.start}-{first.end} (SNR {first.snr:.1f} dB), speech "
        f"{len(speech)} samples at {pitch:.1f} Hz, horn at {last.start}-{last.end} "
        f"(SNR {last.snr:.1f} dB) of {len(played)}; sound pitches {pitches}"
    )
    assert first.snr > MIN_SNR_DB
    assert last.snr > MIN_SNR_DB
    assert first.start == 0  # the announcement starts with the sound
    assert abs(last.end - len(played)) <= MAX_LENGTH_ERROR  # and ends with the other
    assert len(speech) > 0.2 * RATE
    assert level_db(speech) > -60  # the words, between the sounds
    assert abs(pitch - speaker_frequency(0)) < 5  # the tiny voice's sine, not a tone
    assert pitches == pytest.approx([TONE_HZ, OTHER_TONE.hz], abs=PITCH_TOLERANCE_HZ)


def test_the_same_sound_twice_is_found_twice(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path]
) -> None:
    """One name as `sound` and `sound_after`: two copies, the speech between them."""
    agent = start_agent(voice=tiny_voice, audio={"media": {"bell": str(media["wav_16"])}})
    speak(agent, id="twice", sound="bell", text=TEXT, sound_after="bell")
    ended(agent, "twice", "finished")
    played = captured(agent)
    first, last = find_sounds(played, decode_reference(media["wav_16"], RATE), 2)
    print(f"copies at {first.start} and {last.start} of {len(played)} samples")
    assert min(first.snr, last.snr) > MIN_SNR_DB
    assert first.start == 0
    assert last.start - first.end > 0.2 * RATE  # the speech between
    assert abs(last.end - len(played)) <= MAX_LENGTH_ERROR


def test_the_chime_comes_before_the_sound(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path]
) -> None:
    agent = start_agent(voice=tiny_voice, audio={"media": {"bell": str(media["wav_24"])}})
    speak(agent, id="c1", chime="ding", sound="bell")
    ended(agent, "c1", "finished")
    played = captured(agent)
    chime = np.frombuffer(render_notes(BUILTIN["ding"], RATE), "<i2").astype(np.float64) / 32768.0
    (sound,) = find_sounds(played, decode_reference(media["wav_24"], RATE), 1)
    chime_snr = snr_db(played[: len(chime)], chime)
    print(f"chime SNR {chime_snr:.1f} dB, sound at {sound.start} (SNR {sound.snr:.1f} dB)")
    assert chime_snr > MIN_SNR_DB
    assert sound.start >= len(chime)
    assert sound.snr > MIN_SNR_DB
    assert abs(sound.end - len(played)) <= MAX_LENGTH_ERROR


@pytest.mark.parametrize("which", ["sound", "sound_after"])
def test_an_unknown_name_is_rejected(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path], which: str
) -> None:
    agent = start_agent(voice=tiny_voice, audio={"media": {"bell": str(media["wav_16"])}})
    speak(agent, id="u1", text=TEXT, **{which: "trumpet"})
    rejected = ended(agent, "u1", "rejected")
    assert rejected["reason"] == "unknown_sound"
    assert rejected["field"] == which
    next_plays(agent, "after")
    assert "started" not in [e["event"] for e in agent.watcher.events("u1")]


def test_garbage_behind_a_name_fails_and_the_next_plays(
    start_agent: StartAgent, tiny_voice: Path, tmp_path: Path
) -> None:
    garbage = write_garbage(tmp_path / "noise.wav")
    agent = start_agent(voice=tiny_voice, audio={"media": {"noise": str(garbage)}})
    speak(agent, id="g1", sound="noise", text=TEXT)
    failed = ended(agent, "g1", "failed")
    print(f"failed: {failed}")
    assert failed["reason"] == "unsupported_audio"
    assert len(captured(agent)) == 0  # nothing of it played, not even its words
    next_plays(agent, "after")


# ---- by URL -------------------------------------------------------------------------------


def url_agent(start_agent: StartAgent, tiny_voice: Path, **audio: Any) -> RunningAgent:
    """An agent with a small media cap and a short stall timeout, that may fetch from the test
    servers (127.0.0.1, any port: `audio.media_hosts`)."""
    settings = {
        "max_media_bytes": MAX_MEDIA_BYTES,
        "media_stall_timeout_s": STALL_TIMEOUT,
        "media_hosts": ["127.0.0.1:*"],
    }
    return start_agent(voice=tiny_voice, audio={**settings, **audio})


@pytest.mark.parametrize("name", ["wav_16", "ogg_opus", "mp3_stereo"])
def test_a_url_sound_plays(
    start_agent: StartAgent,
    tiny_voice: Path,
    media: dict[str, Path],
    server: ReleaseServer,
    name: str,
) -> None:
    agent = url_agent(start_agent, tiny_voice)
    speak(agent, id="w1", sound=server.url + media[name].name)
    finished = ended(agent, "w1", "finished")
    played = captured(agent)
    check_plays_alone(played, BY_NAME[name], decode_reference(media[name], RATE))
    assert float(finished["audio_seconds"]) == pytest.approx(len(played) / RATE, abs=0.002)
    assert [path for path, _ in server.behaviour.requests] == [media[name].name]


def test_a_url_sound_after_the_text_plays_after_it(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path], server: ReleaseServer
) -> None:
    agent = url_agent(start_agent, tiny_voice)
    speak(agent, id="w2", text=TEXT, sound_after=server.url + media["flac_16"].name)
    ended(agent, "w2", "finished")
    played = captured(agent)
    (sound,) = find_sounds(played, decode_reference(media["flac_16"], RATE), 1)
    print(f"sound at {sound.start}-{sound.end} of {len(played)} (SNR {sound.snr:.1f} dB)")
    assert sound.snr > MIN_SNR_DB
    assert sound.start > 0.2 * RATE  # after the words
    assert level_db(played[: sound.start]) > -60
    assert abs(sound.end - len(played)) <= MAX_LENGTH_ERROR


def test_a_url_that_failed_is_fetched_again_by_the_next_request_and_repeats_play_it(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path], server: ReleaseServer
) -> None:
    """A failure is not remembered (the file may be there now), and a sound played once is
    found again by its repeat though its bytes were let go (it is in the phrase cache)."""
    agent = url_agent(start_agent, tiny_voice)
    url = server.url + "late.wav"
    speak(agent, id="early", sound=url)
    assert ended(agent, "early", "failed")["reason"] == "sound_unavailable"
    (server.directory / "late.wav").write_bytes(media["wav_16"].read_bytes())
    speak(agent, id="now", sound=url, repeat=2, repeat_interval=0.5)

    def plays() -> int:
        return [e["event"] for e in agent.watcher.events("now")].count("finished")

    wait_until(lambda: plays() == 2, what="both plays")
    copies = find_sounds(captured(agent), decode_reference(media["wav_16"], RATE), 2)
    assert min(c.snr for c in copies) > MIN_SNR_DB
    assert [path for path, _ in server.behaviour.requests] == ["late.wav", "late.wav"]


def test_a_redirect_on_the_same_server_is_followed(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path], server: ReleaseServer
) -> None:
    server.behaviour.redirect["moved.wav"] = "/" + media["wav_16"].name
    agent = url_agent(start_agent, tiny_voice)
    speak(agent, id="r1", sound=server.url + "moved.wav")
    ended(agent, "r1", "finished")
    reference = decode_reference(media["wav_16"], RATE)
    check_plays_alone(captured(agent), BY_NAME["wav_16"], reference)
    assert [path for path, _ in server.behaviour.requests] == ["moved.wav", media["wav_16"].name]


def test_a_content_length_shorter_than_the_body_plays_only_the_declared_bytes(
    start_agent: StartAgent, tiny_voice: Path, media: dict[str, Path], server: ReleaseServer
) -> None:
    """HTTP/1.1 ends a body at its Content-Length: what a lying server sends beyond it is
    never read, so the sound is the declared prefix (a WAV cut short still decodes)."""
    data = media["wav_16"].read_bytes()
    declared = 44 + 2 * 4410  # the header and 0.1 s of 44.1 kHz samples
    server.behaviour.content_length = declared
    agent = url_agent(start_agent, tiny_voice)
    speak(agent, id="short", sound=server.url + media["wav_16"].name)
    ended(agent, "short", "finished")
    played = captured(agent)
    reference = decode_reference(data[:declared], RATE)
    (where,) = find_sounds(played, reference, 1)
    print(f"{len(played)} samples played (prefix {len(reference)}), SNR {where.snr:.1f} dB")
    assert abs(len(played) - len(reference)) <= MAX_LENGTH_ERROR
    assert where.start == 0
    assert where.snr > MIN_SNR_DB
    next_plays(agent, "after")


@dataclass(frozen=True)
class Hostile:
    """A misbehaving server (set up on the test's server) and the word the detail must hold."""

    url: Callable[[ReleaseServer, dict[str, Path]], str]
    word: str
    audio: dict[str, Any] = field(default_factory=dict)
    """Audio settings of the agent, over `url_agent`'s."""


def _cut(server: ReleaseServer, media: dict[str, Path]) -> str:
    server.behaviour.cut_after = 1000  # the full Content-Length, then the connection closes
    return server.url + media["wav_16"].name


def _longer(server: ReleaseServer, media: dict[str, Path]) -> str:
    server.behaviour.content_length = media["wav_16"].stat().st_size + 5000
    return server.url + media["wav_16"].name


def _big(server: ReleaseServer, media: dict[str, Path]) -> str:
    return server.url + media["wav_double"].name  # Content-Length over the cap


def _endless(server: ReleaseServer, media: dict[str, Path]) -> str:
    server.behaviour.endless = True  # no Content-Length, data without end
    return server.url + media["wav_16"].name


def _elsewhere(server: ReleaseServer, media: dict[str, Path]) -> str:
    other_host = f"http://localhost:{server.port}/{media['wav_16'].name}"  # same port
    server.behaviour.redirect["elsewhere.wav"] = other_host
    return server.url + "elsewhere.wav"


def _other_address(server: ReleaseServer, media: dict[str, Path]) -> str:
    other = f"http://127.0.0.2:{server.port}/{media['wav_16'].name}"  # loopback, not named
    server.behaviour.redirect["other.wav"] = other
    return server.url + "other.wav"


def _stall(server: ReleaseServer, media: dict[str, Path]) -> str:
    server.behaviour.stall_after = 4096  # one block of the body, then nothing
    return server.url + media["wav_16"].name


def _drip(server: ReleaseServer, media: dict[str, Path]) -> str:
    server.behaviour.drip_seconds = 0.2  # a byte at a time: never stalled, never done
    return server.url + media["wav_16"].name


def _missing(server: ReleaseServer, media: dict[str, Path]) -> str:
    return server.url + "nothing-here.wav"


def _closed_port(server: ReleaseServer, media: dict[str, Path]) -> str:
    return f"http://127.0.0.1:{free_port()}/bell.wav"


HOSTILE: Final = {
    "content_length_longer_than_the_body": Hostile(_longer, "incomplete"),
    "cut_part_way": Hostile(_cut, "incomplete"),
    "content_length_over_the_cap": Hostile(_big, "too_large"),
    "endless_body": Hostile(_endless, "too_large"),
    "redirect_to_another_host": Hostile(_elsewhere, "refused_by_policy"),
    "redirect_to_another_address": Hostile(_other_address, "refused_by_policy"),
    "stall": Hostile(_stall, "timeout"),
    "drip_past_the_deadline": Hostile(
        _drip, "timeout", {"media_timeout_s": 2.0, "media_stall_timeout_s": 30.0}
    ),
    "not_found": Hostile(_missing, "http_error 404"),
    "nobody_listening": Hostile(_closed_port, "unreachable"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_server_fails_the_announcement_and_the_next_plays(
    start_agent: StartAgent,
    tiny_voice: Path,
    media: dict[str, Path],
    server: ReleaseServer,
    case: str,
) -> None:
    hostile = HOSTILE[case]
    url = hostile.url(server, media)
    agent = url_agent(start_agent, tiny_voice, **hostile.audio)
    speak(agent, id="h1", sound=url, text=TEXT)
    failed = ended(agent, "h1", "failed")
    print(f"{case}: {failed}")
    assert failed["reason"] == "sound_unavailable"
    assert str(failed["detail"]).startswith(f"{hostile.word}: ")  # a code, then the URL
    assert len(captured(agent)) == 0  # decoded before the first sample: nothing played
    next_plays(agent, "after")


def test_garbage_behind_a_url_fails_and_the_next_plays(
    start_agent: StartAgent, tiny_voice: Path, server: ReleaseServer
) -> None:
    agent = url_agent(start_agent, tiny_voice)
    speak(agent, id="g2", sound=server.url + "garbage.wav")
    failed = ended(agent, "g2", "failed")
    print(f"failed: {failed}")
    assert failed["reason"] == "unsupported_audio"
    assert len(captured(agent)) == 0
    next_plays(agent, "after")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/bell.wav"])
def test_a_url_of_another_scheme_is_refused(
    start_agent: StartAgent, tiny_voice: Path, url: str
) -> None:
    agent = url_agent(start_agent, tiny_voice)
    speak(agent, id="x1", sound=url, text=TEXT)
    rejected = ended(agent, "x1", "rejected")
    print(f"rejected: {rejected}")
    assert rejected["reason"] == "invalid_field"
    assert rejected["field"] == "sound"
    next_plays(agent, "after")
