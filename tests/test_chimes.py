"""Chimes: built-in tones, WAV files converted to the voice's rate, and which chime goes first."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from agent.settings.declarations import BUILTIN_CHIMES
from agent.speech.chimes import BUILTIN, load_sound, render_notes

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
    pcm = load_sound(path, RATE)
    assert len(pcm) == round(seconds * RATE)
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    assert abs(np.argmax(spectrum) * RATE / len(pcm) - 500) < 3


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
    pcm = load_sound(path, RATE)
    assert len(pcm) == RATE
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    assert abs(np.argmax(spectrum) * RATE / len(pcm) - 400) < 3
