"""Chimes: built-in tones (rendered without numpy, the samples numpy made), WAV files converted
to the voice's rate, and which chime goes first."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from agent.core.messages import Priority, SpeakRequest
from agent.formats.chimes import BUILTIN, ChimePlan, Note, render_notes
from agent.settings.declarations import BUILTIN_CHIMES
from agent.speech.chimes import chime_bank, load_sound

RATE = 22050


def samples(pcm: bytes) -> npt.NDArray[np.int16]:
    return np.frombuffer(pcm, dtype="<i2").astype(np.int16)


def numpy_notes(notes: tuple[Note, ...], rate: int) -> npt.NDArray[np.int16]:
    """The tones as the agent rendered them with numpy (float32 throughout)."""
    parts = []
    for frequency, seconds in notes:
        n = round(rate * seconds)
        if frequency <= 0:
            parts.append(np.zeros(n, dtype=np.float32))
            continue
        t = np.arange(n, dtype=np.float32) / rate
        tone = np.sin(2 * np.pi * frequency * t) * 0.2
        edge = min(round(rate * 0.005), n // 2)
        ramp = np.linspace(0.0, 1.0, edge, dtype=np.float32)
        tone[:edge] *= ramp
        tone[n - edge :] *= ramp[::-1]
        parts.append(tone.astype(np.float32))
    parts.append(np.zeros(round(rate * 0.12), dtype=np.float32))
    return np.round(np.concatenate(parts) * 32767).astype(np.int16)


def test_the_config_knows_every_built_in_chime() -> None:
    assert set(BUILTIN_CHIMES) == set(BUILTIN)


def test_built_in_tones_start_and_end_silent_at_a_speech_like_level() -> None:
    for notes in BUILTIN.values():
        pcm = samples(render_notes(notes, RATE))
        assert pcm[0] == 0
        assert abs(int(pcm[-1])) < 50
        peak = np.abs(pcm).max() / 32767
        assert 0.15 < peak <= 0.21
        assert np.max(np.abs(np.diff(pcm.astype(np.int32)))) < 0.2 * 32767 * 0.5  # no clicks


@pytest.mark.parametrize("rate", [16000, 22050, 44100, 48000])
def test_built_in_tones_are_the_samples_numpy_made_within_one_step(rate: int) -> None:
    for notes in BUILTIN.values():
        made = samples(render_notes(notes, rate))
        before = numpy_notes(notes, rate)
        assert len(made) == len(before)
        differ = np.abs(made.astype(np.int32) - before)
        assert differ.max() <= 1
        assert np.count_nonzero(differ) <= 5  # a float32 sine's last bit, now and then


def test_chimes_and_their_choice_import_without_numpy() -> None:
    """The process that plays alarms starts lean: the tones, the bank and the choice load no
    numpy (a file chime loads it with its decoder, when there is one)."""
    code = (
        "import sys; import agent.formats.chimes, agent.speech.chimes as c;"
        "bank = c.chime_bank({}, 16000); assert set(bank) == set(agent.formats.chimes.BUILTIN);"
        "print('numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_choice_by_class_by_name_and_the_built_in_when_a_file_was_left_out() -> None:
    bank = chime_bank({}, RATE)
    plan = ChimePlan(
        {"alarm": bank["alarm"], "ding": bank["ding"], "alert": bank["alert"]},
        by_class={Priority.ALARM: "alarm", Priority.CRITICAL: "siren"},  # siren: left out
        defaults={Priority.CRITICAL: "alert"},
    )
    assert plan.for_request(SpeakRequest("a", "x", priority=Priority.ALARM)) == bank["alarm"]
    assert plan.for_request(SpeakRequest("c", "x", priority=Priority.CRITICAL)) == bank["alert"]
    assert plan.for_request(SpeakRequest("i", "x")) is None  # info: no chime unless asked
    assert plan.for_request(SpeakRequest("t", "x", chime=True)) == bank["ding"]
    assert plan.for_request(SpeakRequest("n", "x", chime="alert")) == bank["alert"]
    assert plan.for_request(SpeakRequest("s", "x", chime="siren")) is None  # named: no stand-in
    off = SpeakRequest("f", "x", priority=Priority.ALARM, chime=False)
    assert plan.for_request(off) is None


def write_wav(path: Path, samples: np.ndarray, rate: int, channels: int) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())


def test_a_wav_file_is_mixed_to_mono_and_resampled(tmp_path: Path) -> None:
    seconds, source_rate = 0.5, 44100
    t = np.arange(int(source_rate * seconds)) / source_rate
    left = (np.sin(2 * np.pi * 500 * t) * 10000).astype(np.int16)
    stereo = np.stack([left, left], axis=1).reshape(-1)
    path = tmp_path / "door.wav"
    write_wav(path, stereo, source_rate, 2)
    pcm = samples(load_sound(path, RATE))
    assert len(pcm) == round(seconds * RATE)
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    assert abs(np.argmax(spectrum) * RATE / len(pcm) - 500) < 3


@pytest.mark.allow_error_logs("left out")
def test_a_file_that_cannot_be_decoded_is_left_out_and_the_built_ins_stay(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot a wav at all")
    good = tmp_path / "door.wav"
    write_wav(good, np.full(2205, 1000, np.int16), RATE, 1)
    bank = chime_bank({"alarm": bad, "door": good}, RATE)
    assert bank["alarm"] == render_notes(BUILTIN["alarm"], RATE)  # the built-in one kept
    assert samples(bank["door"]).tolist() == [1000] * 2205


def test_an_8_bit_wav_is_played_too(tmp_path: Path) -> None:
    """Any sample format (a doorbell recorded as 8-bit unsigned): decoded, not refused."""
    path = tmp_path / "old.wav"
    t = np.arange(8000) / 8000
    tone = np.round(128 + 100 * np.sin(2 * np.pi * 400 * t)).astype(np.uint8)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(8000)
        out.writeframes(tone.tobytes())
    pcm = samples(load_sound(path, RATE))
    assert len(pcm) == RATE
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    assert abs(np.argmax(spectrum) * RATE / len(pcm) - 400) < 3
