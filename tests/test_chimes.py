"""Chimes: built-in tones, WAV files converted to the voice's rate, and which chime goes first."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from agent.chimes import BUILTIN, ChimePlan, chime_bank, load_wav, render_notes
from agent.config import BUILTIN_CHIMES
from agent.messages import Priority, SpeakRequest

RATE = 22050


def test_the_config_knows_every_built_in_chime() -> None:
    assert set(BUILTIN_CHIMES) == set(BUILTIN)


def test_built_in_tones_start_and_end_silent_at_a_speech_like_level() -> None:
    for notes in BUILTIN.values():
        pcm = render_notes(notes, RATE)
        assert pcm[0] == 0
        assert abs(int(pcm[-1])) < 50
        peak = np.abs(pcm).max() / 32767
        assert 0.15 < peak <= 0.21
        assert np.max(np.abs(np.diff(pcm.astype(np.int32)))) < 0.2 * 32767 * 0.5  # no clicks


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
    pcm = load_wav(path, RATE)
    assert len(pcm) == round(seconds * RATE)
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    assert abs(np.argmax(spectrum) * RATE / len(pcm) - 500) < 3


def test_an_8_bit_wav_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(8000)
        out.writeframes(bytes(800))
    with pytest.raises(ValueError, match="expected 16-bit PCM"):
        chime_bank({"old": path}, RATE)


@pytest.mark.parametrize(
    ("priority", "chime", "expected"),
    [
        (Priority.ALARM, None, "alarm"),  # the class's chime by default
        (Priority.INFO, None, None),  # info has none by default
        (Priority.INFO, True, "ding"),  # asked for: the fallback
        (Priority.ALARM, True, "alarm"),
        (Priority.CRITICAL, False, None),
        (Priority.CHAT, "alert", "alert"),
    ],
)
def test_which_chime_goes_first(
    priority: Priority, chime: bool | str | None, expected: str | None
) -> None:
    bank = chime_bank({}, RATE)
    plan = ChimePlan(bank, {Priority.ALARM: "alarm", Priority.CRITICAL: "alert"})
    got = plan.for_request(SpeakRequest("x", "hi", priority=priority, chime=chime))
    if expected is None:
        assert got is None
    else:
        assert got is bank[expected]
